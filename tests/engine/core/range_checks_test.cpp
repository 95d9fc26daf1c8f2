// The range rules written once: each reports its problem through the caller's reporter, with the
// value, and a NaN never passes a real-number rule.
#include "engine/core/range_checks.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>

#include "engine/core/rng.h"
#include "tests/test_util.h"

namespace tmx {
namespace {

struct Reported : std::runtime_error {
    using std::runtime_error::runtime_error;
};

std::string problem_of(const std::function<void(const RangeChecks&)>& rule) {
    const RangeChecks check([](const OptionText& name, const std::string& problem) {
        throw Reported(name.spelled() + " | " + problem);
    });
    try {
        rule(check);
    } catch (const Reported& r) {
        return r.what();
    }
    return "";
}

TEST(RangeChecks, EachRuleReportsNameAndValueThroughTheCallersReporter) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("TMX_TEST_SEED=" + std::to_string(seed));
    Rng rng(seed);
    const int64_t v = static_cast<int64_t>(rng.below(1000)) + 1;
    EXPECT_EQ(problem_of([&](const RangeChecks& c) { c.positive(v, "--n"); }), "");
    EXPECT_EQ(problem_of([&](const RangeChecks& c) { c.positive(0, "--n"); }),
              "--n | must be positive, got 0");
    EXPECT_EQ(problem_of([&](const RangeChecks& c) { c.not_negative(0, "n"); }), "");
    EXPECT_EQ(problem_of([&](const RangeChecks& c) { c.not_negative(-v, "n"); }),
              "n | must not be negative, got " + std::to_string(-v));
    const double x = rng.uniform() + 0.5;
    EXPECT_EQ(problem_of([&](const RangeChecks& c) { c.real(x, x > 0, "eps", "> 0"); }), "");
    EXPECT_EQ(problem_of([&](const RangeChecks& c) {
                  c.real(-x, -x > 0, "eps", "> 0");
              }).rfind("eps | must be a finite number > 0, got -", 0),
              0u);
    // NaN fails even when the caller's range test lets it through (written the wrong way round).
    const double nan = std::numeric_limits<double>::quiet_NaN();
    EXPECT_NE(problem_of([&](const RangeChecks& c) { c.real(nan, !(nan <= 0), "eps", "> 0"); }),
              "");
    EXPECT_EQ(problem_of([&](const RangeChecks& c) { c.require(false, "k", "must be even"); }),
              "k | must be even");
}

}  // namespace
}  // namespace tmx

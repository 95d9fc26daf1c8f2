// A fixture for comparing a backend with the CPU backend (the oracle) on the same random inputs:
// the backend under test, chosen by name (a test parameter, or fixed by a derived fixture), and
// the CPU backend; seeded random inputs (the seed is printed on failure; TMX_TEST_SEED=<seed>
// replays it); the upload and download helpers of tensor_io.h; and expect_matches_cpu(), which
// runs an op on both backends and compares every output, and runs it a second time on the
// backend under test to check that it gives the same bits again.
//
// Outputs an op overwrites are poisoned first (NaN: an element the op forgets to write shows up
// as a failure); outputs it accumulates into start from the same random non-zero values on both
// backends (an op that overwrites instead of adding, or adds twice, shows up too).
//
// Tolerances (fp32 on both sides). Results are compared as max|got - cpu| / max(1, max|cpu|):
// relative to the output's scale, absolute for outputs below 1. fp32 has unit roundoff
// u = 2^-24 ~ 6e-8, so elementwise ops (a few correctly or nearly correctly rounded operations,
// exp within a few ulp, FMA contraction or not) differ by ~1e-7 relative; kElementwiseTol allows
// 1e-5. An output that reduces over L terms (a dot product, a column sum over rows, a softmax
// denominator) carries a rounding error that grows with L: about sqrt(L) u on random data, L u
// in the worst case, on each backend, and two backends summing in different orders (blocked
// GEMMs, tree reductions, double accumulators) land anywhere in that range. reduction_tol(L)
// allows max(1e-5, 2e-7 L), ~3 L u: above the sum of both backends' worst cases for a correct
// fp32 summation in any order, and still orders of magnitude below what a wrong index, a
// missed or doubled term, or a wrong scale produces (errors of 1e-3 .. 1 of the output's scale).
// These are the tolerances of tests/backends/ops_test.cpp (the forward ops against a
// double-precision reference); here the oracle is the CPU's fp32, whose own error is within
// the same bounds.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iomanip>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "backends/registry.h"
#include "engine/compute/backend.h"
#include "engine/core/errors.h"
#include "tests/backends/tensor_io.h"
#include "tests/test_util.h"

namespace tmx::test {

constexpr double kElementwiseTol = 1e-5;

inline double reduction_tol(int64_t length) {
    return std::max(1e-5, 2e-7 * static_cast<double>(length));
}

// The backends of this build other than the CPU: what a backend-against-CPU suite is
// instantiated over (it may be empty: see GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST).
inline std::vector<std::string> non_cpu_backend_names() {
    std::vector<std::string> names;
    for (const std::string& n : backend_names())
        if (n != "cpu") names.push_back(n);
    return names;
}

// grouped_matmul's expert offsets [E + 1] for slots sorted by expert, counts[e] each.
inline std::vector<int32_t> expert_offsets(const std::vector<int32_t>& counts) {
    std::vector<int32_t> offsets(counts.size() + 1, 0);
    for (size_t e = 0; e < counts.size(); ++e) offsets[e + 1] = offsets[e] + counts[e];
    return offsets;
}

// A test name from a backend name (gtest allows letters, digits and '_').
inline std::string backend_param_name(const ::testing::TestParamInfo<std::string>& info) {
    std::string s = info.param;
    for (char& c : s)
        if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
    return s;
}

// got (the backend under test) against want (the CPU): max|got - want| / max(floor, max|want|)
// <= tol. The floor is 1 as described at the top of the file; an output whose natural scale is
// far below 1 (optimizer moments, gradients scaled by a small factor) passes a smaller floor, so
// that its errors are measured against its own scale. An all-zero want with floor 0 is compared
// absolutely.
inline ::testing::AssertionResult Close(const std::vector<float>& got,
                                        const std::vector<float>& want, double tol,
                                        double floor = 1.0) {
    if (got.size() != want.size())
        return ::testing::AssertionFailure()
               << "size " << got.size() << " vs the CPU's " << want.size();
    double scale = floor;
    for (size_t i = 0; i < want.size(); ++i) {
        if (!std::isfinite(want[i]))
            return ::testing::AssertionFailure()
                   << "the CPU's element " << i << " is " << want[i] << ": a broken reference";
        scale = std::max(scale, std::abs(static_cast<double>(want[i])));
    }
    if (scale == 0.0) scale = 1.0;
    double worst = 0.0;
    size_t at = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        if (!std::isfinite(got[i]))
            return ::testing::AssertionFailure()
                   << "element " << i << " is " << got[i] << " (the CPU's " << want[i]
                   << "): not written, or overflowed";
        const double err = std::abs(static_cast<double>(got[i]) - want[i]);
        if (err > worst) {
            worst = err;
            at = i;
        }
    }
    const double rel = worst / scale;
    if (rel <= tol) return ::testing::AssertionSuccess();
    std::ostringstream os;
    os << std::setprecision(9) << "relative error " << rel << " > " << tol << "; worst element "
       << at << ": got " << got[at] << ", the CPU's " << want[at] << " (scale " << scale << ")";
    return ::testing::AssertionFailure() << os.str();
}

// The same bits (NaN-safe: compares representations).
inline ::testing::AssertionResult BitwiseEqual(const std::vector<float>& a,
                                               const std::vector<float>& b) {
    if (a.size() != b.size())
        return ::testing::AssertionFailure() << "size " << a.size() << " vs " << b.size();
    for (size_t i = 0; i < a.size(); ++i)
        if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
            size_t differing = 0;
            for (size_t j = i; j < a.size(); ++j)
                differing += std::memcmp(&a[j], &b[j], sizeof(float)) != 0;
            return ::testing::AssertionFailure()
                   << std::setprecision(9) << differing << " of " << a.size()
                   << " elements differ; the first, element " << i << ": " << a[i] << " vs "
                   << b[i];
        }
    return ::testing::AssertionSuccess();
}

// One output of an op, downloaded, with its name (for failure messages) and its tolerance
// against the CPU's (and the floor of its scale: see Close()).
struct Output {
    std::string name;
    std::vector<float> values;
    double tol;
    double floor = 1.0;
};
using Outputs = std::vector<Output>;

class BackendPair : public ::testing::Test {
  protected:
    BackendPair() : seed_(fresh_seed()), rng_(seed_) {}

    // Opens the backend under test and the CPU backend. Skips the test, saying why, when the
    // backend cannot be made on this machine (compiled in, but no device or driver; a failure
    // where TMX_REQUIRE_BACKENDS names it) or, with
    // need_training, when it does not train. Call it from SetUp(); the test body does not run
    // after a skip.
    void open(const std::string& name, bool need_training) {
        name_ = name;
        try {
            backend_ = make_backend(name);
        } catch (const Error& e) {
            TMX_SKIP_UNAVAILABLE(name, e.what());
        }
        if (need_training && !backend_->supports_training()) {
            const std::string why = "backend " + name + " does not train (supports_training())";
            backend_.reset();
            GTEST_SKIP() << why;
        }
        cpu_ = make_backend("cpu");
    }

    // The backend under test, and the oracle.
    Backend& be() { return *backend_; }
    Backend& cpu() { return *cpu_; }
    const std::string& backend_name() const { return name_; }

    std::string trace() const {
        return "backend " + name_ + ", seed " + std::to_string(seed_) +
               " (replay with TMX_TEST_SEED=" + std::to_string(seed_) + ")";
    }

    std::vector<float> normal(int64_t n, double scale = 1.0) {
        return random_normal(rng_, static_cast<size_t>(n), scale);
    }
    std::vector<int32_t> ints(int64_t n, int32_t lo, int32_t hi) {  // [lo, hi)
        return random_ints(rng_, static_cast<size_t>(n), lo, hi);
    }
    // Starting values of an accumulated output: random, of either sign, |v| in [0.25, 1.25), so
    // that no element is 0 (an op that overwrites, or adds nothing, differs from the CPU).
    std::vector<float> accum_init(int64_t n) {
        std::vector<float> v(static_cast<size_t>(n));
        for (float& x : v) {
            const double mag = 0.25 + rng_.uniform();
            x = static_cast<float>(rng_.uniform() < 0.5 ? -mag : mag);
        }
        return v;
    }

    // Runs `op` (which uploads its host inputs to the backend it is given, runs the op there and
    // downloads its outputs) on the CPU and `runs` times on the backend under test: each output
    // within its tolerance of the CPU's, and every run of the backend under test bitwise equal
    // to its first (no float atomics, reductions in a fixed order).
    void expect_matches_cpu(const std::function<Outputs(Backend&)>& op, int runs = 2) {
        const Outputs want = op(cpu());
        const Outputs first = op(be());
        ASSERT_EQ(first.size(), want.size());
        for (size_t i = 0; i < want.size(); ++i) {
            ASSERT_EQ(first[i].name, want[i].name);
            EXPECT_TRUE(Close(first[i].values, want[i].values, want[i].tol, want[i].floor))
                << want[i].name;
        }
        for (int r = 1; r < runs; ++r) {
            const Outputs again = op(be());
            ASSERT_EQ(again.size(), first.size());
            for (size_t i = 0; i < first.size(); ++i)
                EXPECT_TRUE(BitwiseEqual(again[i].values, first[i].values))
                    << first[i].name << ": run " << r + 1 << " of " << backend_name()
                    << " against its first run";
        }
    }

    uint64_t seed_;
    Rng rng_;
    std::string name_;
    std::unique_ptr<Backend> backend_;
    std::unique_ptr<Backend> cpu_;
};

// The backend under test named by the test parameter (instantiate over
// non_cpu_backend_names()). A derived fixture whose ops need training overrides
// needs_training().
class BackendPairTest : public BackendPair, public ::testing::WithParamInterface<std::string> {
  protected:
    void SetUp() override { open(GetParam(), needs_training()); }
    virtual bool needs_training() const { return false; }
};

}  // namespace tmx::test

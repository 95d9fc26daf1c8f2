// metrics.jsonl's numbers (the non-finite ones written as strings) and its SVG rendering, on
// logs written here.
#include "engine/train/metrics_plot.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/core/errors.h"
#include "tests/test_util.h"

namespace tmx {
namespace {

using nlohmann::json;

size_t count_of(const std::string& text, const std::string& what) {
    size_t n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
}

TEST(MetricsPlot, ValuesRoundTripThroughTheirJsonFormAndNonFiniteOnesAreStrings) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("TMX_TEST_SEED=" + std::to_string(seed));
    Rng rng(seed);
    for (int i = 0; i < 200; ++i) {
        const double v = rng.normal() * std::pow(10.0, static_cast<double>(rng.below(40)) - 20);
        const json j = json::parse(metrics_value(v).dump());  // as written, as read back
        ASSERT_TRUE(j.is_number()) << v;
        EXPECT_EQ(read_metrics_value(j, "m:1", "loss"), v);
    }
    const double inf = std::numeric_limits<double>::infinity();
    EXPECT_EQ(metrics_value(std::nan("")), "NaN");
    EXPECT_EQ(metrics_value(inf), "Infinity");
    EXPECT_EQ(metrics_value(-inf), "-Infinity");
    for (const json& v : {json("NaN"), json("Infinity"), json("-Infinity"), json(nullptr)})
        EXPECT_EQ(read_metrics_value(v, "m:1", "loss"), std::nullopt) << v;
    EXPECT_EQ(test::error_of([] { read_metrics_value(json("nan"), "m:3", "grad_norm"); }),
              "m:3: field 'grad_norm': expected a number (or \"NaN\", \"Infinity\", "
              "\"-Infinity\" or null), got \"nan\"");
    EXPECT_NE(test::error_of([] {
                  read_metrics_value(json::array({1, 2}), "m:4", "lr");
              }).find("m:4: field 'lr': expected a number"),
              std::string::npos);
}

// A log as a run writes it: a line per report with the loss, the learning rate and the expert
// load, validation losses on some, one step whose loss was NaN, and a blank line.
TEST(MetricsPlot, TheSvgDrawsEachSeriesMarksNonFiniteStepsAndShowsTheLastExpertLoad) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("TMX_TEST_SEED=" + std::to_string(seed));
    Rng rng(seed);
    const int steps = 5 + static_cast<int>(rng.below(20));
    const int bad = 1 + static_cast<int>(rng.below(static_cast<uint64_t>(steps - 1)));
    std::string log;
    for (int s = 1; s <= steps; ++s) {
        const double share = 0.1 + 0.8 * rng.uniform();
        json line = {{"step", s},
                     {"loss", s == bad ? metrics_value(NAN) : json(4.0 / s)},
                     {"lr", 1e-3 * s},
                     {"expert_load", {{share, 1 - share}, {0.5, 0.5}}}};
        if (s % 2 == 0) line["val_loss"] = 4.5 / s;
        log += line.dump() + "\n";
        if (s == 2) log += "\n";
    }
    const std::string svg = render_metrics_svg(log, "run <a&b>", "metrics.jsonl");
    EXPECT_EQ(svg.rfind("<svg", 0), 0u);
    EXPECT_NE(svg.find("run &lt;a&amp;b&gt;"), std::string::npos) << "the title, escaped";
    // Three series: train and validation loss, the learning rate; each point drawn (< 30).
    EXPECT_EQ(count_of(svg, "<polyline"), 3u);
    EXPECT_EQ(count_of(svg, "<circle"), static_cast<size_t>((steps - 1) + steps / 2 + steps));
    EXPECT_NE(svg.find("non-finite (1)"), std::string::npos);
    EXPECT_NE(svg.find("expert load at step " + std::to_string(steps)), std::string::npos);
    EXPECT_NE(svg.find("layer 1"), std::string::npos);
    EXPECT_EQ(svg.find("layer 2"), std::string::npos);
    EXPECT_NE(svg.find("expert 1"), std::string::npos);
    // A dense model's log has no expert load: no heat map.
    const std::string dense = render_metrics_svg(
        "{\"step\": 1, \"loss\": 3.0, \"lr\": 0.001, \"expert_load\": []}\n", "dense", "m");
    EXPECT_EQ(dense.find("expert load"), std::string::npos);
}

TEST(MetricsPlot, ALineItCannotReadIsAnErrorNamingTheSourceLineAndField) {
    const auto error_for = [](const std::string& log) {
        return test::error_of([&] { render_metrics_svg(log, "t", "run/metrics.jsonl"); });
    };
    EXPECT_EQ(error_for(""), "run/metrics.jsonl: no metrics logged yet");
    EXPECT_EQ(error_for("\n  \n"), "run/metrics.jsonl: no metrics logged yet");
    EXPECT_EQ(error_for("{\"step\": 1}\n[1, 2]\n"), "run/metrics.jsonl:2: not a JSON object");
    EXPECT_EQ(error_for("{\"step\": 1}\n{\"step\": 2, \"loss\": 1.0\n"),
              "run/metrics.jsonl:2: not a JSON object");
    EXPECT_EQ(error_for("{\"loss\": 1.0}\n"),
              "run/metrics.jsonl:1: field 'step': expected an integer >= 0");
    EXPECT_EQ(error_for("{\"step\": -1}\n"),
              "run/metrics.jsonl:1: field 'step': expected an integer >= 0, got -1");
    EXPECT_NE(error_for("{\"step\": 1, \"val_loss\": \"low\"}\n")
                  .find("run/metrics.jsonl:1: field 'val_loss': expected a number"),
              std::string::npos);
    EXPECT_NE(error_for("{\"step\": 1, \"expert_load\": [[0.5, 0.5], [1.0]]}\n")
                  .find("run/metrics.jsonl:1: field 'expert_load': expected an array"),
              std::string::npos);
}

}  // namespace
}  // namespace tmx

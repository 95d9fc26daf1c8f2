// `tmx params` with the data-parallel scaling flags (--ranks, --interconnect, --latency-us,
// --step-time, --tokens-per-step, --peak-tflops, --mfu): the section in the text and the JSON,
// and bad values refused as usage errors naming the flag before the config is read.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace tmx {
namespace {

using nlohmann::json;

std::string tiny_mixtral() {
    return test::source_dir() + "/assets/configs/tiny-mixtral.json";
}

TEST(ParamsScalingCli, PrintsTheSectionOnlyWhenAskedFor) {
    auto r = test::run_tmx("params --config " + tiny_mixtral());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out.find("data-parallel"), std::string::npos) << r.out;

    r = test::run_tmx("params --config " + tiny_mixtral() +
                      " --ranks 2,4,8 --interconnect nvlink,pcie4 --step-time 0.074 "
                      "--tokens-per-step 16384");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::string out = test::flat(r.out);
    for (const char* s :
         {"ESTIMATES from a simple model, not measurements", "172,442,624 parameters",
          "689,770,496 B", "74.00 ms per step, measured (--step-time)",
          "NVLink 4 (H100 SXM): 450 GB/s per-GPU bus bandwidth",
          "PCIe 4.0 x16: 25 GB/s per-GPU bus bandwidth", "3.4 us per ring step",
          "5.7 us per ring step",
          "8 2,048 1.21 GB 2.74 ms 9.25 ms 11.99 ms 6.17x 77.2% 9.25 ms 8.00x 100.0%",
          "Best speed-up for N up to 32 (one 512-token sequence per rank)"})
        EXPECT_NE(out.find(s), std::string::npos) << s << "\n" << r.out;

    // Any scaling flag alone adds the section, with the defaults (2, 4, 8 over NVLink; the
    // step estimated at an assumed peak and MFU).
    r = test::run_tmx("params --config " + tiny_mixtral() + " --mfu 0.1");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(
        test::flat(r.out).find("989 TFLOP/s peak (assumed: H100 SXM dense bf16) x MFU 0.1 (--mfu)"),
        std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find("NVLink 4"), std::string::npos) << r.out;
}

TEST(ParamsScalingCli, JsonHasTheFieldsPerRankCount) {
    auto r = test::run_tmx("params --config " + tiny_mixtral() +
                           " --json --ranks 8,2,4 --interconnect pcie4,40 --latency-us 5");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json j = json::parse(r.out);
    ASSERT_TRUE(j.contains("data_parallel")) << r.out;
    const json& dp = j["data_parallel"];
    EXPECT_EQ(dp["estimate"], true);
    EXPECT_EQ(dp["params"].get<int64_t>(), 172'442'624);
    EXPECT_EQ(dp["gradient_bytes"].get<int64_t>(), 689'770'496);
    EXPECT_EQ(dp["tokens_per_step"].get<int64_t>(), 8 * 512);  // 8 sequences x the context
    EXPECT_EQ(dp["one_gpu"]["measured"], false);
    EXPECT_EQ(dp["one_gpu"]["peak_tflops"].get<double>(), 989);
    ASSERT_EQ(dp["interconnects"].size(), 2u);
    EXPECT_EQ(dp["interconnects"][0]["interconnect"], "pcie4");
    EXPECT_EQ(dp["interconnects"][1]["interconnect"], "custom");
    EXPECT_EQ(dp["interconnects"][1]["bus_bandwidth_gb_per_s"].get<double>(), 40);
    EXPECT_EQ(dp["interconnects"][0]["latency_per_step_us"].get<double>(), 5);
    const json& rows = dp["interconnects"][0]["rows"];
    ASSERT_EQ(rows.size(), 3u);
    const std::vector<int64_t> ranks = {2, 4, 8};
    const std::vector<int64_t> bytes = {689'770'496, 1'034'655'744, 1'207'098'368};
    for (size_t i = 0; i < 3; ++i) {
        EXPECT_EQ(rows[i]["ranks"].get<int64_t>(), ranks[i]);
        EXPECT_EQ(rows[i]["bytes_sent_per_rank"].get<int64_t>(), bytes[i]);
        EXPECT_NEAR(rows[i]["allreduce_s"].get<double>(),
                    static_cast<double>(bytes[i]) / 25e9 + (8.4 + 2.0 * (ranks[i] - 1) * 5) * 1e-6,
                    1e-12);
        for (const char* key :
             {"compute_s", "step_no_overlap_s", "step_overlap_s", "speedup_no_overlap",
              "efficiency_no_overlap", "speedup_overlap", "efficiency_overlap", "tokens_per_rank"})
            EXPECT_TRUE(rows[i].contains(key)) << key;
    }
    // Without a scaling flag there is no such key.
    r = test::run_tmx("params --config " + tiny_mixtral() + " --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_FALSE(json::parse(r.out).contains("data_parallel"));
}

TEST(ParamsScalingCli, BadValuesAreUsageErrorsNamingTheFlag) {
    struct Case {
        std::string flags, expected;
    };
    const std::vector<Case> cases = {
        {"--ranks 0", "tmx: --ranks: expected a comma-separated list of rank counts"},
        {"--ranks ''", "tmx: --ranks: expected a comma-separated list of rank counts"},
        {"--ranks 2,four", "tmx: --ranks: expected a comma-separated list"},
        {"--ranks 2097152", "from 1 to 1,048,576, got '2097152'"},
        {"--interconnect infiniband", "tmx: --interconnect: expected nvlink|pcie4|pcie5|"},
        {"--interconnect 0", "tmx: --interconnect: expected a bus bandwidth in GB/s"},
        {"--interconnect nvlink,nvlink", "tmx: --interconnect: 'nvlink' is given twice"},
        {"--latency-us -1", "tmx: --latency-us: expected microseconds, a number from 0 to"},
        {"--step-time 0", "tmx: --step-time: expected seconds, a number above 0"},
        {"--step-time nan", "tmx: --step-time: expected seconds"},
        {"--step-time 1ms", "got '1ms'"},
        {"--peak-tflops inf", "tmx: --peak-tflops: expected TFLOP/s"},
        {"--mfu 1.5",
         "tmx: --mfu: expected a fraction of the peak, a number above 0 and at most 1"},
        {"--mfu 0", "tmx: --mfu: expected"},
        {"--step-time 0.1 --mfu 0.3", "tmx: --mfu: --step-time gives one GPU's step time"},
        {"--tokens-per-step 0", "tmx: --tokens-per-step: expected an integer from 1 to 2^63 - 1"},
    };
    for (const Case& c : cases) {
        // A missing config shows the flag is checked first.
        const auto r = test::run_tmx("params --config " + tiny_mixtral() + " " + c.flags);
        EXPECT_EQ(r.exit_code, 2) << c.flags << ": " << r.err;
        EXPECT_NE(r.err.find(c.expected), std::string::npos) << c.flags << ": " << r.err;
        EXPECT_EQ(r.out, "") << c.flags;
    }
    const auto r = test::run_tmx("params --config /nonexistent.json --ranks 0");
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find("--ranks"), std::string::npos) << r.err;
}

TEST(ParamsScalingCli, HelpNamesThePresetsAndSaysItIsAnEstimate) {
    const auto r = test::run_tmx("params --help");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    for (const char* s :
         {"--ranks", "--interconnect", "--latency-us", "--step-time", "--tokens-per-step",
          "--peak-tflops", "--mfu", "estimates, not", "nvlink 450 GB/s", "pcie4 25 GB/s",
          "pcie5 50 GB/s", "100gbe 12.5 GB/s", "400gbe 50 GB/s"})
        EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
}

}  // namespace
}  // namespace tmx

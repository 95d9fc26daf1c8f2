// Data-parallel scaling on paper (engine/report/dp_scaling.h): the ring all-reduce's bytes per
// rank against hand computations (and without overflow at the limits), the time at a given
// bandwidth and latency, the step-time estimate from the training FLOPs, the trends as N grows,
// the flag parsers' refusals naming the flag, and the JSON fields.
#include "engine/report/dp_scaling.h"

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "engine/core/errors.h"
#include "engine/core/file_io.h"
#include "engine/report/param_report.h"
#include "tests/test_util.h"

namespace tmx {
namespace {

using nlohmann::json;

ParamReport report_of(const std::string& name, const ReportOptions& opts = {}) {
    const std::string path = test::source_dir() + "/tests/fixtures/hf_configs/" + name;
    return build_param_report(read_json_file(path), path, opts);
}

// The UsageError message of f, or "" when it throws none (or another kind).
template <typename F>
std::string usage_error(F f) {
    try {
        f();
    } catch (const UsageError& e) {
        return e.what();
    }
    return "";
}

// A bandwidth given as a number, with the latency set to `latency_us` per ring step.
ScalingOptions custom(double gb_per_s, double latency_us, std::vector<int64_t> ranks) {
    ScalingOptions o;
    o.ranks = std::move(ranks);
    o.interconnects = {parse_interconnect(std::to_string(gb_per_s), "--interconnect")};
    o.step_latency_us = latency_us;
    return o;
}

TEST(DpScaling, RingAllReduceBytesMatchAHandComputation) {
    // The seed mini-GPT: 131,392 parameters, 525,568 B of fp32 gradients.
    const ParamReport r = report_of("mini-gpt.json");
    ASSERT_EQ(r.total_params, 131'392);
    const int64_t bytes = 4 * 131'392;
    EXPECT_EQ(ring_allreduce_bytes_per_rank(bytes, 1), 0);
    EXPECT_EQ(ring_allreduce_bytes_per_rank(bytes, 2), 525'568);  // 2 x 1/2 x 525,568
    EXPECT_EQ(ring_allreduce_bytes_per_rank(bytes, 4), 788'352);  // 2 x 3/4 x 525,568
    EXPECT_EQ(ring_allreduce_bytes_per_rank(bytes, 8), 919'744);  // 2 x 7/8 x 525,568
    // 2 x 2/3 x 525,568 = 700,757.33: rounded down.
    EXPECT_EQ(ring_allreduce_bytes_per_rank(bytes, 3), 700'757);

    // tiny-mixtral: 172,442,624 parameters, 689,770,496 B; at 8 ranks 7/4 of that.
    const ParamReport tiny = build_param_report(json::object(), "defaults");
    ScalingReport s = build_scaling_report(tiny, {});
    EXPECT_EQ(s.params, 172'442'624);
    EXPECT_EQ(s.gradient_bytes, 689'770'496);
    ASSERT_EQ(s.tables.size(), 1u);
    ASSERT_EQ(s.tables[0].rows.size(), 3u);  // 2, 4, 8
    EXPECT_EQ(s.tables[0].rows[0].bytes_sent_per_rank, 689'770'496);
    EXPECT_EQ(s.tables[0].rows[1].bytes_sent_per_rank, 1'034'655'744);
    EXPECT_EQ(s.tables[0].rows[2].bytes_sent_per_rank, 1'207'098'368);
}

TEST(DpScaling, RingAllReduceBytesDoNotOverflowAtTheLimits) {
    // The largest model (2^48 parameters, 2^50 B of gradients) over the most ranks (2^20):
    // 2 (N-1)/N x 2^50 = 2^51 - 2^31, though 2^51 x (N-1) does not fit in 64 bits.
    const int64_t bytes = int64_t{1} << 50;
    EXPECT_EQ(ring_allreduce_bytes_per_rank(bytes, kMaxRanks),
              (int64_t{1} << 51) - (int64_t{1} << 31));
    EXPECT_EQ(ring_allreduce_bytes_per_rank(bytes, 3), ((int64_t{1} << 51) / 3) * 2 + 1);
    EXPECT_NE(test::error_of([] {
                  ring_allreduce_bytes_per_rank(int64_t{1} << 62, 2);
              }).find("overflows"),
              std::string::npos);
}

TEST(DpScaling, TimeAtAGivenBandwidthAndLatency) {
    const ParamReport r = report_of("mini-gpt.json");
    // 10 GB/s, no latency per ring step (the collective's 8.4 us remain), a measured step of
    // 1 s.
    ScalingOptions o = custom(10, 0, {1, 2, 4});
    o.step_time_s = 1.0;
    ScalingReport s = build_scaling_report(r, o);
    ASSERT_EQ(s.tables.size(), 1u);
    const auto& rows = s.tables[0].rows;
    ASSERT_EQ(rows.size(), 3u);
    EXPECT_TRUE(s.measured);
    EXPECT_EQ(rows[0].allreduce_s, 0);  // one rank: no collective
    EXPECT_DOUBLE_EQ(rows[0].speedup_no_overlap, 1);
    EXPECT_DOUBLE_EQ(rows[1].bandwidth_s, 525'568 / 10e9);
    EXPECT_DOUBLE_EQ(rows[2].bandwidth_s, 788'352 / 10e9);  // 78.8 us
    EXPECT_DOUBLE_EQ(rows[2].latency_s, 8.4e-6);
    const double comm = 788'352 / 10e9 + 8.4e-6;
    EXPECT_DOUBLE_EQ(rows[2].allreduce_s, comm);
    EXPECT_DOUBLE_EQ(rows[2].compute_s, 0.25);
    EXPECT_DOUBLE_EQ(rows[2].step_no_overlap_s, 0.25 + comm);
    EXPECT_DOUBLE_EQ(rows[2].step_overlap_s, 0.25);
    EXPECT_DOUBLE_EQ(rows[2].speedup_overlap, 4);
    EXPECT_DOUBLE_EQ(rows[2].efficiency_overlap, 1);
    EXPECT_DOUBLE_EQ(rows[2].speedup_no_overlap, 1 / (0.25 + comm));
    EXPECT_DOUBLE_EQ(rows[2].efficiency_no_overlap, rows[2].speedup_no_overlap / 4);

    // With 2 us per ring step: 8.4 us + 2 x 3 x 2 us at 4 ranks.
    o = custom(10, 2, {4});
    o.step_time_s = 1.0;
    s = build_scaling_report(r, o);
    EXPECT_NEAR(s.tables[0].rows[0].latency_s, 20.4e-6, 1e-15);
    EXPECT_DOUBLE_EQ(s.tables[0].rows[0].allreduce_s, 788'352 / 10e9 + 20.4e-6);

    // The presets: NVLink 450 GB/s with NCCL's 3.4 us per step, PCIe 4.0 25 GB/s with 5.7.
    o = {};
    o.ranks = {8};
    o.step_time_s = 1.0;
    o.interconnects = parse_interconnect_list("nvlink, pcie4", "--interconnect");
    s = build_scaling_report(r, o);
    ASSERT_EQ(s.tables.size(), 2u);
    EXPECT_DOUBLE_EQ(s.tables[0].rows[0].allreduce_s, 919'744 / 450e9 + (8.4 + 14 * 3.4) * 1e-6);
    EXPECT_DOUBLE_EQ(s.tables[1].rows[0].allreduce_s, 919'744 / 25e9 + (8.4 + 14 * 5.7) * 1e-6);
    EXPECT_EQ(s.tables[1].interconnect.key, "pcie4");
}

TEST(DpScaling, StepTimeEstimateFromTheTrainingFlops) {
    const ParamReport r = report_of("mixtral-8x7b.json", {.seq = 4096});
    ScalingReport s = build_scaling_report(r, {});
    EXPECT_FALSE(s.measured);
    EXPECT_EQ(s.seq, 4096);
    EXPECT_EQ(s.tokens_per_step, 8 * 4096);  // tmx train's default batch of 8 sequences
    EXPECT_DOUBLE_EQ(s.flops_per_step, 8 * 4096 * r.training_flops);
    EXPECT_DOUBLE_EQ(s.one_gpu_step_s, 8 * 4096 * r.training_flops / (989e12 * 0.4));

    ScalingOptions o;
    o.tokens_per_step = 1'000'000;
    o.peak_tflops = 100;
    o.mfu = 0.5;
    s = build_scaling_report(r, o);
    EXPECT_EQ(s.tokens_per_step, 1'000'000);
    EXPECT_EQ(s.tokens_origin, "tokens_per_step");
    o.spelling = [](std::string_view field) { return "<" + std::string(field) + ">"; };
    EXPECT_EQ(build_scaling_report(r, o).tokens_origin, "<tokens_per_step>");
    EXPECT_DOUBLE_EQ(s.one_gpu_step_s, 1e6 * r.training_flops / 50e12);

    // The report's batch sets the default global batch.
    const ParamReport b = report_of("mixtral-8x7b.json", {.batch = 3, .seq = 100});
    s = build_scaling_report(b, {});
    EXPECT_EQ(s.tokens_per_step, 300);
    EXPECT_EQ(s.tokens_origin, "batch 3 x 100 (seq)");
}

TEST(DpScaling, MoreRanksMeanLessComputeAndBytesApproachTwiceTheGradients) {
    const ParamReport r = build_param_report(json::object(), "defaults");  // tiny-mixtral
    ScalingOptions o;
    o.ranks = {1, 2, 3, 4, 8, 16, 64, 256, 4096, kMaxRanks};
    o.interconnects = parse_interconnect_list("nvlink,pcie4,100gbe", "--interconnect");
    o.tokens_per_step = 1 << 20;
    const ScalingReport s = build_scaling_report(r, o);
    const double twice = 2.0 * static_cast<double>(s.gradient_bytes);
    for (const ScalingTable& t : s.tables) {
        SCOPED_TRACE(t.interconnect.key);
        for (size_t i = 1; i < t.rows.size(); ++i) {
            const ScalingRow &a = t.rows[i - 1], &b = t.rows[i];
            EXPECT_LT(b.compute_s, a.compute_s);
            EXPECT_LT(b.tokens_per_rank, a.tokens_per_rank);
            EXPECT_GT(b.bytes_sent_per_rank, a.bytes_sent_per_rank);
            EXPECT_LT(static_cast<double>(b.bytes_sent_per_rank), twice);
            EXPECT_GT(b.allreduce_s, a.allreduce_s);
            EXPECT_LE(b.efficiency_no_overlap, a.efficiency_no_overlap);
            EXPECT_LE(b.efficiency_overlap, a.efficiency_overlap);
            EXPECT_LE(b.efficiency_no_overlap, b.efficiency_overlap);
            EXPECT_LE(b.speedup_no_overlap, b.speedup_overlap);
            EXPECT_LE(b.speedup_overlap, static_cast<double>(b.ranks) * (1 + 1e-12));
        }
        // 2 (N-1)/N x 4P at 2^20 ranks is within 1e-6 of 2 x 4P.
        const ScalingRow& last = t.rows.back();
        EXPECT_NEAR(static_cast<double>(last.bytes_sent_per_rank) / twice, 1.0, 1e-6);
        // The communication-bound point: the all-reduce reaches a rank's compute there, not
        // one rank before.
        ASSERT_GT(t.comm_bound_from, 1);
        ScalingOptions at = o;
        at.interconnects = {t.interconnect};
        at.ranks = {t.comm_bound_from - 1, t.comm_bound_from};
        const ScalingReport c = build_scaling_report(r, at);
        EXPECT_LT(c.tables[0].rows[0].allreduce_s, c.tables[0].rows[0].compute_s);
        EXPECT_GE(c.tables[0].rows[1].allreduce_s, c.tables[0].rows[1].compute_s);
        EXPECT_LE(c.tables[0].rows[1].efficiency_no_overlap, 0.5);
        // The best speed-ups are the best over every N, the rows' included; at the best N the
        // step is shortest.
        EXPECT_EQ(t.best_searched_up_to, (1 << 20) / 512);  // one sequence per rank
        for (const ScalingRow& row : t.rows) {
            if (row.ranks > t.best_searched_up_to) continue;
            EXPECT_LE(row.speedup_no_overlap, t.best_no_overlap_speedup);
            EXPECT_LE(row.speedup_overlap, t.best_overlap_speedup);
        }
        ASSERT_GT(t.best_no_overlap_ranks, 1);
        ASSERT_LT(t.best_no_overlap_ranks, t.best_searched_up_to);
        at.ranks = {t.best_no_overlap_ranks - 1, t.best_no_overlap_ranks,
                    t.best_no_overlap_ranks + 1};
        const ScalingReport b = build_scaling_report(r, at);
        EXPECT_DOUBLE_EQ(b.tables[0].rows[1].speedup_no_overlap, t.best_no_overlap_speedup);
        EXPECT_LT(b.tables[0].rows[0].speedup_no_overlap, t.best_no_overlap_speedup);
        EXPECT_LE(b.tables[0].rows[2].speedup_no_overlap, t.best_no_overlap_speedup);
        // With perfect overlap the best N is where the all-reduce catches up with the compute.
        EXPECT_GE(t.best_overlap_ranks, t.comm_bound_from - 1);
        EXPECT_LE(t.best_overlap_ranks, t.comm_bound_from);
        EXPECT_DOUBLE_EQ(t.allreduce_limit_s, 2.0 * static_cast<double>(s.gradient_bytes) /
                                                  (t.interconnect.bus_gb_per_s * 1e9));
    }
    // A faster interconnect scales further.
    EXPECT_GT(s.tables[0].comm_bound_from, s.tables[1].comm_bound_from);
    EXPECT_GT(s.tables[1].comm_bound_from, s.tables[2].comm_bound_from);
}

TEST(DpScaling, WholeSequencesPerRank) {
    const ParamReport r = report_of("mini-gpt.json", {.batch = 6, .seq = 32});
    ScalingOptions o;
    o.ranks = {2, 3, 4};
    const ScalingReport s = build_scaling_report(r, o);
    EXPECT_TRUE(s.tables[0].rows[0].whole_sequences);   // 3 sequences each
    EXPECT_TRUE(s.tables[0].rows[1].whole_sequences);   // 2 each
    EXPECT_FALSE(s.tables[0].rows[2].whole_sequences);  // 1.5 each
    EXPECT_DOUBLE_EQ(s.tables[0].rows[2].tokens_per_rank, 48);
}

TEST(DpScaling, FlagParsersRefuseBadValuesNamingTheFlag) {
    EXPECT_EQ(parse_rank_list("8, 2,4,2", "--ranks"), (std::vector<int64_t>{2, 4, 8}));
    EXPECT_EQ(parse_rank_list("1048576", "--ranks"), (std::vector<int64_t>{kMaxRanks}));
    for (const char* bad :
         {"", "0", "-2", "2,,4", "2,x", "1048577", "99999999999999999999", "2.5", "0x10"}) {
        const std::string e = usage_error([&] { parse_rank_list(bad, "--ranks"); });
        EXPECT_EQ(e.rfind("--ranks: expected a comma-separated list of rank counts, integers from "
                          "1 to 1,048,576, got '",
                          0),
                  0u)
            << bad << " -> " << e;
    }

    EXPECT_EQ(parse_interconnect("pcie5", "--interconnect").bus_gb_per_s, 50);
    EXPECT_EQ(parse_interconnect("100gbe", "--interconnect").bus_gb_per_s, 12.5);
    EXPECT_EQ(parse_interconnect("400gbe", "--interconnect").bus_gb_per_s, 50);
    const Interconnect c = parse_interconnect("37.5", "--interconnect");
    EXPECT_EQ(c.key, "custom");
    EXPECT_EQ(c.bus_gb_per_s, 37.5);
    for (const char* bad : {"", "fast", "NVLink", "0", "-5", "nan", "inf", "1e400", "1e7"}) {
        const std::string e = usage_error([&] { parse_interconnect(bad, "--interconnect"); });
        EXPECT_EQ(e.rfind("--interconnect: expected ", 0), 0u) << bad << " -> " << e;
        EXPECT_NE(e.find(std::string("got '") + bad + "'"), std::string::npos) << e;
    }
    EXPECT_NE(usage_error([] {
                  parse_interconnect_list("nvlink,pcie4,nvlink", "--interconnect");
              }).find("--interconnect: 'nvlink' is given twice"),
              std::string::npos);

    EXPECT_EQ(parse_number("0.074", "--step-time", "seconds", 0, true, 1e6), 0.074);
    EXPECT_EQ(parse_number("1e-3", "--step-time", "seconds", 0, true, 1e6), 1e-3);
    EXPECT_EQ(parse_number("0", "--latency-us", "microseconds", 0, false, 1e6), 0);
    for (const char* bad : {"0", "-1", "nan", "inf", "1s", "", "1e999", "2e6", "0x1p3"}) {
        const std::string e =
            usage_error([&] { parse_number(bad, "--step-time", "seconds", 0, true, 1e6); });
        EXPECT_EQ(e, std::string("--step-time: expected seconds, a number above 0 and at most "
                                 "1,000,000, got '") +
                         bad + "'")
            << bad;
    }
}

TEST(DpScaling, StepTimeAndTheEstimateFlagsExcludeEachOther) {
    const ParamReport r = report_of("mini-gpt.json");
    ScalingOptions o;
    o.step_time_s = 0.1;
    o.mfu_given = true;
    EXPECT_NE(usage_error([&] {
                  build_scaling_report(r, o);
              }).find("mfu: step_time_s gives one GPU's step time"),
              std::string::npos);
    o.peak_given = true;
    EXPECT_EQ(usage_error([&] { build_scaling_report(r, o); }).rfind("peak_tflops: ", 0), 0u);
}

TEST(DpScaling, TextAndJsonSayTheyAreEstimates) {
    const ParamReport r = build_param_report(json::object(), "defaults");
    ScalingOptions o;
    o.interconnects = parse_interconnect_list("nvlink,pcie4", "--interconnect");
    const ScalingReport s = build_scaling_report(r, o);
    const std::string text = test::flat(format_scaling_report(s));
    EXPECT_NE(text.find("ESTIMATES"), std::string::npos) << text;
    EXPECT_NE(text.find("not measurements"), std::string::npos) << text;
    EXPECT_NE(text.find("450 GB/s per-GPU bus bandwidth"), std::string::npos) << text;
    EXPECT_NE(text.find("25 GB/s per-GPU bus bandwidth"), std::string::npos) << text;
    EXPECT_NE(text.find("MFU 0.4 (assumed)"), std::string::npos) << text;

    const json j = scaling_report_json(s);
    EXPECT_EQ(j["estimate"], true);
    EXPECT_EQ(j["params"].get<int64_t>(), 172'442'624);
    EXPECT_EQ(j["gradient_bytes"].get<int64_t>(), 689'770'496);
    EXPECT_EQ(j["one_gpu"]["mfu"].get<double>(), 0.4);
    EXPECT_EQ(j["one_gpu"]["measured"], false);
    ASSERT_EQ(j["interconnects"].size(), 2u);
    const json& nv = j["interconnects"][0];
    EXPECT_EQ(nv["interconnect"], "nvlink");
    EXPECT_EQ(nv["bus_bandwidth_gb_per_s"].get<double>(), 450);
    EXPECT_EQ(nv["latency_per_step_us"].get<double>(), 3.4);
    ASSERT_EQ(nv["rows"].size(), 3u);
    for (const char* key :
         {"ranks", "tokens_per_rank", "bytes_sent_per_rank", "bytes_received_per_rank",
          "allreduce_bandwidth_s", "allreduce_latency_s", "allreduce_s", "compute_s",
          "step_no_overlap_s", "speedup_no_overlap", "efficiency_no_overlap", "step_overlap_s",
          "speedup_overlap", "efficiency_overlap"})
        EXPECT_TRUE(nv["rows"][0].contains(key)) << key;
    EXPECT_EQ(nv["rows"][2]["bytes_sent_per_rank"].get<int64_t>(), 1'207'098'368);
    EXPECT_TRUE(nv.contains("comm_bound_from_ranks"));
    EXPECT_TRUE(nv["best_no_overlap"].contains("ranks"));
    EXPECT_TRUE(nv["best_overlap"].contains("speedup"));
    EXPECT_TRUE(nv.contains("allreduce_bandwidth_limit_s"));
}

}  // namespace
}  // namespace tmx

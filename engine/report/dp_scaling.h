// Data-parallel scaling on paper (`tmx params --ranks 2,4,8 --interconnect nvlink,pcie4`): for
// N ranks each holding the whole model, what the per-step gradient all-reduce costs on an
// interconnect and what that leaves of the speed-up, at a fixed global batch.
//
// The model (every figure it gives is an estimate, not a measurement):
//   * every optimizer step sums the fp32 gradients of all P parameters over the N ranks (every
//     expert included: each rank holds every expert), one ring all-reduce of 4P bytes in which
//     each rank sends 2 (N-1)/N x 4P bytes and receives as many;
//     with --shard-optimizer (ZeRO-1) tmx does a reduce-scatter of the gradients and an
//     all-gather of the fp32 weights instead: the same bytes on the wire;
//   * its time = latency + bytes sent per rank / the interconnect's per-GPU bus bandwidth (per
//     direction; the NCCL-tests "busbw" convention, in which a ring all-reduce of S bytes takes
//     2 (N-1)/N x S / busbw), latency = base + 2 (N-1) x per-step latency (NCCL's ring cost
//     model);
//   * compute: the global batch is fixed and each rank does 1/N of its tokens, so compute per
//     step = (one GPU's step time) / N; one GPU's step time is measured (--step-time) or
//     estimated as tokens x training FLOPs per token / (peak x MFU);
//   * speed-up over one GPU and efficiency (speed-up / N), without overlap (compute + all-reduce)
//     and with perfect overlap (the larger of the two).
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/report/param_report.h"

namespace tmx {

// An interconnect as the model sees it.
struct Interconnect {
    std::string key;               // "nvlink", "pcie4", "pcie5", "100gbe", "400gbe" or "custom"
    std::string name;              // "NVLink 4 (H100 SXM)"
    double bus_gb_per_s = 0;       // per-GPU bus bandwidth, per direction, GB/s (1 GB = 1e9 B)
    std::string bandwidth_source;  // where the figure comes from
    double step_latency_us = 0;    // latency of one ring step
    std::string latency_source;
};

// Latency of one collective before its ring steps (NCCL's ring/Simple base latency).
inline constexpr double kCollectiveBaseLatencyUs = 8.4;
// Limits of the flags.
inline constexpr int64_t kMaxRanks = int64_t{1} << 20;  // 1,048,576

// The presets, in --help order.
const std::vector<Interconnect>& interconnect_presets();

// "nvlink", ..., or a bandwidth in GB/s ("200", "37.5"): the interconnect; a UsageError naming
// `flag` otherwise.
Interconnect parse_interconnect(const std::string& text, const std::string& flag);
// A comma-separated list of the above (spaces allowed), each at most once.
std::vector<Interconnect> parse_interconnect_list(const std::string& text, const std::string& flag);
// "2,4,8" (spaces allowed): rank counts from 1 to kMaxRanks, returned sorted without repeats; a
// UsageError naming `flag` otherwise.
std::vector<int64_t> parse_rank_list(const std::string& text, const std::string& flag);
// A finite decimal number from `min` to `max` (min excluded when `min_exclusive`); a UsageError
// naming `flag` and saying `what` was expected otherwise. Refuses "nan", "inf", trailing text.
double parse_number(const std::string& text, const std::string& flag, const std::string& what,
                    double min, bool min_exclusive, double max);

struct ScalingOptions {
    std::vector<int64_t> ranks = {2, 4, 8};
    std::vector<Interconnect> interconnects;  // empty: NVLink
    std::optional<double> step_latency_us;    // overrides every interconnect's per-step latency
    std::optional<double> step_time_s;        // one GPU's measured step; empty: the estimate
    int64_t tokens_per_step = 0;              // global tokens per optimizer step; 0: the default
    double peak_tflops = 989;                 // H100 SXM dense bf16
    double mfu = 0.4;
    bool peak_given = false, mfu_given = false;  // for the text: "assumed" or the option
    // How the text and the JSON spell the options they name (tmx params passes its flags);
    // empty: by field.
    OptionSpelling spelling;
};

// One rank count on one interconnect.
struct ScalingRow {
    int64_t ranks = 0;
    double tokens_per_rank = 0;
    bool whole_sequences = true;      // each rank gets a whole number of sequences
    int64_t bytes_sent_per_rank = 0;  // floor(2 (N-1)/N x 4P); as many received
    double bandwidth_s = 0;           // bytes / bus bandwidth
    double latency_s = 0;             // base + 2 (N-1) x per-step latency (0 at N = 1)
    double allreduce_s = 0;           // bandwidth_s + latency_s
    double compute_s = 0;             // one GPU's step / N
    double step_no_overlap_s = 0;     // compute + all-reduce
    double step_overlap_s = 0;        // max(compute, all-reduce)
    double speedup_no_overlap = 0, efficiency_no_overlap = 0;
    double speedup_overlap = 0, efficiency_overlap = 0;
};

struct ScalingTable {
    Interconnect interconnect;
    std::vector<ScalingRow> rows;
    // The smallest N from which the all-reduce takes at least as long as a rank's compute
    // (efficiency without overlap <= 50%; perfect overlap no longer hides it); 0 when none up to
    // kMaxRanks.
    int64_t comm_bound_from = 0;
    // The best speed-up over every N from 1 to best_searched_up_to (the batch's sequences: a
    // rank computes one sequence at least; at most kMaxRanks), and the smallest N that gives it.
    int64_t best_searched_up_to = 1;
    int64_t best_no_overlap_ranks = 1, best_overlap_ranks = 1;
    double best_no_overlap_speedup = 1, best_overlap_speedup = 1;
    // What the all-reduce's bandwidth term tends to as N grows: 2 x 4P / bandwidth.
    double allreduce_limit_s = 0;
};

struct ScalingReport {
    int64_t params = 0;          // P: every parameter, every expert
    int64_t gradient_bytes = 0;  // 4P
    int64_t tokens_per_step = 0;
    std::string tokens_origin;  // where it came from (batch 8 x seq 512), spelt by options.spelling
    int64_t seq = 0;            // tokens per sequence (the report's FLOPs context)
    double training_flops_per_token = 0;
    double flops_per_step = 0;
    bool measured = false;  // one GPU's step time from options.step_time_s
    double one_gpu_step_s = 0;
    ScalingOptions options;
    std::vector<ScalingTable> tables;
};

// The default global batch when neither tokens_per_step nor the report's batch is given: tmx
// train's default batch_size.
inline constexpr int64_t kDefaultBatchSequences = 8;

// One ring all-reduce of `bytes` over `ranks`: the bytes each rank sends (and receives),
// floor(2 (N-1)/N x bytes), computed without overflow. 0 for one rank.
int64_t ring_allreduce_bytes_per_rank(int64_t bytes, int64_t ranks);

// The scaling figures for the model of `r` (its total parameters, training FLOPs per token at its
// seq, and its batch for the default tokens per step). UsageError naming the option for values
// that give no finite figure.
ScalingReport build_scaling_report(const ParamReport& r, const ScalingOptions& o);

std::string format_scaling_report(const ScalingReport& s);
nlohmann::json scaling_report_json(const ScalingReport& s);

}  // namespace tmx

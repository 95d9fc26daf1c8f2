// Data-parallel scaling on paper: the figures (build_scaling_report) and their text and JSON.
// The model and its conventions are in dp_scaling.h.
#include "engine/report/dp_scaling.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "engine/core/checked_math.h"
#include "engine/core/errors.h"
#include "engine/core/format.h"
#include "engine/report/report_util.h"

namespace tmx {

using namespace report_detail;

namespace {

using nlohmann::json;

// Where the per-step latencies come from: NCCL's hwLat table for the ring algorithm and the
// Simple protocol (src/graph/tuning.cc), whose base latency is kCollectiveBaseLatencyUs.
constexpr const char* kNcclLatency = "NCCL's ring cost model";

std::string trim(const std::string& s) {
    const size_t a = s.find_first_not_of(" \t");
    if (a == std::string::npos) return "";
    const size_t b = s.find_last_not_of(" \t");
    return s.substr(a, b - a + 1);
}

std::vector<std::string> split_commas(const std::string& text) {
    std::vector<std::string> parts;
    std::string cur;
    for (char c : text) {
        if (c == ',') {
            parts.push_back(trim(cur));
            cur.clear();
        } else {
            cur.push_back(c);
        }
    }
    parts.push_back(trim(cur));
    return parts;
}

// A number as the text writes it: up to 4 significant digits, no exponent below 1e15.
std::string fmt_real(double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.4g", v);
    return buf;
}

// Seconds in a readable unit: "31.7 us", "1.54 ms", "2.10 s".
std::string fmt_time(double s) {
    char buf[64];
    if (s == 0) return "0";
    if (s < 1e-3)
        std::snprintf(buf, sizeof buf, "%.1f us", s * 1e6);
    else if (s < 1)
        std::snprintf(buf, sizeof buf, "%.2f ms", s * 1e3);
    else if (s < 1e5)
        std::snprintf(buf, sizeof buf, "%.2f s", s);
    else
        std::snprintf(buf, sizeof buf, "%.3g s", s);
    return buf;
}

std::string fmt_speedup(double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, v < 1e5 ? "%.2fx" : "%.3gx", v);
    return buf;
}

std::string fmt_percent(double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.1f%%", 100 * v);
    return buf;
}

// A flag's bound: "0", "1", "1,000,000".
std::string fmt_bound(double v) {
    if (v == std::floor(v) && std::fabs(v) < 1e15) return with_thousands(static_cast<int64_t>(v));
    return fmt_real(v);
}

// A count that may not be whole: "2,048", "1,365.33".
std::string fmt_count(double v) {
    if (v >= 1e15) return fmt_real(v);
    const int64_t cents = std::llround(v * 100);
    if (cents % 100 == 0) return with_thousands(cents / 100);
    char buf[8];
    std::snprintf(buf, sizeof buf, ".%02d", static_cast<int>(cents % 100));
    return with_thousands(cents / 100) + buf;
}

// `text` as lines of at most kWidth columns (a longer word overflows), the first line indented by
// `first`, the others by `rest`.
// nb() marks spaces that wrap() must not break at.
constexpr size_t kWidth = 100;
constexpr char kNoBreak = '\x1f';
std::string nb(std::string s) {
    std::replace(s.begin(), s.end(), ' ', kNoBreak);
    return s;
}
std::string wrap(const std::string& text, const std::string& first = "  ",
                 const std::string& rest = "  ") {
    // The words, a unit joined to its number ("450 GB/s", "8.4 us", "689,770,496 B").
    std::vector<std::string> words;
    std::istringstream in(text);
    for (std::string w; in >> w;) {
        const std::string unit = w.substr(0, w.find_first_of(",;.)"));
        const bool is_unit = unit == "B" || unit == "MB" || unit == "GB" || unit == "GB/s" ||
                             unit == "TFLOP/s" || unit == "us" || unit == "ms" || unit == "s";
        if (is_unit && !words.empty() &&
            std::isdigit(static_cast<unsigned char>(words.back().back())))
            words.back() += kNoBreak + w;
        else
            words.push_back(w);
    }
    std::string out, line = first;
    bool empty = true;
    for (const std::string& w : words) {
        if (!empty && line.size() + 1 + w.size() > kWidth) {
            out += line + "\n";
            line = rest;
            empty = true;
        }
        line += (empty ? "" : " ") + w;
        empty = false;
    }
    out += line + "\n";
    std::replace(out.begin(), out.end(), kNoBreak, ' ');
    return out;
}

std::string fmt_gbps(double gb) {
    return fmt_real(gb) + " GB/s";
}

// The time of one ring all-reduce of the row's bytes on `ic`.
void fill_allreduce(ScalingRow& row, int64_t gradient_bytes, const Interconnect& ic) {
    row.bytes_sent_per_rank = ring_allreduce_bytes_per_rank(gradient_bytes, row.ranks);
    row.bandwidth_s = static_cast<double>(row.bytes_sent_per_rank) / (ic.bus_gb_per_s * 1e9);
    row.latency_s = row.ranks > 1
                        ? (kCollectiveBaseLatencyUs +
                           2.0 * static_cast<double>(row.ranks - 1) * ic.step_latency_us) *
                              1e-6
                        : 0.0;
    row.allreduce_s = row.bandwidth_s + row.latency_s;
}

ScalingRow scaling_row(const ScalingReport& s, const Interconnect& ic, int64_t n) {
    ScalingRow row;
    row.ranks = n;
    const double N = static_cast<double>(n);
    row.tokens_per_rank = static_cast<double>(s.tokens_per_step) / N;
    // Each rank needs whole sequences of `seq` tokens (the sum can't overflow: n <= 2^20).
    row.whole_sequences = s.tokens_per_step % s.seq == 0 && (s.tokens_per_step / s.seq) % n == 0;
    fill_allreduce(row, s.gradient_bytes, ic);
    row.compute_s = s.one_gpu_step_s / N;
    row.step_no_overlap_s = row.compute_s + row.allreduce_s;
    row.step_overlap_s = std::max(row.compute_s, row.allreduce_s);
    row.speedup_no_overlap = s.one_gpu_step_s / row.step_no_overlap_s;
    row.speedup_overlap = s.one_gpu_step_s / row.step_overlap_s;
    row.efficiency_no_overlap = row.speedup_no_overlap / N;
    row.efficiency_overlap = row.speedup_overlap / N;
    return row;
}

// The smallest N >= 2 whose all-reduce takes at least a rank's compute; 0 when none up to
// kMaxRanks. compute / N falls and the all-reduce time rises with N, so the first crossing is
// found by bisection.
int64_t comm_bound_from(const ScalingReport& s, const Interconnect& ic) {
    auto bound = [&](int64_t n) {
        ScalingRow row;
        row.ranks = n;
        fill_allreduce(row, s.gradient_bytes, ic);
        return row.allreduce_s >= s.one_gpu_step_s / static_cast<double>(n);
    };
    if (!bound(kMaxRanks)) return 0;
    int64_t lo = 1, hi = kMaxRanks;  // bound(lo) false (no all-reduce at N = 1), bound(hi) true
    while (hi - lo > 1) {
        const int64_t mid = lo + (hi - lo) / 2;
        (bound(mid) ? hi : lo) = mid;
    }
    return hi;
}

}  // namespace

// ------------------------------------------------------------------------------------------
// Flags

const std::vector<Interconnect>& interconnect_presets() {
    static const std::vector<Interconnect> presets = {
        {"nvlink", "NVLink 4 (H100 SXM)", 450,
         "per direction: 18 NVLink 4 links x 25 GB/s, 900 GB/s counting both directions, "
         "NVIDIA's H100 SXM datasheet; nominal, NCCL achieves less",
         3.4, std::string(kNcclLatency) + ", NVLink"},
        {"pcie4", "PCIe 4.0 x16", 25,
         "per direction: ~25 GB/s achieved GPU to GPU of the link's nominal 31.5 GB/s", 5.7,
         std::string(kNcclLatency) + ", PCIe"},
        {"pcie5", "PCIe 5.0 x16", 50,
         "per direction: ~50 GB/s achieved GPU to GPU of the link's nominal 63 GB/s", 5.7,
         std::string(kNcclLatency) + ", PCIe"},
        {"100gbe", "100 Gb/s network (100GbE, InfiniBand EDR)", 12.5,
         "per direction: the line rate, one NIC per GPU, protocol overhead not deducted", 9.6,
         std::string(kNcclLatency) + ", network"},
        {"400gbe", "400 Gb/s network (400GbE, InfiniBand NDR)", 50,
         "per direction: the line rate, one NIC per GPU, protocol overhead not deducted", 9.6,
         std::string(kNcclLatency) + ", network"},
    };
    return presets;
}

double parse_number(const std::string& text, const std::string& flag, const std::string& what,
                    double min, bool min_exclusive, double max) {
    const std::string t = trim(text);
    auto refuse = [&]() -> double {
        throw UsageError(flag + ": expected " + what + ", a number " +
                         (min_exclusive ? "above " : "from ") + fmt_bound(min) +
                         (min_exclusive ? " and at most " : " to ") + fmt_bound(max) + ", got '" +
                         text + "'");
    };
    // Digits, one point, an exponent: no "nan", "inf", hex floats or signs other than '-'.
    if (t.empty() || t.find_first_not_of("0123456789.eE+-") != std::string::npos) return refuse();
    errno = 0;
    char* end = nullptr;
    const double v = std::strtod(t.c_str(), &end);
    if (end != t.c_str() + t.size() || errno == ERANGE || !std::isfinite(v)) return refuse();
    if (v < min || (min_exclusive && v == min) || v > max) return refuse();
    return v;
}

Interconnect parse_interconnect(const std::string& text, const std::string& flag) {
    const std::string t = trim(text);
    for (const Interconnect& p : interconnect_presets())
        if (t == p.key) return p;
    std::string keys;
    for (const Interconnect& p : interconnect_presets()) keys += p.key + "|";
    if (t.empty() || t.find_first_not_of("0123456789.eE+-") != std::string::npos)
        throw UsageError(flag + ": expected " + keys + "GBPS (a per-GPU bus bandwidth in GB/s), " +
                         "got '" + text + "'");
    Interconnect ic;
    ic.key = "custom";
    ic.bus_gb_per_s = parse_number(t, flag, "a bus bandwidth in GB/s", 0, true, 1e6);
    ic.name = "Given interconnect";
    ic.bandwidth_source = "per direction, as given: " + flag + " " + t;
    ic.step_latency_us = 9.6;
    ic.latency_source = std::string(kNcclLatency) + ", network: its largest figure";
    return ic;
}

std::vector<Interconnect> parse_interconnect_list(const std::string& text,
                                                  const std::string& flag) {
    std::vector<Interconnect> out;
    for (const std::string& part : split_commas(text)) {
        Interconnect ic = parse_interconnect(part, flag);
        for (const Interconnect& seen : out)
            if (seen.name == ic.name && seen.bus_gb_per_s == ic.bus_gb_per_s)
                throw UsageError(flag + ": '" + part + "' is given twice");
        out.push_back(ic);
    }
    return out;
}

std::vector<int64_t> parse_rank_list(const std::string& text, const std::string& flag) {
    std::vector<int64_t> ranks;
    for (const std::string& part : split_commas(text)) {
        const bool digits = !part.empty() && part.size() <= 9 &&
                            part.find_first_not_of("0123456789") == std::string::npos;
        const int64_t n = digits ? std::stoll(part) : 0;
        if (n < 1 || n > kMaxRanks)
            throw UsageError(flag + ": expected a comma-separated list of rank counts, integers " +
                             "from 1 to " + with_thousands(kMaxRanks) + ", got '" + part + "'" +
                             (part == text ? "" : " in '" + text + "'"));
        ranks.push_back(n);
    }
    std::sort(ranks.begin(), ranks.end());
    ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
    return ranks;
}

// ------------------------------------------------------------------------------------------
// Figures

int64_t ring_allreduce_bytes_per_rank(int64_t bytes, int64_t ranks) {
    if (ranks < 1 || bytes < 0) throw Error("ring all-reduce: bad size or rank count");
    // 2 (N-1)/N x bytes = q (N-1) + r (N-1) / N with 2 x bytes = q N + r: no product exceeds
    // 2 x bytes or N^2. (Checked without checked_mul's context string: scaling_row calls this
    // for every N up to kMaxRanks.)
    int64_t twice = 0, whole = 0, part = 0, sum = 0;
    if (__builtin_mul_overflow(bytes, int64_t{2}, &twice))
        throw_int64_overflow("the all-reduce bytes");
    const int64_t q = twice / ranks, r = twice % ranks;
    if (__builtin_mul_overflow(q, ranks - 1, &whole) ||
        __builtin_mul_overflow(r, ranks - 1, &part) ||
        __builtin_add_overflow(whole, part / ranks, &sum))
        throw_int64_overflow("the all-reduce bytes");
    return sum;
}

ScalingReport build_scaling_report(const ParamReport& r, const ScalingOptions& o) {
    ScalingReport s;
    s.options = o;
    if (s.options.interconnects.empty()) s.options.interconnects = {interconnect_presets()[0]};
    const OptionSpelling& spell = o.spelling;
    if (s.options.ranks.empty()) throw UsageError(opt("ranks") + ": no rank counts given");
    for (int64_t n : s.options.ranks)
        if (n < 1 || n > kMaxRanks)
            throw UsageError(opt("ranks") + ": " + std::to_string(n) + " is not from 1 to " +
                             with_thousands(kMaxRanks));
    if (s.options.step_latency_us)
        for (Interconnect& ic : s.options.interconnects) {
            ic.step_latency_us = *s.options.step_latency_us;
            ic.latency_source = ("given as " + opt("step_latency_us")).spelled(spell);
        }
    if (o.step_time_s && (o.peak_given || o.mfu_given))
        throw UsageError((o.peak_given ? opt("peak_tflops") : opt("mfu")) + ": " +
                         opt("step_time_s") +
                         " gives one GPU's step time, which replaces the estimate from " +
                         opt("peak_tflops") + " and " + opt("mfu") + ": give one or the other");

    s.params = r.total_params;
    s.gradient_bytes = checked_mul(4, r.total_params, "the gradient bytes");  // P <= 2^48
    s.seq = r.flops_context;
    if (s.seq < 1) throw Error(r.source + ": the report has no sequence length for the step");
    if (o.tokens_per_step > 0) {
        s.tokens_per_step = o.tokens_per_step;
        s.tokens_origin = opt("tokens_per_step").spelled(spell);
    } else {
        const int64_t batch = r.options.batch > 0 ? r.options.batch : kDefaultBatchSequences;
        const OptionText seq =
            with_thousands(s.seq) +
            (r.options.seq > 0 ? " (" + opt("seq") + ")" : " (the config's context)");
        if (__builtin_mul_overflow(batch, s.seq, &s.tokens_per_step))
            throw_int64_overflow(opt("batch") + " x " + opt("seq"));
        s.tokens_origin =
            (r.options.batch > 0 ? opt("batch") + " " + with_thousands(batch) + " x " + seq
                                 : with_thousands(batch) + " sequences (tmx train's default " +
                                       opt("batch_size") + ") x " + seq)
                .spelled(spell);
    }
    s.training_flops_per_token = r.training_flops;
    s.flops_per_step = static_cast<double>(s.tokens_per_step) * r.training_flops;
    if (o.step_time_s) {
        s.measured = true;
        s.one_gpu_step_s = *o.step_time_s;
    } else {
        s.one_gpu_step_s = s.flops_per_step / (o.peak_tflops * 1e12 * o.mfu);
        if (!std::isfinite(s.one_gpu_step_s) || s.one_gpu_step_s <= 0)
            throw UsageError("the estimated step time of " + with_thousands(s.tokens_per_step) +
                             " tokens at " + fmt_real(o.peak_tflops) + " TFLOP/s x MFU " +
                             fmt_real(o.mfu) + " is not a finite positive number: check " +
                             opt("tokens_per_step") + ", " + opt("peak_tflops") + " and " +
                             opt("mfu"));
    }

    for (const Interconnect& ic : s.options.interconnects) {
        ScalingTable t;
        t.interconnect = ic;
        for (int64_t n : s.options.ranks) t.rows.push_back(scaling_row(s, ic, n));
        t.comm_bound_from = comm_bound_from(s, ic);
        t.allreduce_limit_s = 2.0 * static_cast<double>(s.gradient_bytes) / (ic.bus_gb_per_s * 1e9);
        t.best_searched_up_to = std::clamp<int64_t>(s.tokens_per_step / s.seq, 1, kMaxRanks);
        for (int64_t n = 2; n <= t.best_searched_up_to; ++n) {
            const ScalingRow row = scaling_row(s, ic, n);
            if (row.speedup_no_overlap > t.best_no_overlap_speedup) {
                t.best_no_overlap_speedup = row.speedup_no_overlap;
                t.best_no_overlap_ranks = n;
            }
            if (row.speedup_overlap > t.best_overlap_speedup) {
                t.best_overlap_speedup = row.speedup_overlap;
                t.best_overlap_ranks = n;
            }
        }
        s.tables.push_back(t);
    }
    return s;
}

// ------------------------------------------------------------------------------------------
// Text

std::string format_scaling_report(const ScalingReport& s) {
    std::ostringstream out;
    const ScalingOptions& o = s.options;
    auto spelled = [&](const OptionText& text) { return text.spelled(o.spelling); };
    const std::string bytes = with_thousands(s.gradient_bytes) + " B";
    auto at_n = [](int64_t n) { return nb("N = " + with_thousands(n)); };
    out << "\ndata-parallel training on N GPUs: ESTIMATES from a simple model, not measurements\n";
    out << wrap(spelled(
        "Every step a ring all-reduce sums the fp32 gradients of all " + with_thousands(s.params) +
        " parameters (" + bytes +
        "): each rank holds the whole model, every expert included, so the all-reduce follows "
        "the total parameters while an MoE's compute follows the active ones. Each rank sends " +
        nb("2 (N-1)/N x " + with_thousands(s.gradient_bytes) + " B") +
        " and receives as many (1 GB = 1e9 B). With " + opt("shard_optimizer") +
        " (ZeRO-1) tmx does a reduce-scatter of the gradients and an all-gather of the fp32 "
        "weights instead: the same bytes."));
    out << wrap("Global batch fixed at " + with_thousands(s.tokens_per_step) +
                " tokens per step (" + s.tokens_origin + "); each of N ranks computes 1/N of it.");
    if (s.measured)
        out << wrap(spelled("One GPU: " + fmt_time(s.one_gpu_step_s) + " per step, measured (" +
                            opt("step_time_s") + ")."));
    else
        out << wrap(spelled(
            "One GPU: " + fmt_time(s.one_gpu_step_s) +
            " per step, estimated: " + with_thousands(s.tokens_per_step) + " tokens x " +
            nb(fmt_si(s.training_flops_per_token, "FLOP")) + " (training FLOPs per token) / (" +
            nb(fmt_real(o.peak_tflops) + " TFLOP/s") + " peak" +
            (o.peak_given ? " (" + opt("peak_tflops") + ")" : " (assumed: H100 SXM dense bf16)") +
            " x MFU " + fmt_real(o.mfu) + (o.mfu_given ? " (" + opt("mfu") + ")" : " (assumed)") +
            "). " + opt("step_time_s") + " takes a measured step instead."));
    out << wrap(
        "Compute at N = one GPU's step / N. All-reduce = latency + bytes sent / the per-GPU bus "
        "bandwidth (per direction, as NCCL-tests' busbw); latency = " +
        nb(fmt_real(kCollectiveBaseLatencyUs) + " us") +
        " + 2 (N-1) x a per-step latency (NCCL's ring cost model, src/graph/tuning.cc, ring "
        "algorithm, Simple protocol; small beside the bandwidth term for large models). "
        "Speed-up = one GPU's step / the step at N; efficiency = speed-up / N; without overlap "
        "the step is compute + all-reduce, with perfect overlap the larger of the two.");
    out << wrap(spelled(
        "Memory: each rank holds the whole model's training state, as one GPU does (above); "
        "ZeRO-1 (" +
        opt("shard_optimizer") + ") divides only the optimizer's part by N."));
    out << wrap(
        "Not modelled: the optimizer update (taken to shrink with N like the rest of the step), a "
        "lower MFU at smaller per-rank batches, stragglers, congestion.");

    for (const ScalingTable& t : s.tables) {
        const Interconnect& ic = t.interconnect;
        const std::string bw = nb(fmt_gbps(ic.bus_gb_per_s));
        out << "\n"
            << wrap(ic.name + ": " + bw + " per-GPU bus bandwidth (" + ic.bandwidth_source +
                        "); latency " + nb(fmt_real(ic.step_latency_us) + " us") +
                        " per ring step (" + ic.latency_source + ")",
                    "", "  ");
        std::vector<std::vector<std::string>> rows = {
            {"", "tokens", "sent", "", "", "no overlap", "", "", "overlap", "", ""},
            {"ranks", "per rank", "per rank", "all-reduce", "compute", "step", "speed-up", "eff.",
             "step", "speed-up", "eff."}};
        bool split = false;
        for (const ScalingRow& row : t.rows) {
            split |= !row.whole_sequences;
            rows.push_back({with_thousands(row.ranks) + (row.whole_sequences ? "" : "*"),
                            fmt_count(row.tokens_per_rank),
                            fmt_si(static_cast<double>(row.bytes_sent_per_rank), "B"),
                            fmt_time(row.allreduce_s), fmt_time(row.compute_s),
                            fmt_time(row.step_no_overlap_s), fmt_speedup(row.speedup_no_overlap),
                            fmt_percent(row.efficiency_no_overlap), fmt_time(row.step_overlap_s),
                            fmt_speedup(row.speedup_overlap), fmt_percent(row.efficiency_overlap)});
        }
        print_table(out, rows, "rrrrrrrrrrr");
        if (split)
            out << wrap("* at that N a rank's share of the " + with_thousands(s.tokens_per_step) +
                        " tokens is not a whole number of " + with_thousands(s.seq) +
                        "-token sequences");
        std::string text;
        const std::string upto =
            "N up to " + with_thousands(t.best_searched_up_to) + " (" +
            (t.best_searched_up_to == kMaxRanks
                 ? spelled("the most " + opt("ranks") + " takes")
                 : "one " + with_thousands(s.seq) + "-token sequence per rank") +
            ")";
        if (t.best_no_overlap_ranks == 1 && t.best_overlap_ranks == 1)
            text = "For " + upto + " none is faster than one GPU, even with perfect overlap.";
        else
            text = "Best speed-up for " + upto + ": " + fmt_speedup(t.best_no_overlap_speedup) +
                   " at " + at_n(t.best_no_overlap_ranks) + " without overlap, " +
                   fmt_speedup(t.best_overlap_speedup) + " at " + at_n(t.best_overlap_ranks) +
                   " with perfect overlap.";
        if (t.comm_bound_from > 0)
            text += " From " + at_n(t.comm_bound_from) +
                    " the all-reduce takes at least a rank's compute (efficiency 50% or less "
                    "without overlap).";
        else
            text += " The all-reduce stays below a rank's compute up to " + at_n(kMaxRanks) + ".";
        text += " As N grows its bandwidth term tends to " + fmt_time(t.allreduce_limit_s) + " (" +
                nb("2 x " + with_thousands(s.gradient_bytes) + " B") + " at " + bw + ").";
        out << wrap(text);
    }
    return out.str();
}

// ------------------------------------------------------------------------------------------
// JSON

json scaling_report_json(const ScalingReport& s) {
    const ScalingOptions& o = s.options;
    auto spelled = [&](const OptionText& text) { return text.spelled(o.spelling); };
    json j;
    j["estimate"] = true;
    j["note"] = spelled(
        "estimates from a simple model, not measurements: ring all-reduce of the fp32 gradients "
        "of every parameter (every expert) each step, time = latency + bytes sent per rank / "
        "per-GPU bus bandwidth (per direction); global batch fixed, each rank computes 1/N of "
        "it; " +
        opt("shard_optimizer") + " (reduce-scatter + all-gather) moves the same bytes");
    j["params"] = s.params;
    j["gradient_bytes"] = s.gradient_bytes;
    j["bytes_per_rank_formula"] = "floor(2 (N-1)/N x gradient_bytes), sent and as many received";
    j["tokens_per_step"] = s.tokens_per_step;
    j["tokens_per_step_origin"] = s.tokens_origin;
    j["seq"] = s.seq;
    json one;
    one["step_s"] = s.one_gpu_step_s;
    one["measured"] = s.measured;
    one["training_flops_per_token"] = s.training_flops_per_token;
    one["flops_per_step"] = s.flops_per_step;
    if (s.measured) {
        one["origin"] = spelled(opt("step_time_s"));
        one["peak_tflops"] = nullptr;
        one["mfu"] = nullptr;
    } else {
        one["origin"] = "estimate: flops_per_step / (peak_tflops x 1e12 x mfu)";
        one["peak_tflops"] = o.peak_tflops;
        one["peak_tflops_origin"] =
            o.peak_given ? spelled(opt("peak_tflops")) : "assumed: H100 SXM dense bf16";
        one["mfu"] = o.mfu;
        one["mfu_origin"] = o.mfu_given ? spelled(opt("mfu")) : "assumed";
    }
    j["one_gpu"] = one;
    j["latency_base_us"] = kCollectiveBaseLatencyUs;
    json tables = json::array();
    for (const ScalingTable& t : s.tables) {
        const Interconnect& ic = t.interconnect;
        json jt;
        jt["interconnect"] = ic.key;
        jt["name"] = ic.name;
        jt["bus_bandwidth_gb_per_s"] = ic.bus_gb_per_s;
        jt["bandwidth_is"] = "per-GPU bus bandwidth, per direction (1 GB = 1e9 B)";
        jt["bandwidth_source"] = ic.bandwidth_source;
        jt["latency_per_step_us"] = ic.step_latency_us;
        jt["latency_source"] = ic.latency_source;
        json rows = json::array();
        for (const ScalingRow& r : t.rows)
            rows.push_back({{"ranks", r.ranks},
                            {"tokens_per_rank", r.tokens_per_rank},
                            {"whole_sequences_per_rank", r.whole_sequences},
                            {"bytes_sent_per_rank", r.bytes_sent_per_rank},
                            {"bytes_received_per_rank", r.bytes_sent_per_rank},
                            {"allreduce_bandwidth_s", r.bandwidth_s},
                            {"allreduce_latency_s", r.latency_s},
                            {"allreduce_s", r.allreduce_s},
                            {"compute_s", r.compute_s},
                            {"step_no_overlap_s", r.step_no_overlap_s},
                            {"speedup_no_overlap", r.speedup_no_overlap},
                            {"efficiency_no_overlap", r.efficiency_no_overlap},
                            {"step_overlap_s", r.step_overlap_s},
                            {"speedup_overlap", r.speedup_overlap},
                            {"efficiency_overlap", r.efficiency_overlap}});
        jt["rows"] = rows;
        jt["comm_bound_from_ranks"] =
            t.comm_bound_from > 0 ? json(t.comm_bound_from) : json(nullptr);
        jt["best_searched_up_to_ranks"] = t.best_searched_up_to;
        jt["best_no_overlap"] = {{"ranks", t.best_no_overlap_ranks},
                                 {"speedup", t.best_no_overlap_speedup}};
        jt["best_overlap"] = {{"ranks", t.best_overlap_ranks}, {"speedup", t.best_overlap_speedup}};
        jt["allreduce_bandwidth_limit_s"] = t.allreduce_limit_s;
        tables.push_back(jt);
    }
    j["interconnects"] = tables;
    return j;
}

}  // namespace tmx

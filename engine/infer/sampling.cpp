#include "engine/infer/sampling.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "engine/core/errors.h"

namespace tmx {
namespace {

// exp(x) for x <= 0, in place over n values, to within a few units in the last place: the
// weights of a whole vocabulary per drawn token (32,000 of them for tiny-mixtral), where libm's
// exp, one call at a time, took 300 us a token, as long as a server's whole batched decode step
// on a GPU. Branch-free, so the compiler vectorises it: x = n ln2 + r with |r| <= ln2 / 2
// (n rounded to nearest by the 1.5 * 2^52 trick, ln2 split in two so that n * ln2_hi is exact),
// exp(r) by its Taylor series to r^13 / 13! (truncation error below 1e-17), times 2^n built in
// the exponent bits. Below -708 (exp(x) < 2.3e-308, nothing beside the top weight's 1) it
// gives 0, and -inf gives 0; a NaN stays NaN.
void exp_nonpositive(double* x, int64_t n) {
    constexpr double kLog2e = 1.4426950408889634, kShift = 6755399441055744.0;  // 1.5 * 2^52
    constexpr double kLn2Hi = 6.93147180369123816490e-01, kLn2Lo = 1.90821492927058770002e-10;
    constexpr double kLowest = -708.0;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
        const double v = x[i];
        const double xc = v < kLowest ? kLowest : v;  // also -inf; a NaN passes through
        const double shifted = xc * kLog2e + kShift;
        const double k = shifted - kShift;  // round(xc / ln2), exactly an integer
        const double r = (xc - k * kLn2Hi) - k * kLn2Lo;
        double p = 1.0 / 6227020800.0;  // 1 / 13!
        p = p * r + 1.0 / 479001600.0;
        p = p * r + 1.0 / 39916800.0;
        p = p * r + 1.0 / 3628800.0;
        p = p * r + 1.0 / 362880.0;
        p = p * r + 1.0 / 40320.0;
        p = p * r + 1.0 / 5040.0;
        p = p * r + 1.0 / 720.0;
        p = p * r + 1.0 / 120.0;
        p = p * r + 1.0 / 24.0;
        p = p * r + 1.0 / 6.0;
        p = p * r + 0.5;
        p = p * r + 1.0;
        p = p * r + 1.0;
        // 2^k for k in [-1022, 0]: the biased exponent k + 1023 in the exponent field.
        const int64_t biased = static_cast<int64_t>(k) + 1023;
        const double scale = std::bit_cast<double>(static_cast<uint64_t>(biased) << 52);
        x[i] = v < kLowest ? 0.0 : p * scale;
    }
}

// The index of the first largest value (std::max_element's answer, NaNs passed over), in two
// passes the compiler vectorises.
template <typename T>
int64_t first_max(const T* x, int64_t n) {
    T m = x[0];
#pragma omp simd reduction(max : m)
    for (int64_t i = 1; i < n; ++i) m = x[i] > m ? x[i] : m;
    for (int64_t i = 0; i < n; ++i)
        if (x[i] == m) return i;
    return 0;  // x[0] is NaN: max_element's answer too
}

// The inverse CDF over all of w[0, n) in id order: the first id whose running sum passes
// u * total. The running sum goes by blocks of 8 values (each summed in one fixed order, so the
// same on every instruction set) and then within the block it ends in, instead of one long
// chain of dependent additions. Where rounding leaves the chain short of the target, the last
// id of positive weight.
int32_t draw_in_id_order(const double* w, int64_t n, double u) {
    constexpr int64_t kBlock = 8;
    const int64_t blocks = n / kBlock;
    thread_local std::vector<double> sums;
    sums.resize(static_cast<size_t>(blocks) + 1);
    for (int64_t b = 0; b < blocks; ++b) {
        const double* v = w + b * kBlock;
        sums[b] = ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
    }
    double tail = 0.0;
    for (int64_t i = blocks * kBlock; i < n; ++i) tail += w[i];
    sums[blocks] = tail;
    double total = 0.0;
    for (double x : sums) total += x;
    const double target = u * total;
    double cum = 0.0;
    int64_t last = -1;
    for (int64_t b = 0; b <= blocks; ++b) {
        if (sums[b] > 0.0 && cum + sums[b] > target) {
            for (int64_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i) {
                if (w[i] > 0.0) last = i;
                if ((cum += w[i]) > target) return static_cast<int32_t>(i);
            }
            return static_cast<int32_t>(last);
        }
        cum += sums[b];
        if (sums[b] > 0.0)
            for (int64_t i = std::min(n, (b + 1) * kBlock) - 1; i >= b * kBlock; --i)
                if (w[i] > 0.0) {
                    last = i;
                    break;
                }
    }
    return static_cast<int32_t>(std::max<int64_t>(last, 0));
}

// The tokens that survive every truncation (`kept`, in no particular order) and their
// unnormalised weights exp((logit - max) / temperature) (`weight`, over the vocabulary).
struct Truncation {
    std::vector<double> weight;
    std::vector<int32_t> kept;
};

// The caller's thread's buffers: a server draws a token per sequence per step, and allocating
// a vocabulary's worth of weights each time costs as much as filling them.
Truncation& scratch() {
    thread_local Truncation t;
    return t;
}

// Whether the options change the logits before the temperature (else greedy needs no copy).
bool adjusts_logits(const SamplingOptions& o) {
    return o.repetition_penalty != 1.0 || o.frequency_penalty != 0.0 || o.presence_penalty != 0.0 ||
           !o.logit_bias.empty();
}

}  // namespace

bool draws_argmax(const SamplingOptions& options) {
    return options.temperature == 0.0 && !adjusts_logits(options);
}

namespace {

const Truncation& truncate(const float* logits, int64_t vocab, const SamplingOptions& o,
                           const std::vector<int32_t>& history, size_t drawn,
                           const TokenMask* allowed) {
    Truncation& t = scratch();
    std::vector<double>& w = t.weight;
    w.assign(logits, logits + vocab);
    if (allowed) {
        // -infinity stays so through the bias, the penalties and the temperature, and weighs 0.
        constexpr double kOut = -std::numeric_limits<double>::infinity();
        for (size_t word = 0; word < allowed->bits.size(); ++word) {
            uint64_t out = ~allowed->bits[word];
            if (out == 0) continue;
            const int64_t base = static_cast<int64_t>(word) * 64;
            if (out == ~uint64_t{0} && base + 64 <= vocab) {
                std::fill(w.begin() + base, w.begin() + base + 64, kOut);
                continue;
            }
            for (; out; out &= out - 1) {
                const int64_t v = base + std::countr_zero(out);
                if (v < vocab) w[static_cast<size_t>(v)] = kOut;
            }
        }
    }
    for (const auto& [id, bias] : o.logit_bias)
        if (id >= 0 && id < vocab) w[id] += bias;
    if (o.frequency_penalty != 0.0 || o.presence_penalty != 0.0) {
        // Counted over the drawn tokens only, in a buffer that is all zeros between calls.
        thread_local std::vector<int32_t> count;
        count.resize(static_cast<size_t>(vocab), 0);
        const auto first =
            history.end() - static_cast<std::ptrdiff_t>(std::min(drawn, history.size()));
        for (auto it = first; it != history.end(); ++it)
            if (*it >= 0 && *it < vocab) ++count[*it];
        for (auto it = first; it != history.end(); ++it) {
            if (*it < 0 || *it >= vocab || count[*it] == 0) continue;
            w[*it] -= o.frequency_penalty * count[*it] + o.presence_penalty;
            count[*it] = 0;
        }
    }
    if (o.repetition_penalty != 1.0) {
        std::vector<char> seen(static_cast<size_t>(vocab), 0);
        for (int32_t id : history) {
            if (id < 0 || id >= vocab || seen[id]) continue;
            seen[id] = 1;
            w[id] = w[id] > 0 ? w[id] / o.repetition_penalty : w[id] * o.repetition_penalty;
        }
    }
    const int64_t top = first_max(w.data(), vocab);
    if (o.temperature == 0.0) {  // greedy
        std::fill(w.begin(), w.end(), 0.0);
        w[top] = 1.0;
        t.kept = {static_cast<int32_t>(top)};
        return t;
    }
    const double max_logit = w[top];
    for (double& x : w) x = (x - max_logit) / o.temperature;
    exp_nonpositive(w.data(), vocab);  // in [0, 1], top = 1

    // Sorted order: more probable first, ties to the lower id.
    auto before = [&](int32_t a, int32_t b) { return w[a] > w[b] || (w[a] == w[b] && a < b); };
    std::vector<int32_t>& idx = t.kept;
    idx.resize(static_cast<size_t>(vocab));
    for (int64_t i = 0; i < vocab; ++i) idx[i] = static_cast<int32_t>(i);
    // top-k, and the mass top-p measures against (top-k's renormalisation).
    if (o.top_k > 0 && o.top_k < vocab) {
        // The k first in that order: every token above the k-th largest weight, then as many
        // of the tokens at it as are needed, lowest ids first. The k-th largest is selected
        // among the weights at or above a power of two low enough that k of them are, not over
        // the whole vocabulary. That floor is found by counting passes, which vectorise: 2^-4,
        // 2^-12, 2^-28, ... (each step twice the last in the exponent, so at most 9 passes
        // before the floor reaches 0 and takes every token).
        double floor = 1.0, step = 0x1p-4;
        int64_t candidates = 0;
        do {
            floor *= step;
            step *= step;
            candidates = 0;
#pragma omp simd reduction(+ : candidates)
            for (int64_t i = 0; i < vocab; ++i) candidates += w[i] >= floor;
        } while (candidates < o.top_k && floor > 0.0);
        thread_local std::vector<double> values;
        values.clear();
        for (int64_t i = 0; i < vocab; ++i)
            if (w[i] >= floor) values.push_back(w[i]);
        std::nth_element(values.begin(), values.begin() + (o.top_k - 1), values.end(),
                         std::greater<double>());
        const double kth = values[static_cast<size_t>(o.top_k - 1)];
        int64_t ties = o.top_k;
        for (int64_t i = 0; i < vocab; ++i) ties -= w[i] > kth;
        idx.clear();
        for (int64_t i = 0; i < vocab; ++i)
            if (w[i] > kth || (w[i] == kth && ties-- > 0)) idx.push_back(static_cast<int32_t>(i));
    }
    // min-p keeps the tokens at or above min_p times the top probability: a prefix of the
    // sorted order, and the ratio does not change when top-p renormalises, so the filter may
    // run before top-p without changing the result. (With min_p 0 it keeps every token.)
    const size_t min_p_kept =
        o.min_p > 0.0
            ? static_cast<size_t>(std::partition(idx.begin(), idx.end(),
                                                 [&](int32_t id) { return w[id] >= o.min_p; }) -
                                  idx.begin())
            : idx.size();
    // top-p: the smallest sorted prefix (of the top-k set) whose mass reaches top_p of the top-k
    // set's (top-k's renormalisation). Sorting only a growing head keeps this O(V log n) for
    // the usual small n.
    size_t keep = min_p_kept;
    if (o.top_p < 1.0) {
        double mass = 0.0;
        for (int32_t id : idx) mass += w[id];
        const double target = o.top_p * mass;
        for (size_t n = std::min<size_t>(64, min_p_kept);; n = std::min(4 * n, min_p_kept)) {
            std::partial_sort(idx.begin(), idx.begin() + n, idx.begin() + min_p_kept, before);
            double cum = 0.0;
            size_t reached = 0;
            for (size_t i = 0; i < n && !reached; ++i)
                if ((cum += w[idx[i]]) >= target) reached = i + 1;
            if (reached) {
                keep = reached;
                break;
            }
            if (n == min_p_kept) break;
        }
    }
    idx.resize(std::max<size_t>(keep, 1));
    return t;
}

}  // namespace

void validate(const SamplingOptions& o) {
    auto bad = [](const OptionText& option, double value, const char* want) {
        throw UsageError(option + " is " + std::to_string(value) + ", expected " + want);
    };
    if (!(o.repetition_penalty > 0.0) || !std::isfinite(o.repetition_penalty))
        bad(opt("repetition_penalty"), o.repetition_penalty, "a number > 0 (1 = off)");
    if (!(o.temperature >= 0.0) || !std::isfinite(o.temperature))
        bad(opt("temperature"), o.temperature, "a number >= 0 (0 = greedy)");
    if (o.top_k < 0) bad(opt("top_k"), static_cast<double>(o.top_k), "an integer >= 0 (0 = off)");
    if (!(o.top_p >= 0.0 && o.top_p <= 1.0))
        bad(opt("top_p"), o.top_p, "a number in [0, 1] (1 = off)");
    if (!(o.min_p >= 0.0 && o.min_p <= 1.0))
        bad(opt("min_p"), o.min_p, "a number in [0, 1] (0 = off)");
    if (!(o.frequency_penalty >= -2.0 && o.frequency_penalty <= 2.0))
        bad(opt("frequency_penalty"), o.frequency_penalty, "a number in [-2, 2] (0 = off)");
    if (!(o.presence_penalty >= -2.0 && o.presence_penalty <= 2.0))
        bad(opt("presence_penalty"), o.presence_penalty, "a number in [-2, 2] (0 = off)");
    for (const auto& [id, bias] : o.logit_bias)
        if (!(bias >= -100.0 && bias <= 100.0))
            bad("logit_bias", bias, "a number in [-100, 100] for each token");
}

std::vector<double> sampling_distribution(const float* logits, int64_t vocab,
                                          const SamplingOptions& options,
                                          const std::vector<int32_t>& history, size_t drawn,
                                          const TokenMask* allowed) {
    const Truncation& t = truncate(logits, vocab, options, history, drawn, allowed);
    double total = 0.0;
    for (int32_t id : t.kept) total += t.weight[id];
    std::vector<double> p(static_cast<size_t>(vocab), 0.0);
    for (int32_t id : t.kept) p[id] = t.weight[id] / total;
    return p;
}

int32_t sample_token(const float* logits, int64_t vocab, const SamplingOptions& options,
                     const std::vector<int32_t>& history, size_t drawn, Rng& rng,
                     const TokenMask* allowed) {
    const double u = rng.uniform();
    // Greedy on the logits as they are: the first largest, with no copy of the row.
    if (draws_argmax(options) && !allowed) return static_cast<int32_t>(first_max(logits, vocab));
    const Truncation& t = truncate(logits, vocab, options, history, drawn, allowed);
    if (t.kept.size() == 1) return t.kept[0];
    // Inverse CDF over the kept tokens in id order (any fixed order samples the same
    // distribution). Nothing truncated: every id, in order already.
    if (static_cast<int64_t>(t.kept.size()) == vocab &&
        std::is_sorted(t.kept.begin(), t.kept.end()))
        return draw_in_id_order(t.weight.data(), vocab, u);
    double total = 0.0;
    for (int32_t id : t.kept) total += t.weight[id];
    thread_local std::vector<int32_t> sorted;
    const std::vector<int32_t>* order = &t.kept;
    if (!std::is_sorted(t.kept.begin(), t.kept.end())) {
        sorted.assign(t.kept.begin(), t.kept.end());
        std::sort(sorted.begin(), sorted.end());
        order = &sorted;
    }
    const double target = u * total;
    double cum = 0.0;
    int32_t last = order->back();
    for (int32_t id : *order) {
        if (t.weight[id] > 0.0) last = id;
        if ((cum += t.weight[id]) > target) return id;
    }
    // u * total rounded up to the full sum: the last token of any weight (top-k may keep tokens
    // of weight 0, a mask's, beyond it).
    return last;
}

}  // namespace tmx

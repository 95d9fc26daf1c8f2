#include "engine/infer/sampling.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "engine/core/errors.h"

namespace tmx {
namespace {

// The tokens that survive every truncation (`kept`, in no particular order) and their
// unnormalised weights exp((logit - max) / temperature) (`weight`, over the vocabulary).
struct Truncation {
    std::vector<double> weight;
    std::vector<int32_t> kept;
};

Truncation truncate(const float* logits, int64_t vocab, const SamplingOptions& o,
                    const std::vector<int32_t>& history) {
    Truncation t;
    std::vector<double>& w = t.weight;
    w.assign(logits, logits + vocab);
    if (o.repetition_penalty != 1.0) {
        std::vector<char> seen(static_cast<size_t>(vocab), 0);
        for (int32_t id : history) {
            if (id < 0 || id >= vocab || seen[id]) continue;
            seen[id] = 1;
            w[id] = w[id] > 0 ? w[id] / o.repetition_penalty : w[id] * o.repetition_penalty;
        }
    }
    const int64_t top = std::max_element(w.begin(), w.end()) - w.begin();  // first maximum
    if (o.temperature == 0.0) {                                            // greedy
        std::fill(w.begin(), w.end(), 0.0);
        w[top] = 1.0;
        t.kept = {static_cast<int32_t>(top)};
        return t;
    }
    const double max_logit = w[top];
    for (double& x : w) x = std::exp((x - max_logit) / o.temperature);  // in (0, 1], top = 1

    // Sorted order: more probable first, ties to the lower id.
    auto before = [&](int32_t a, int32_t b) { return w[a] > w[b] || (w[a] == w[b] && a < b); };
    std::vector<int32_t>& idx = t.kept;
    idx.resize(static_cast<size_t>(vocab));
    for (int64_t i = 0; i < vocab; ++i) idx[i] = static_cast<int32_t>(i);
    // top-k, and the mass top-p measures against (top-k's renormalisation).
    if (o.top_k > 0 && o.top_k < vocab) {
        std::nth_element(idx.begin(), idx.begin() + o.top_k, idx.end(), before);
        idx.resize(static_cast<size_t>(o.top_k));
    }
    double mass = 0.0;
    for (int32_t id : idx) mass += w[id];
    // min-p keeps the tokens at or above min_p times the top probability: a prefix of the
    // sorted order, and the ratio does not change when top-p renormalises, so the filter may
    // run before top-p without changing the result.
    const size_t min_p_kept = static_cast<size_t>(
        std::partition(idx.begin(), idx.end(), [&](int32_t id) { return w[id] >= o.min_p; }) -
        idx.begin());
    // top-p: the smallest sorted prefix (of the top-k set) whose mass reaches top_p. Sorting
    // only a growing head keeps this O(V log n) for the usual small n.
    size_t keep = min_p_kept;
    if (o.top_p < 1.0) {
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
    auto bad = [](const char* flag, double value, const char* want) {
        throw UsageError(std::string(flag) + " is " + std::to_string(value) + ", expected " + want);
    };
    if (!(o.repetition_penalty > 0.0) || !std::isfinite(o.repetition_penalty))
        bad("--repetition-penalty", o.repetition_penalty, "a number > 0 (1 = off)");
    if (!(o.temperature >= 0.0) || !std::isfinite(o.temperature))
        bad("--temperature", o.temperature, "a number >= 0 (0 = greedy)");
    if (o.top_k < 0) bad("--top-k", static_cast<double>(o.top_k), "an integer >= 0 (0 = off)");
    if (!(o.top_p >= 0.0 && o.top_p <= 1.0))
        bad("--top-p", o.top_p, "a number in [0, 1] (1 = off)");
    if (!(o.min_p >= 0.0 && o.min_p <= 1.0))
        bad("--min-p", o.min_p, "a number in [0, 1] (0 = off)");
}

std::vector<double> sampling_distribution(const float* logits, int64_t vocab,
                                          const SamplingOptions& options,
                                          const std::vector<int32_t>& history) {
    const Truncation t = truncate(logits, vocab, options, history);
    double total = 0.0;
    for (int32_t id : t.kept) total += t.weight[id];
    std::vector<double> p(static_cast<size_t>(vocab), 0.0);
    for (int32_t id : t.kept) p[id] = t.weight[id] / total;
    return p;
}

int32_t sample_token(const float* logits, int64_t vocab, const SamplingOptions& options,
                     const std::vector<int32_t>& history, Rng& rng) {
    const double u = rng.uniform();
    Truncation t = truncate(logits, vocab, options, history);
    if (t.kept.size() == 1) return t.kept[0];
    // Inverse CDF over the kept tokens in id order (any fixed order samples the same
    // distribution; id order needs no sort).
    std::vector<char> is_kept(static_cast<size_t>(vocab), 0);
    double total = 0.0;
    for (int32_t id : t.kept) {
        is_kept[id] = 1;
        total += t.weight[id];
    }
    const double target = u * total;
    double cum = 0.0;
    int32_t last = t.kept[0];
    for (int32_t id = 0; id < vocab; ++id) {
        if (!is_kept[id]) continue;
        last = id;
        if ((cum += t.weight[id]) > target) return id;
    }
    return last;  // u * total rounded up to the full sum
}

}  // namespace tmx

#include "engine/infer/logprobs.h"

#include <algorithm>
#include <cmath>

namespace tmx {

ScoredToken score_token(std::span<const float> logits, int32_t token, int64_t top) {
    double max = -INFINITY;
    for (float l : logits) max = std::max(max, static_cast<double>(l));
    double sum = 0;
    for (float l : logits) sum += std::exp(static_cast<double>(l) - max);
    const double log_z = max + std::log(sum);
    ScoredToken out{logits[static_cast<size_t>(token)] - log_z, {}};
    // No alternatives asked for (often when scoring every prompt token): no sort.
    if (top <= 0) return out;
    std::vector<int32_t> ids(logits.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
    const size_t k = std::min(static_cast<size_t>(top), ids.size());
    std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(),
                      [&](int32_t a, int32_t b) {
                          return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
                      });
    for (size_t i = 0; i < k; ++i)
        out.top.emplace_back(ids[i], logits[static_cast<size_t>(ids[i])] - log_z);
    return out;
}

}  // namespace tmx

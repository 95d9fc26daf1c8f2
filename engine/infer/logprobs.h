// Log-probabilities of tokens under the model's own distribution: the log-softmax of the raw
// logits, before logit bias, penalties, temperature or truncation change what sampling.h draws
// from (as OpenAI's API reports them). For scoring drawn tokens and prompt tokens.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace tmx {

struct ScoredToken {
    double logprob = 0;  // log p(token)
    // The `top` most likely tokens and their log-probabilities, most likely first (ties: the
    // lower id first).
    std::vector<std::pair<int32_t, double>> top;
};

// `token`'s log-probability under softmax(logits), computed in double, and the `top` most
// likely tokens' (none when top <= 0; at most the whole vocabulary).
ScoredToken score_token(std::span<const float> logits, int32_t token, int64_t top);

}  // namespace tmx

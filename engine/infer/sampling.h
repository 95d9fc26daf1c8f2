// Choosing the next token from logits. The transformations apply in this order: logit bias,
// frequency and presence penalties, repetition penalty, temperature, top-k, top-p, min-p; then
// one draw. Every truncation keeps a prefix of the tokens sorted by probability (ties: lower id
// first), so the result is that prefix, renormalised.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "engine/core/rng.h"

namespace tmx {

struct SamplingOptions {
    // Repetition penalty over the tokens already in the sequence (prompt included): a positive
    // logit is divided by it, a negative one multiplied. 1 = off.
    double repetition_penalty = 1.0;
    // Logits are divided by it; 0 = greedy (the most likely token, ties to the lower id).
    double temperature = 0.8;
    int64_t top_k = 40;   // keep the k most likely tokens; 0 = off (also when k >= vocabulary)
    double top_p = 0.95;  // keep the smallest prefix whose probability reaches p; 1 = off
    double min_p = 0.05;  // drop tokens below min_p times the top probability; 0 = off
    // OpenAI's penalties over the tokens drawn so far (not the prompt): a token drawn c times
    // loses frequency_penalty * c + presence_penalty * (c > 0) from its logit. 0 = off; each
    // in [-2, 2].
    double frequency_penalty = 0.0;
    double presence_penalty = 0.0;
    // Added to the logits of these tokens first (OpenAI's logit_bias: each in [-100, 100]; ids
    // outside the vocabulary are ignored here, a server refuses them).
    std::vector<std::pair<int32_t, double>> logit_bias;
};

// Throws tmx::UsageError naming the option (its field: temperature, ...) when one is out of range.
void validate(const SamplingOptions& options);

// The distribution the draw uses: probabilities over the vocabulary (zero for every token
// removed), in double precision. `history` holds the sequence's tokens so far, the last `drawn`
// of them drawn (the rest its prompt).
std::vector<double> sampling_distribution(const float* logits, int64_t vocab,
                                          const SamplingOptions& options,
                                          const std::vector<int32_t>& history, size_t drawn);

// Draws the next token. Takes exactly one number from `rng` whatever the options, so a
// sequence's random stream advances the same way under every setting.
int32_t sample_token(const float* logits, int64_t vocab, const SamplingOptions& options,
                     const std::vector<int32_t>& history, size_t drawn, Rng& rng);

}  // namespace tmx

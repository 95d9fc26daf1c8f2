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

// A set of token ids, one bit each (bit v % 64 of word v / 64): the tokens a constrained draw
// may take (token_constraint.h). Every other token's logit counts as -infinity, before the
// logit bias and everything after it.
struct TokenMask {
    std::vector<uint64_t> bits;
    int64_t count = 0;  // tokens in the set

    explicit TokenMask(int64_t vocab = 0) : bits(static_cast<size_t>((vocab + 63) / 64), 0) {}
    bool contains(int32_t id) const { return bits[static_cast<size_t>(id) / 64] >> (id % 64) & 1; }
    void insert(int32_t id) {
        uint64_t& word = bits[static_cast<size_t>(id) / 64];
        const uint64_t bit = uint64_t{1} << (id % 64);
        count += (word & bit) == 0;
        word |= bit;
    }
};

// Throws tmx::UsageError naming the option (its field: temperature, ...) when one is out of range.
void validate(const SamplingOptions& options);

// The distribution the draw uses: probabilities over the vocabulary (zero for every token
// removed), in double precision. `history` holds the sequence's tokens so far, the last `drawn`
// of them drawn (the rest its prompt). `allowed` (when given, with at least one token) limits
// the draw to its tokens.
std::vector<double> sampling_distribution(const float* logits, int64_t vocab,
                                          const SamplingOptions& options,
                                          const std::vector<int32_t>& history, size_t drawn,
                                          const TokenMask* allowed = nullptr);

// Whether sample_token() draws the first largest logit whatever the history: temperature 0 and
// nothing that changes the logits (penalties, bias). Such a draw (without a mask) is the argmax
// of the logits, which a backend may take on its device (Backend::argmax_rows).
bool draws_argmax(const SamplingOptions& options);

// Draws the next token. Takes exactly one number from `rng` whatever the options, so a
// sequence's random stream advances the same way under every setting.
int32_t sample_token(const float* logits, int64_t vocab, const SamplingOptions& options,
                     const std::vector<int32_t>& history, size_t drawn, Rng& rng,
                     const TokenMask* allowed = nullptr);

}  // namespace tmx

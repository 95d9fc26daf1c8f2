// Generation (docs/design.md#6-rolling-kv-cache-and-generation) of a batch of prompts, on the
// scheduler (scheduler.h) with one slot per prompt: each prompt is prefilled into its row of a
// rolling-buffer KV cache in chunks of at most the attention window, then all prompts decode
// together, one token per step, each at its own position. Device-independent: it runs on any
// Backend.
//
// Randomness: each prompt draws from its own stream, seeded by the seed, the prompt's tokens and
// its index among identical prompts of the batch (0 for the first copy). So a prompt generated
// in a batch gives what it gives alone, and repeated prompts give different samples.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/data/tokenizer.h"
#include "engine/infer/json_schema.h"
#include "engine/infer/sampling.h"
#include "engine/infer/scheduler.h"
#include "engine/model/model.h"

namespace tmx {

struct GenerationOptions {
    int64_t max_new_tokens = 256;
    SamplingOptions sampling;
    uint64_t seed = 0;
    // Tokens per prefill chunk: 1 .. the attention window (0 = the window; for full
    // attention, max_seq_len).
    int64_t prefill_chunk = 0;
    // Drawing any of these ends a sequence with StopReason::Eos.
    std::vector<int32_t> end_ids;
    // generate_text only: keep generating past the end of a document (no end ids), until
    // max_new_tokens or a stop string. For benchmarks and comparisons of a fixed length.
    bool ignore_eos = false;
    // generate_text only: structured output. Each continuation is a JSON text the grammar
    // accepts (json_schema.h; the tokens drawn limited to those that keep it so), ending with
    // StopReason::Stop once the value is complete, or an end of document after a complete
    // value; cut by max_new_tokens (StopReason::Length) it is a prefix of one.
    std::shared_ptr<const JsonGrammar> json_grammar;
};

// The random stream of a prompt generated with `seed`, the `copy`-th identical prompt (0 for the
// first) of its batch: the same alone as in any batch, yet different for repeated prompts.
uint64_t generation_stream_seed(uint64_t seed, const std::vector<int32_t>& prompt, int copy);

// Called for every drawn token with the logits it was drawn from; returning true stops that
// sequence with StopReason::Stop (e.g. a stop string completed).
using TokenCallback =
    std::function<bool(size_t sequence, int32_t token, std::span<const float> logits)>;

// Generates from token prompts (each non-empty) as one batch.
std::vector<TokenGeneration> generate_tokens(Model& model,
                                             const std::vector<std::vector<int32_t>>& prompts,
                                             const GenerationOptions& options,
                                             const TokenCallback& on_token = {});

// One sequence's outcome at text level.
struct TextGeneration {
    std::string prompt;
    TokenGeneration tokens;
    std::string text;  // the continuation, cut before a stop string
};

// Receives text of sequence `sequence` as it becomes final (in order, per sequence).
using TextCallback = std::function<void(size_t sequence, std::string_view text)>;

// Generates continuations of text prompts (BOS + the encoded prompt; an empty prompt is BOS
// alone; a tokenizer without BOS: the encoded prompt, which must not be empty), stopping at the end
// of the document, at any of `stop` (text level), or after max_new_tokens. The end of a document is
// EOS, or BOS: models trained on `tmx prepare` data (documents that each start with BOS, back to
// back) end a document by starting the next. options.end_ids is replaced by those two (or by none,
// with options.ignore_eos; the control tokens add no text either way). The tokenizer's vocabulary
// must match the model's (Error otherwise).
std::vector<TextGeneration> generate_text(Model& model, const Tokenizer& tokenizer,
                                          const std::vector<std::string>& prompts,
                                          const GenerationOptions& options,
                                          const std::vector<std::string>& stop = {},
                                          const TextCallback& on_text = {});
// The same from prompts already tokenized as they are to be fed (no BOS added; a chat
// template's rendering, say); `prompts` are their texts for the results.
std::vector<TextGeneration> generate_text(Model& model, const Tokenizer& tokenizer,
                                          const std::vector<std::string>& prompts,
                                          const std::vector<std::vector<int32_t>>& prompt_ids,
                                          const GenerationOptions& options,
                                          const std::vector<std::string>& stop = {},
                                          const TextCallback& on_text = {});

}  // namespace tmx

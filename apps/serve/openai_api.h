// The OpenAI HTTP API as tmx serves it: request bodies read into generation parameters, with
// every problem an ApiError naming the field (OpenAI's error object), and response bodies and
// stream chunks written as OpenAI defines them. No HTTP here (apps/cmd_serve.cpp).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/infer/sampling.h"

namespace tmx::serve {

// An error answered with `status` and {"error": {"message", "type", "param", "code"}}.
struct ApiError {
    int status = 400;
    std::string message;
    std::string param;  // "" -> null
    std::string code;   // "" -> null
    std::string type = "invalid_request_error";
    nlohmann::json body() const;
};

// Limits the server enforces on every request.
struct ApiLimits {
    int64_t max_tokens = 2048;  // --max-tokens-limit
    int64_t max_n = 8;          // choices per prompt
    int64_t max_prompts = 16;   // prompts per request
    // Prompt tokens that echo with logprobs scores in one request, over all its choices: each
    // score is held until the answer is sent.
    int64_t max_scored_tokens = 65536;
};

struct ChatMessage {
    std::string role, content;
};

// A completion or chat request, read and checked.
struct CompletionRequest {
    bool chat = false;
    std::vector<std::string> prompts;  // completions: one or more; chat: the rendered template
    // Completions' prompts given as token ids (OpenAI's array of tokens, or array of such
    // arrays) instead of strings: used as given, no BOS added. Either this or `prompts`.
    std::vector<std::vector<int32_t>> prompt_tokens;
    std::vector<ChatMessage> messages;  // chat only
    int64_t max_tokens = 16;
    SamplingOptions sampling;
    uint64_t seed = 0;
    std::vector<std::string> stop;
    int64_t n = 1;
    bool stream = false;
    // stream_options.include_usage: every chunk has "usage": null, and a last chunk before
    // [DONE] has no choices and the request's usage.
    bool stream_usage = false;
    bool echo = false;
    bool ignore_eos = false;  // extension (as llama.cpp's server): generate max_tokens exactly
    // Log-probabilities of the drawn tokens: completions' `logprobs` N (0..5: the drawn token and
    // the N most likely), chat's `logprobs` true with `top_logprobs` N (0..20). -1: none.
    int64_t logprobs = -1;
    std::string model;
};

// A token's log-probability under the model (before temperature and truncation) and the `top`
// most likely alternatives: a drawn token's, or with echo a prompt token's. The first token of
// a prompt given as ids has none (null, as OpenAI answers): nothing came before it.
struct TokenLogprob {
    std::string token;
    std::optional<double> logprob;
    std::vector<std::pair<std::string, double>> top;
    size_t text_offset = 0;  // where the token's text starts in the choice's text
};

// The `logprobs` object of a choice: completions' {tokens, token_logprobs, top_logprobs,
// text_offset} or chat's {content: [{token, logprob, bytes, top_logprobs}]}.
nlohmann::json logprobs_json(const std::vector<TokenLogprob>& tokens, bool chat);

// Reads a /v1/completions (chat = false) or /v1/chat/completions body; throws ApiError.
CompletionRequest parse_completion_request(const std::string& body, bool chat,
                                           const ApiLimits& limits);

// POST /tokenize (as vLLM's server has it): {"prompt": text, "add_special_tokens": true by
// default, which puts the BOS first as a completion's string prompt gets it}.
struct TokenizeRequest {
    std::string prompt;
    bool add_special_tokens = true;
};
TokenizeRequest parse_tokenize_request(const std::string& body);
// POST /detokenize: {"tokens": [ids]}; the vocabulary is checked where the model is known.
std::vector<int32_t> parse_detokenize_request(const std::string& body);

// The default chat template: one line "role: content" per message, then "assistant:", for
// models that were not chat-tuned (tmx's are not). A --chat-template file replaces it: its text
// with {{messages}} replaced by those lines.
std::string render_chat(const std::vector<ChatMessage>& messages, const std::string& tmpl);

}  // namespace tmx::serve

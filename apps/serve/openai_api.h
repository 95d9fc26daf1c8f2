// The OpenAI HTTP API as tmx serves it: request bodies read into the engine's completion
// parameters, with every problem an ApiError naming the field (OpenAI's error object), and the
// engine's completions written as OpenAI's response bodies and stream chunks. No HTTP here
// (apps/serve/routes.h).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/infer/chat_template.h"
#include "engine/infer/completion_session.h"
#include "engine/infer/scheduler.h"

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

// A completion or chat request, read and checked: what the engine completes (CompletionParams:
// completions' prompts, strings or token ids, OpenAI's array of tokens or array of such arrays;
// chat's are left empty, its messages rendered where the template is known) and what only the
// API has. OpenAI's `logprobs` is completions' N (0..5: the drawn token and the N most likely) or
// chat's `logprobs: true` with `top_logprobs` N (0..20); `ignore_eos` is an extension (as
// llama.cpp's server has it).
struct CompletionRequest : CompletionParams {
    bool chat = false;
    std::vector<ChatMessage> messages;  // chat only
    bool stream = false;
    // stream_options.include_usage: every chunk has "usage": null, and a last chunk before
    // [DONE] has no choices and the request's usage.
    bool stream_usage = false;
    std::string model;
};

// The `logprobs` object of a choice: completions' {tokens, token_logprobs, top_logprobs,
// text_offset} or chat's {content: [{token, logprob, bytes, top_logprobs}]}. A token without a
// log-probability (the first of a prompt given as ids) has null, as OpenAI answers.
nlohmann::json logprobs_json(const std::vector<TokenLogprob>& tokens, bool chat);

// The error a refused completion is answered with, naming the request's field at fault.
ApiError api_error(const CompletionError& e, const CompletionRequest& r);

// OpenAI's finish_reason for how a choice ended.
const char* finish_reason(StopReason r);

// {"prompt_tokens", "completion_tokens", "total_tokens"}.
nlohmann::json usage_json(const Completion::Usage& usage);

// What every response body and stream chunk of one completion starts with.
struct ResponseHeader {
    std::string id;      // "cmpl-N", "chatcmpl-N"
    std::string object;  // "text_completion", "chat.completion" (+ ".chunk" when streamed)
    int64_t created = 0;
    std::string model;
    nlohmann::json fields() const;  // {id, object, created, model}
};

// The body of a whole (not streamed) completion whose choices have all ended well, after
// Completion::wait(); `logprobs`: the request asked for them.
nlohmann::json completion_body(const ResponseHeader& header, const Completion& completion,
                               bool chat, bool logprobs);

// A stream chunk's choice for an update: text or chat's delta (with the role in a choice's first
// one), its tokens' logprobs, and the finish_reason once the choice has ended well.
nlohmann::json stream_choice(const Completion::Update& update, bool chat, bool logprobs);

// The error of a completion one of whose choices failed.
ApiError generation_failed(const std::string& why);
// The error of a completion that was cancelled (the server shutting down, its device failing):
// `status` 503 when answered before any of it was sent, 500 as a stream's last event.
ApiError completion_cancelled(int status);

// JSON text; bytes that are not UTF-8 (a client's stop string cut by nobody) become U+FFFD
// rather than an exception.
std::string dump(const nlohmann::json& j);

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

}  // namespace tmx::serve

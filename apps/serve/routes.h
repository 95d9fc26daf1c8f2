// tmx serve's HTTP routes: the OpenAI endpoints (/v1/completions, /v1/chat/completions,
// /v1/models), /tokenize and /detokenize, /health, /metrics and the playground at /; the API key
// and the shutdown's drain checked before routing; every error as OpenAI's error object. The
// completions themselves run on the engine's session (engine/infer/completion_session.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "apps/serve/http_server.h"
#include "apps/serve/metrics.h"
#include "apps/serve/openai_api.h"
#include "engine/data/tokenizer.h"
#include "engine/infer/chat_template.h"
#include "engine/infer/completion_session.h"
#include "engine/infer/serve_loop.h"

namespace tmx::serve {

// What the routes share.
struct Server {
    Server(const Tokenizer& tokenizer, ServeLoop& loop, std::string model_name, std::string api_key,
           ChatPrompt chat, const ApiLimits& limits);

    const Tokenizer& tokenizer;
    ServeLoop& loop;
    const std::string model_name, api_key;
    const ChatPrompt chat;  // how chat's messages become a prompt
    const ApiLimits limits;
    std::atomic<bool> draining{false};  // after SIGINT/SIGTERM: API requests get 503
    std::atomic<uint64_t> next_id{1};
    Metrics metrics;
    CompletionSession session;  // counts its tokens into `metrics`

    // Starts the request's completion (chat's messages made a prompt first); an ApiError when
    // it cannot run (a chat template's own refusal of the conversation is a 400 with its
    // message).
    std::shared_ptr<Completion> start(const CompletionRequest& r);
};

void add_routes(HttpServer& http, Server& srv);

}  // namespace tmx::serve

#include "apps/serve/routes.h"

#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "apps/serve/completion_stream.h"
#include "apps/serve/playground.h"

namespace tmx::serve {

namespace {

using nlohmann::json;

int64_t unix_time() {
    return std::chrono::duration_cast<std::chrono::seconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

void send_error(HttpResponse& res, const ApiError& e, Metrics* metrics = nullptr) {
    if (metrics)
        metrics->count_request(e.status == 429   ? "queue_full"
                               : e.status >= 500 ? "server_error"
                                                 : "client_error");
    res.status = e.status;
    if (e.status == 429) res.set_header("Retry-After", "1");
    res.set_content(dump(e.body()), "application/json");
}

// The API key, then the drain: a request to the API that either refuses is answered here (true).
bool check_access(const Server& srv, const HttpRequest& req, HttpResponse& res) {
    const bool api =
        req.path.rfind("/v1/", 0) == 0 || req.path == "/tokenize" || req.path == "/detokenize";
    if (api && !srv.api_key.empty() && req.header("Authorization") != "Bearer " + srv.api_key) {
        send_error(res, {401, "a valid API key is required (Authorization: Bearer KEY)", "",
                         "invalid_api_key", "invalid_request_error"});
        return true;
    }
    if (srv.draining && api) {
        send_error(res, {503, "the server is shutting down", "", "shutting_down", "server_error"});
        return true;
    }
    return false;
}

// The HTTP server's own errors (no route, a request too large, too slow or malformed, too
// many connections) as OpenAI's error object.
std::string http_error_message(const HttpRequest& req, int status) {
    switch (status) {
        case 400:
            return "the request is not well-formed HTTP";
        case 404:
            return "unknown endpoint " + req.method + " " + req.path;
        case 405:
            return "method " + req.method + " not allowed on " + req.path;
        case 408:
            return "the request did not arrive whole within --request-timeout";
        case 413:
            return "the request body is larger than the server takes (--max-body)";
        case 431:
            return "the request line and headers are larger than the server takes";
        case 503:
            return "too many open connections (--max-connections): retry shortly";
        default:
            return "HTTP error " + std::to_string(status);
    }
}

void explain_http_error(const HttpRequest& req, HttpResponse& res) {
    if (!res.body.empty()) return;
    const int s = res.status;
    ApiError e{s, http_error_message(req, s), "", "",
               s >= 500 ? "server_error" : "invalid_request_error"};
    res.set_content(e.body().dump(), "application/json");
}

void tokenize(const Server& srv, const HttpRequest& req, HttpResponse& res) {
    try {
        const TokenizeRequest r = parse_tokenize_request(req.body);
        std::vector<int32_t> ids;
        if (r.add_special_tokens && srv.tokenizer.bos_id() >= 0)
            ids.push_back(srv.tokenizer.bos_id());
        const std::vector<int32_t> body = srv.tokenizer.encode(r.prompt);
        ids.insert(ids.end(), body.begin(), body.end());
        res.set_content(json{{"tokens", ids}, {"count", ids.size()}}.dump(), "application/json");
    } catch (const ApiError& e) {
        send_error(res, e);
    }
}

void detokenize(const Server& srv, const HttpRequest& req, HttpResponse& res) {
    try {
        const std::vector<int32_t> ids = parse_detokenize_request(req.body);
        try {
            check_in_vocabulary(srv.tokenizer, ids);
        } catch (const CompletionError& e) {
            throw ApiError{400, e.what(), "tokens[" + std::to_string(e.position) + "]", "",
                           "invalid_request_error"};
        }
        res.set_content(dump(json{{"prompt", srv.tokenizer.decode(ids)}}), "application/json");
    } catch (const ApiError& e) {
        send_error(res, e);
    }
}

// POST /v1/completions (chat false) and /v1/chat/completions: the whole answer once every choice
// has ended, or a stream.
void complete(Server& srv, bool chat, const HttpRequest& req, HttpResponse& res) {
    CompletionRequest r;
    std::shared_ptr<Completion> completion;
    try {
        r = parse_completion_request(req.body, chat, srv.limits);
        completion = srv.start(r);
    } catch (const ApiError& e) {
        send_error(res, e, &srv.metrics);
        return;
    }
    const ResponseHeader header{
        std::string(chat ? "chatcmpl-" : "cmpl-") + std::to_string(srv.next_id++),
        chat ? "chat.completion" : "text_completion", unix_time(), srv.model_name};
    if (r.stream) {
        stream_completion(res, completion, header, r, srv.metrics);
        return;
    }
    // Waits in slices, watching the connection: a client that has left cancels its completion
    // (freeing its slots), as a stream's does. What is written then reaches at most a client
    // that closed only its sending side: 499, nginx's "client closed request".
    while (!completion->wait_for(std::chrono::milliseconds(100))) {
        if (req.client_left()) {
            completion->cancel();
            srv.metrics.count_request("cancelled");
            send_error(res, {499, "the client closed its connection before the answer was ready",
                             "", "cancelled", "invalid_request_error"});
            return;
        }
    }
    if (const std::optional<std::string> failure = completion->failure()) {
        send_error(res, generation_failed(*failure), &srv.metrics);
        return;
    }
    if (completion->cancelled()) {
        send_error(res, completion_cancelled(503), &srv.metrics);
        return;
    }
    srv.metrics.count_request("ok");
    res.set_content(dump(completion_body(header, *completion, chat, r.logprobs >= 0)),
                    "application/json");
}

}  // namespace

Server::Server(const Tokenizer& tokenizer, ServeLoop& loop, std::string model_name,
               std::string api_key, ChatPrompt chat, const ApiLimits& limits)
    : tokenizer(tokenizer),
      loop(loop),
      model_name(std::move(model_name)),
      api_key(std::move(api_key)),
      chat(std::move(chat)),
      limits(limits),
      session(
          tokenizer, loop,
          {.max_scored_tokens = limits.max_scored_tokens,
           .on_prompt_queued = [this](int64_t tokens) { metrics.prompt_tokens += tokens; },
           .on_token_timing =
               [this](bool first, double seconds) {
                   metrics.completion_tokens++;
                   (first ? metrics.time_to_first_token : metrics.time_per_token).observe(seconds);
               }}) {}

std::shared_ptr<Completion> Server::start(const CompletionRequest& r) {
    try {
        if (!r.chat) return session.start(r);
        CompletionParams rendered = r;
        rendered.prompts.clear();
        rendered.prompt_tokens = {chat.tokens(r.messages)};
        return session.start(rendered);
    } catch (const CompletionError& e) {
        throw api_error(e, r);
    } catch (const jinja::TemplateRaised& e) {
        throw ApiError{400, e.message(), "messages", "", "invalid_request_error"};
    }
}

void add_routes(HttpServer& http, Server& srv) {
    http.set_pre_routing(
        [&srv](const HttpRequest& req, HttpResponse& res) { return check_access(srv, req, res); });
    http.set_error_handler(explain_http_error);
    http.route("GET", "/health", [&srv](const HttpRequest&, HttpResponse& res) {
        const std::string failure = srv.loop.failure();
        res.status = failure.empty() ? 200 : 503;
        res.set_content(json{{"status", failure.empty() ? "ok" : "error"}}.dump(),
                        "application/json");
    });
    http.route("GET", "/", [](const HttpRequest&, HttpResponse& res) {
        res.set_content(kPlaygroundHtml, "text/html; charset=utf-8");
    });
    http.route("GET", "/metrics", [&srv, &http](const HttpRequest&, HttpResponse& res) {
        const ServeLoop::Stats st = srv.loop.stats();
        res.set_content(srv.metrics.render(st.running, st.waiting, st.slots,
                                           {http.open_connections(), http.refused_connections()}),
                        "text/plain; version=0.0.4");
    });
    http.route("POST", "/tokenize",
               [&srv](const HttpRequest& req, HttpResponse& res) { tokenize(srv, req, res); });
    http.route("POST", "/detokenize",
               [&srv](const HttpRequest& req, HttpResponse& res) { detokenize(srv, req, res); });
    http.route("GET", "/v1/models", [&srv](const HttpRequest&, HttpResponse& res) {
        json m = {{"id", srv.model_name},
                  {"object", "model"},
                  {"created", unix_time()},
                  {"owned_by", "tmx"}};
        res.set_content(json{{"object", "list"}, {"data", {m}}}.dump(), "application/json");
    });
    http.route("POST", "/v1/completions", [&srv](const HttpRequest& req, HttpResponse& res) {
        complete(srv, false, req, res);
    });
    http.route("POST", "/v1/chat/completions", [&srv](const HttpRequest& req, HttpResponse& res) {
        complete(srv, true, req, res);
    });
}

}  // namespace tmx::serve

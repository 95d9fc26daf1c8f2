// tmx serve: an OpenAI-compatible HTTP server (cpp-httplib, the HTTP library llama.cpp's server
// uses, packaged by Debian) on the engine's continuous batching (engine/infer/serve_loop.h).
// HTTP threads parse requests, queue their sequences and stream their text; one engine thread
// owns the model. Request and response bodies: apps/serve/openai_api.h.
#include <httplib.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <thread>

#include "apps/commands.h"
#include "apps/serve/metrics.h"
#include "apps/serve/openai_api.h"
#include "apps/serve/playground.h"
#include "engine/core/errors.h"
#include "engine/core/file_io.h"
#include "engine/data/tokenizer.h"
#include "engine/infer/generator.h"
#include "engine/infer/serve_loop.h"
#include "engine/infer/text_stream.h"
#include "engine/model/checkpoint.h"

namespace tmx::cli {

namespace {

using nlohmann::json;
using serve::ApiError;

int64_t unix_time() {
    return std::chrono::duration_cast<std::chrono::seconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

// httplib's worker threads, each lowered below the engine thread's priority (nice + 5) when it
// takes its first connection: the engine thread is the server's throughput, and where the
// cores are busy (clients on the same machine, more connections than cores) a streaming
// thread woken for each token would otherwise take the engine's core from it mid-step.
class HttpThreads : public httplib::ThreadPool {
  public:
    using httplib::ThreadPool::ThreadPool;
    void enqueue(std::function<void()> fn) override {
        httplib::ThreadPool::enqueue([fn = std::move(fn)] {
            thread_local const bool lowered = [] {
                // Relative to the thread's own niceness (a server started with nice 10 must not
                // have threads raised to 5); best effort: one that cannot be lowered serves as
                // it is.
                const auto tid = static_cast<id_t>(::gettid());
                errno = 0;
                const int now = ::getpriority(PRIO_PROCESS, tid);
                return errno == 0 && ::setpriority(PRIO_PROCESS, tid, now + 5) == 0;
            }();
            (void)lowered;
            fn();
        });
    }
};

// One choice of a request: its text as it becomes final, filled by the engine thread.
struct Choice {
    std::unique_ptr<TextStream> text;  // engine thread only
    std::string pending;               // final text not yet sent
    std::string all;
    int64_t prompt_tokens = 0, completion_tokens = 0;
    std::string finish_reason;  // "" while running
    std::string error;          // why it failed (StopReason::Failed)
    bool done = false;
    std::chrono::steady_clock::time_point last_token{};
    ServeLoop::Ticket ticket = 0;
    std::vector<serve::TokenLogprob> logprobs, pending_logprobs;  // when asked for
    size_t text_start = 0;      // where the generated text starts (after an echoed prompt)
    size_t logprob_offset = 0;  // text offset of the next generated token
    // echo with logprobs: the echoed prompt's tokens, scored as the prefill computes them; the
    // echo is held back until the last one is (release_echo).
    std::vector<serve::TokenLogprob> prompt_logprobs;
    size_t first_echoed = 0;  // the prompt id prompt_logprobs[0] is (1 after a BOS we added)
};

// A prompt as the model takes it and as it is echoed.
struct Prompt {
    std::vector<int32_t> ids;
    std::string text;     // what echo returns
    size_t first_echoed;  // ids before it are not part of the text (the BOS we add)
};

// The held echo and its prompt's scores become the choice's first text.
void release_echo(Choice& c) {
    c.pending += c.all.substr(0, c.text_start);
    c.logprobs.insert(c.logprobs.begin(), c.prompt_logprobs.begin(), c.prompt_logprobs.end());
    c.pending_logprobs.insert(c.pending_logprobs.begin(), c.prompt_logprobs.begin(),
                              c.prompt_logprobs.end());
    c.prompt_logprobs.clear();
}

// The choices of one HTTP request, shared by its HTTP thread and the engine thread.
struct Job {
    const std::chrono::steady_clock::time_point arrived = std::chrono::steady_clock::now();
    std::mutex mutex;
    std::condition_variable changed;
    std::vector<Choice> choices;
    bool all_done() const {
        for (const Choice& c : choices)
            if (!c.done) return false;
        return true;
    }
};

// The 400 for a client's token id outside the tokenizer's vocabulary, naming `param`.
ApiError outside_vocabulary(const Tokenizer& tok, int32_t id, const std::string& param) {
    return {400,
            "token " + std::to_string(id) + " is outside the vocabulary (" +
                std::to_string(tok.vocab_size()) + " tokens)",
            param, "", "invalid_request_error"};
}

// Throws outside_vocabulary naming `param[t]` for the first such ids[t] (ids come from a client;
// decoding one outside the vocabulary would throw).
void check_in_vocabulary(const Tokenizer& tok, const std::vector<int32_t>& ids,
                         const std::string& param) {
    for (size_t t = 0; t < ids.size(); ++t)
        if (ids[t] < 0 || ids[t] >= tok.vocab_size())
            throw outside_vocabulary(tok, ids[t], param + "[" + std::to_string(t) + "]");
}

// A token as text: its piece with the SentencePiece space marker as a space, a byte piece as
// its byte.
std::string token_text(const Tokenizer& tok, int32_t id) {
    const Tokenizer::PieceInfo& pi = tok.info(id);
    if (pi.kind == Tokenizer::Kind::Byte) return std::string(1, static_cast<char>(pi.byte));
    if (pi.kind == Tokenizer::Kind::Normal) return pi.text;
    return tok.piece(id);
}

// The drawn token's log-probability under the model's distribution (log-softmax of the raw
// logits, in double) and the `top` most likely tokens'.
serve::TokenLogprob token_logprob(const Tokenizer& tok, int32_t token,
                                  std::span<const float> logits, int64_t top) {
    double max = -INFINITY;
    for (float l : logits) max = std::max(max, static_cast<double>(l));
    double sum = 0;
    for (float l : logits) sum += std::exp(static_cast<double>(l) - max);
    const double log_z = max + std::log(sum);
    serve::TokenLogprob out{token_text(tok, token), logits[static_cast<size_t>(token)] - log_z, {}};
    // No alternatives asked for (logprobs 0, often when scoring every prompt token): no sort.
    if (top <= 0) return out;
    std::vector<int32_t> ids(logits.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
    const size_t k = std::min(static_cast<size_t>(top), ids.size());
    std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(),
                      [&](int32_t a, int32_t b) {
                          return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
                      });
    for (size_t i = 0; i < k; ++i)
        out.top.emplace_back(token_text(tok, ids[i]), logits[static_cast<size_t>(ids[i])] - log_z);
    return out;
}

const char* finish_reason(StopReason r) {
    switch (r) {
        case StopReason::Length:
            return "length";
        case StopReason::Cancelled:
            return "cancelled";
        case StopReason::Failed:
            return "error";
        default:
            return "stop";
    }
}

struct Server {
    const Tokenizer& tokenizer;
    ServeLoop& loop;
    std::string model_name, api_key, chat_template;
    serve::ApiLimits limits;
    std::atomic<bool> draining{false};
    std::atomic<uint64_t> next_id{1};
    serve::Metrics metrics;

    // The request's prompts: strings (and chat's rendered messages) encoded after a BOS, ids
    // as given (checked against the vocabulary here: they are decoded for echo).
    std::vector<Prompt> read_prompts(const serve::CompletionRequest& r) const {
        std::vector<Prompt> out;
        if (!r.prompt_tokens.empty()) {
            for (size_t p = 0; p < r.prompt_tokens.size(); ++p) {
                const std::vector<int32_t>& ids = r.prompt_tokens[p];
                check_in_vocabulary(
                    tokenizer, ids,
                    r.prompt_tokens.size() > 1 ? "prompt[" + std::to_string(p) + "]" : "prompt");
                out.push_back({ids, tokenizer.decode(ids), 0});
            }
            return out;
        }
        const std::vector<std::string> texts =
            r.chat ? std::vector<std::string>{serve::render_chat(r.messages, chat_template)}
                   : r.prompts;
        for (const std::string& text : texts) {
            std::vector<int32_t> ids{tokenizer.bos_id()};
            const std::vector<int32_t> body = tokenizer.encode(text);
            ids.insert(ids.end(), body.begin(), body.end());
            out.push_back({std::move(ids), text, 1});
        }
        return out;
    }

    // The echoed tokens of a prompt, each with its text and where it starts, not yet scored:
    // decoded as a stream, so their texts join into the decoded prompt (a character split over
    // byte pieces is the text of its last piece).
    std::vector<serve::TokenLogprob> echoed_tokens(const Prompt& prompt) const {
        std::vector<serve::TokenLogprob> out;
        StreamDecoder decoder(tokenizer);
        size_t offset = 0;
        for (size_t t = 0; t < prompt.ids.size(); ++t) {
            std::string piece = decoder.push(prompt.ids[t]);
            if (t < prompt.first_echoed) continue;
            const size_t size = piece.size();
            out.push_back({std::move(piece), std::nullopt, {}, offset});
            offset += size;
        }
        if (!out.empty()) out.back().token += decoder.flush();
        return out;
    }

    // Queues every (prompt, n) sequence of the request; ApiError when one cannot run.
    std::shared_ptr<Job> start(const serve::CompletionRequest& r) {
        auto job = std::make_shared<Job>();
        for (const auto& [id, bias] : r.sampling.logit_bias)
            if (id >= tokenizer.vocab_size())
                throw outside_vocabulary(tokenizer, id, "logit_bias." + std::to_string(id));
        const std::vector<Prompt> prompts = read_prompts(r);
        // echo with logprobs scores the prompt too: every prompt token's log-probability.
        const bool score_prompt = !r.chat && r.echo && r.logprobs >= 0;
        if (score_prompt) {
            size_t scored = 0;
            for (const Prompt& p : prompts) scored += p.ids.size() * static_cast<size_t>(r.n);
            if (scored > static_cast<size_t>(limits.max_scored_tokens))
                throw ApiError{400,
                               "echo with logprobs scores at most " +
                                   std::to_string(limits.max_scored_tokens) +
                                   " prompt tokens per request (over all choices); this one has " +
                                   std::to_string(scored),
                               "prompt", "", "invalid_request_error"};
        }
        job->choices.resize(prompts.size() * static_cast<size_t>(r.n));
        std::vector<SequenceRequest> requests;
        for (size_t p = 0; p < prompts.size(); ++p) {
            const std::vector<int32_t>& ids = prompts[p].ids;
            for (int64_t k = 0; k < r.n; ++k) {
                const size_t i = p * static_cast<size_t>(r.n) + static_cast<size_t>(k);
                Choice& c = job->choices[i];
                c.text = std::make_unique<TextStream>(tokenizer, ids, r.stop);
                c.prompt_tokens = static_cast<int64_t>(ids.size());
                metrics.prompt_tokens += ids.size();
                if (r.echo) c.all = prompts[p].text;
                c.text_start = c.logprob_offset = c.all.size();
                // The first prompt token with a score: one that has a token before it.
                const size_t scored_from = std::max<size_t>(1, prompts[p].first_echoed);
                if (score_prompt) {
                    c.prompt_logprobs = echoed_tokens(prompts[p]);
                    c.first_echoed = prompts[p].first_echoed;
                    if (scored_from >= ids.size()) release_echo(c);  // nothing to score
                } else if (r.echo) {
                    c.pending = c.all;
                }
                SequenceRequest q;
                q.prompt = ids;
                q.max_new_tokens = r.max_tokens;
                q.sampling = r.sampling;
                // As `tmx generate --seed`: the k-th copy of a prompt samples its own stream.
                q.stream_seed = generation_stream_seed(r.seed, ids, static_cast<int>(k));
                if (!r.ignore_eos)
                    for (int32_t id : {tokenizer.eos_id(), tokenizer.bos_id()})
                        if (id >= 0) q.end_ids.push_back(id);
                q.on_token = [this, job, i, lp = r.logprobs](int32_t token,
                                                             std::span<const float> logits) {
                    std::lock_guard<std::mutex> lock(job->mutex);
                    Choice& c = job->choices[i];
                    const auto now = std::chrono::steady_clock::now();
                    metrics.completion_tokens++;
                    (c.completion_tokens == 0 ? metrics.time_to_first_token
                                              : metrics.time_per_token)
                        .observe(std::chrono::duration<double>(
                                     now - (c.completion_tokens == 0 ? job->arrived : c.last_token))
                                     .count());
                    c.last_token = now;
                    ++c.completion_tokens;
                    if (lp >= 0) {
                        c.logprobs.push_back(token_logprob(tokenizer, token, logits, lp));
                        c.logprobs.back().text_offset = c.logprob_offset;
                        c.logprob_offset += c.logprobs.back().token.size();
                        c.pending_logprobs.push_back(c.logprobs.back());
                    }
                    if (tokenizer.is_control(token)) return false;
                    const bool stopped = c.text->push(token);
                    const std::string piece = c.text->take_final();
                    c.pending += piece;
                    c.all += piece;
                    job->changed.notify_all();
                    return stopped;
                };
                if (score_prompt && scored_from < ids.size())
                    q.on_prompt_logits = [this, job, i, scored_from, lp = r.logprobs, ids](
                                             int64_t position, std::span<const float> logits) {
                        // Position p's logits score prompt token p + 1 (the last position's,
                        // the first generated token: on_token's).
                        const size_t target = static_cast<size_t>(position) + 1;
                        if (target < scored_from || target >= ids.size()) return;
                        const serve::TokenLogprob scored =
                            token_logprob(tokenizer, ids[target], logits, lp);
                        std::lock_guard<std::mutex> lock(job->mutex);
                        Choice& c = job->choices[i];
                        serve::TokenLogprob& t = c.prompt_logprobs[target - c.first_echoed];
                        t.logprob = scored.logprob;
                        t.top = scored.top;
                        if (target + 1 == ids.size()) {
                            release_echo(c);
                            job->changed.notify_all();
                        }
                    };
                q.on_done = [job, i](TokenGeneration&& g) {
                    std::lock_guard<std::mutex> lock(job->mutex);
                    Choice& c = job->choices[i];
                    if (g.stop_reason == StopReason::Failed) c.error = g.error;
                    if (g.stop_reason != StopReason::Cancelled &&
                        g.stop_reason != StopReason::Failed) {
                        const std::string rest = c.text->finish();
                        c.pending += rest;
                        c.all += rest;
                    }
                    c.finish_reason = finish_reason(g.stop_reason);
                    c.done = true;
                    job->changed.notify_all();
                };
                requests.push_back(std::move(q));
            }
        }
        for (size_t i = 0; i < requests.size(); ++i) {
            std::optional<ServeLoop::Ticket> t;
            try {
                t = loop.submit(std::move(requests[i]));
            } catch (const Error& e) {
                cancel(*job);
                throw ApiError{400, e.what(), r.chat ? "messages" : "prompt", "", ""};
            }
            if (!t) {
                cancel(*job);
                if (const std::string failure = loop.failure(); !failure.empty())
                    throw ApiError{503, "the server's device failed: " + failure, "",
                                   "backend_error", "server_error"};
                throw ApiError{429, "the server's queue is full; retry shortly", "", "queue_full",
                               "rate_limit_error"};
            }
            std::lock_guard<std::mutex> lock(job->mutex);
            job->choices[i].ticket = *t;
        }
        return job;
    }

    void cancel(Job& job) {
        std::lock_guard<std::mutex> lock(job.mutex);
        for (const Choice& c : job.choices)
            if (c.ticket && !c.done) loop.cancel(c.ticket);
    }

    // The error of a job one of whose sequences failed (StopReason::Failed). The caller holds
    // job.mutex.
    static std::optional<ApiError> failed(const Job& job) {
        for (const Choice& c : job.choices)
            if (!c.error.empty())
                return ApiError{500, "generation failed: " + c.error, "", "backend_error",
                                "server_error"};
        return std::nullopt;
    }

    json usage(const Job& job) const {
        int64_t prompt = 0, completion = 0;
        for (size_t i = 0; i < job.choices.size(); ++i) {
            completion += job.choices[i].completion_tokens;
            prompt += job.choices[i].prompt_tokens;
        }
        return {{"prompt_tokens", prompt},
                {"completion_tokens", completion},
                {"total_tokens", prompt + completion}};
    }
};

// JSON text; bytes that are not UTF-8 (a client's stop string cut by nobody) become U+FFFD
// rather than an exception.
std::string dump(const json& j) {
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

void send_error(httplib::Response& res, const ApiError& e, serve::Metrics* metrics = nullptr) {
    if (metrics)
        metrics->count_request(e.status == 429   ? "queue_full"
                               : e.status >= 500 ? "server_error"
                                                 : "client_error");
    res.status = e.status;
    if (e.status == 429) res.set_header("Retry-After", "1");
    res.set_content(dump(e.body()), "application/json");
}

}  // namespace

void add_serve_command(CLI::App& app, CommonOptions& common) {
    struct Options {
        std::string model, host = "127.0.0.1", api_key, chat_template;
        int port = 8080;
        int64_t parallel = 4, queue = 64;
        int64_t max_body = 1 << 20;
        int64_t prefill_budget = 0;
        double shutdown_grace = 10, timeout = 30;
        serve::ApiLimits limits;
        BackendChoice backend;
        WeightsChoice weights;
    };
    auto o = std::make_shared<Options>();
    CLI::App* sub =
        app.add_subcommand("serve", "Serve a checkpoint over an OpenAI-compatible HTTP API");
    sub->add_option("--model", o->model, "Checkpoint directory")->required();
    sub->add_option("--host", o->host, "Address to listen on (loopback by default)")
        ->capture_default_str();
    sub->add_option("--port", o->port, "Port to listen on (0: any free port)")
        ->check(in_range(0, 65535))
        ->capture_default_str();
    sub->add_option("--parallel", o->parallel, "Sequences decoded together (KV-cache slots)")
        ->check(in_range<int64_t>(1, 256))
        ->capture_default_str();
    sub->add_option("--queue", o->queue, "Sequences that may wait for a slot; beyond: HTTP 429")
        ->check(in_range<int64_t>(0, 100000))
        ->capture_default_str();
    sub->add_option("--api-key", o->api_key,
                    "Require 'Authorization: Bearer KEY' (default: the TMX_API_KEY variable, "
                    "else none)");
    sub->add_option("--max-tokens-limit", o->limits.max_tokens,
                    "Largest max_tokens a request may ask for")
        ->check(in_range<int64_t>(1, 1 << 20))
        ->capture_default_str();
    sub->add_option("--max-body", o->max_body, "Largest request body in bytes")
        ->check(in_range<int64_t>(1024, int64_t{1} << 30))
        ->capture_default_str();
    sub->add_option("--chat-template", o->chat_template,
                    "Text file whose {{messages}} is replaced by the 'role: content' lines")
        ->check(CLI::ExistingFile);
    sub->add_option("--prefill-budget", o->prefill_budget,
                    "Prompt tokens prefilled between two decode steps: more gives new requests "
                    "their first token sooner, fewer keeps running streams' steps short "
                    "(default 0: the model's attention window)")
        ->check(in_range<int64_t>(0, int64_t{1} << 30));
    sub->add_option("--timeout", o->timeout,
                    "Seconds a connection may wait between two pieces of its request, or take "
                    "to accept the next piece of the response, before it is closed (a stream's "
                    "sequence is then cancelled); an idle connection closes after 5 s (or "
                    "--timeout rounded up, "
                    "when shorter)")
        ->check(CLI::Range(0.1, 3600.0))
        ->capture_default_str();
    sub->add_option("--shutdown-grace", o->shutdown_grace,
                    "Seconds running requests may finish after SIGINT/SIGTERM")
        ->check(CLI::Range(0.0, 3600.0))
        ->capture_default_str();
    add_backend_options(*sub, o->backend);
    add_weights_option(*sub, o->weights);
    add_common_options(*sub, common);
    sub->callback([o]() {
        if (o->api_key.empty())
            if (const char* k = std::getenv("TMX_API_KEY")) o->api_key = k;
        const std::string tok_path = checkpoint_tokenizer(o->model);
        load_checkpoint_config(o->model);
        if (tok_path.empty())
            throw Error(o->model + ": the checkpoint has no tokenizer.model, which serving needs");
        const Tokenizer tokenizer = Tokenizer::load(tok_path);
        if (tokenizer.bos_id() < 0) throw Error(tok_path + ": the tokenizer has no BOS token");
        const std::string chat_template =
            o->chat_template.empty() ? std::string() : read_file(o->chat_template);

        // SIGINT and SIGTERM go to a watcher thread (blocked here before any thread starts).
        sigset_t signals;
        sigemptyset(&signals);
        sigaddset(&signals, SIGINT);
        sigaddset(&signals, SIGTERM);
        pthread_sigmask(SIG_BLOCK, &signals, nullptr);

        auto backend = o->backend.open();
        auto model = o->weights.load(o->model, *backend);
        if (tokenizer.vocab_size() != model->config().vocab_size)
            throw Error(tok_path + ": " + std::to_string(tokenizer.vocab_size()) +
                        " pieces, but the model's vocab_size is " +
                        std::to_string(model->config().vocab_size));
        SchedulerOptions so;
        so.slots = o->parallel;
        const ModelConfig& mc = model->config();
        so.prefill_tokens_per_step = o->prefill_budget > 0   ? o->prefill_budget
                                     : mc.sliding_window > 0 ? mc.sliding_window
                                                             : mc.max_seq_len;
        httplib::Server http;
        ServeLoop loop(*model, so, o->queue, [&http](const std::string& why) {
            std::fprintf(stderr, "tmx serve: the backend failed %d steps in a row: %s\n",
                         ServeLoop::kMaxFailedSteps, why.c_str());
            http.stop();
        });
        Server srv{tokenizer,  loop,          std::filesystem::path(o->model).filename().string(),
                   o->api_key, chat_template, o->limits};
        if (srv.model_name.empty()) srv.model_name = "tmx";

        http.new_task_queue = [n = o->parallel + o->queue + 8] {
            return new HttpThreads(static_cast<size_t>(n));
        };
        http.set_payload_max_length(static_cast<size_t>(o->max_body));
        const auto timeout = std::chrono::duration_cast<std::chrono::microseconds>(
            std::chrono::duration<double>(o->timeout));
        http.set_read_timeout(timeout);
        http.set_write_timeout(timeout);
        // An idle keep-alive connection holds one of the HTTP threads: close it soon.
        http.set_keep_alive_timeout(
            static_cast<time_t>(std::clamp(std::ceil(o->timeout), 1.0, 5.0)));
        http.set_tcp_nodelay(true);  // SSE pieces are small: never wait for Nagle's 40 ms
        http.set_pre_routing_handler([&](const httplib::Request& req, httplib::Response& res) {
            const bool api = req.path.rfind("/v1/", 0) == 0 || req.path == "/tokenize" ||
                             req.path == "/detokenize";
            if (api && !srv.api_key.empty() &&
                req.get_header_value("Authorization") != "Bearer " + srv.api_key) {
                send_error(res, {401, "a valid API key is required (Authorization: Bearer KEY)", "",
                                 "invalid_api_key", "invalid_request_error"});
                return httplib::Server::HandlerResponse::Handled;
            }
            if (srv.draining && api) {
                send_error(
                    res, {503, "the server is shutting down", "", "shutting_down", "server_error"});
                return httplib::Server::HandlerResponse::Handled;
            }
            return httplib::Server::HandlerResponse::Unhandled;
        });
        http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
            if (!res.body.empty()) return;
            const int s = res.status;
            ApiError e{s,
                       s == 404   ? "unknown endpoint " + req.method + " " + req.path
                       : s == 413 ? "the request body is larger than the server takes (--max-body)"
                       : s == 405 ? "method not allowed"
                                  : "HTTP error " + std::to_string(s),
                       "", "", "invalid_request_error"};
            res.set_content(e.body().dump(), "application/json");
        });
        http.Get("/health", [&](const httplib::Request&, httplib::Response& res) {
            const std::string failure = loop.failure();
            res.status = failure.empty() ? 200 : 503;
            res.set_content(json{{"status", failure.empty() ? "ok" : "error"}}.dump(),
                            "application/json");
        });
        http.Get("/", [](const httplib::Request&, httplib::Response& res) {
            res.set_content(serve::kPlaygroundHtml, "text/html; charset=utf-8");
        });
        http.Get("/metrics", [&](const httplib::Request&, httplib::Response& res) {
            const ServeLoop::Stats st = loop.stats();
            res.set_content(srv.metrics.render(st.running, st.waiting, st.slots),
                            "text/plain; version=0.0.4");
        });
        http.Post("/tokenize", [&](const httplib::Request& req, httplib::Response& res) {
            try {
                const serve::TokenizeRequest r = serve::parse_tokenize_request(req.body);
                std::vector<int32_t> ids;
                if (r.add_special_tokens) ids.push_back(tokenizer.bos_id());
                const std::vector<int32_t> body = tokenizer.encode(r.prompt);
                ids.insert(ids.end(), body.begin(), body.end());
                res.set_content(json{{"tokens", ids}, {"count", ids.size()}}.dump(),
                                "application/json");
            } catch (const ApiError& e) {
                send_error(res, e);
            }
        });
        http.Post("/detokenize", [&](const httplib::Request& req, httplib::Response& res) {
            try {
                const std::vector<int32_t> ids = serve::parse_detokenize_request(req.body);
                check_in_vocabulary(tokenizer, ids, "tokens");
                res.set_content(dump(json{{"prompt", tokenizer.decode(ids)}}), "application/json");
            } catch (const ApiError& e) {
                send_error(res, e);
            }
        });
        http.Get("/v1/models", [&](const httplib::Request&, httplib::Response& res) {
            json m = {{"id", srv.model_name},
                      {"object", "model"},
                      {"created", unix_time()},
                      {"owned_by", "tmx"}};
            res.set_content(json{{"object", "list"}, {"data", {m}}}.dump(), "application/json");
        });
        auto completions = [&](bool chat) {
            return [&, chat](const httplib::Request& req, httplib::Response& res) {
                serve::CompletionRequest r;
                std::shared_ptr<Job> job;
                try {
                    r = serve::parse_completion_request(req.body, chat, srv.limits);
                    job = srv.start(r);
                } catch (const ApiError& e) {
                    send_error(res, e, &srv.metrics);
                    return;
                }
                const std::string id =
                    std::string(chat ? "chatcmpl-" : "cmpl-") + std::to_string(srv.next_id++);
                const int64_t created = unix_time();
                const std::string object = chat ? "chat.completion" : "text_completion";
                if (!r.stream) {
                    std::unique_lock<std::mutex> lock(job->mutex);
                    job->changed.wait(lock, [&] { return job->all_done(); });
                    if (const std::optional<ApiError> e = Server::failed(*job)) {
                        send_error(res, *e, &srv.metrics);
                        return;
                    }
                    bool cancelled = false;
                    for (const Choice& c : job->choices)
                        cancelled = cancelled || c.finish_reason == "cancelled";
                    if (cancelled) {
                        send_error(res,
                                   {503,
                                    "the request was cancelled (the server is shutting down "
                                    "or its device failed)",
                                    "", "cancelled", "server_error"},
                                   &srv.metrics);
                        return;
                    }
                    srv.metrics.count_request("ok");
                    json choices = json::array();
                    for (size_t i = 0; i < job->choices.size(); ++i) {
                        const Choice& c = job->choices[i];
                        json ch = {{"index", i}, {"finish_reason", c.finish_reason}};
                        if (chat)
                            ch["message"] = {{"role", "assistant"}, {"content", c.all}};
                        else
                            ch["text"] = c.all;
                        ch["logprobs"] = r.logprobs >= 0 ? serve::logprobs_json(c.logprobs, chat)
                                                         : json(nullptr);
                        choices.push_back(ch);
                    }
                    res.set_content(dump(json{{"id", id},
                                              {"object", object},
                                              {"created", created},
                                              {"model", srv.model_name},
                                              {"choices", choices},
                                              {"usage", srv.usage(*job)}}),
                                    "application/json");
                    return;
                }
                res.set_header("Cache-Control", "no-cache");
                res.set_chunked_content_provider(
                    "text/event-stream",
                    [&srv, job, id, created, chat, want_logprobs = r.logprobs >= 0,
                     stream_usage = r.stream_usage,
                     object = object + (chat ? ".chunk" : "")](size_t, httplib::DataSink& sink) {
                        auto send = [&](const json& j) {
                            const std::string line = "data: " + dump(j) + "\n\n";
                            return sink.write(line.data(), line.size());
                        };
                        std::vector<bool> announced(job->choices.size(), false),
                            finished(job->choices.size(), false);
                        while (true) {
                            std::vector<json> chunks;
                            bool all = false;
                            {
                                std::unique_lock<std::mutex> lock(job->mutex);
                                job->changed.wait_for(lock, std::chrono::milliseconds(500), [&] {
                                    for (size_t i = 0; i < job->choices.size(); ++i)
                                        if (!job->choices[i].pending.empty() ||
                                            (job->choices[i].done && !finished[i]))
                                            return true;
                                    return false;
                                });
                                for (size_t i = 0; i < job->choices.size(); ++i) {
                                    Choice& c = job->choices[i];
                                    if (c.pending.empty() && !(c.done && !finished[i])) continue;
                                    if (c.pending.empty() && !c.error.empty()) {
                                        finished[i] = true;  // its error event ends the stream
                                        continue;
                                    }
                                    json ch = {{"index", i}, {"finish_reason", nullptr}};
                                    if (chat) {
                                        ch["delta"] = json::object();
                                        if (!announced[i]) ch["delta"]["role"] = "assistant";
                                        if (!c.pending.empty()) ch["delta"]["content"] = c.pending;
                                    } else {
                                        ch["text"] = c.pending;
                                    }
                                    ch["logprobs"] = want_logprobs ? serve::logprobs_json(
                                                                         c.pending_logprobs, chat)
                                                                   : json(nullptr);
                                    c.pending_logprobs.clear();
                                    announced[i] = true;
                                    c.pending.clear();
                                    if (c.done) {
                                        // A failed choice has no OpenAI finish_reason: the
                                        // error event after it says what happened.
                                        if (c.error.empty()) ch["finish_reason"] = c.finish_reason;
                                        finished[i] = true;
                                    }
                                    chunks.push_back(ch);
                                }
                                all = job->all_done();
                            }
                            for (const json& ch : chunks) {
                                json body = {{"id", id},
                                             {"object", object},
                                             {"created", created},
                                             {"model", srv.model_name},
                                             {"choices", {ch}}};
                                if (stream_usage) body["usage"] = nullptr;
                                if (!send(body)) {  // the client left: free its slots
                                    srv.metrics.count_request("cancelled");
                                    srv.cancel(*job);
                                    return false;
                                }
                            }
                            if (!sink.is_writable()) {
                                srv.metrics.count_request("cancelled");
                                srv.cancel(*job);
                                return false;
                            }
                            if (all) {
                                bool cancelled = false;
                                std::optional<ApiError> failed;
                                {
                                    std::lock_guard<std::mutex> lock(job->mutex);
                                    for (const Choice& c : job->choices)
                                        cancelled = cancelled || c.finish_reason == "cancelled";
                                    failed = Server::failed(*job);
                                }
                                if (failed) {
                                    srv.metrics.count_request("server_error");
                                    send(failed->body());
                                } else {
                                    srv.metrics.count_request(cancelled ? "cancelled" : "ok");
                                    if (stream_usage && !cancelled) {
                                        std::lock_guard<std::mutex> lock(job->mutex);
                                        send({{"id", id},
                                              {"object", object},
                                              {"created", created},
                                              {"model", srv.model_name},
                                              {"choices", json::array()},
                                              {"usage", srv.usage(*job)}});
                                    }
                                }
                                if (cancelled && !failed)
                                    send(ApiError{500,
                                                  "the request was cancelled (the server is "
                                                  "shutting down or its device failed)",
                                                  "", "cancelled", "server_error"}
                                             .body());
                                const std::string done = "data: [DONE]\n\n";
                                sink.write(done.data(), done.size());
                                sink.done();
                                return true;
                            }
                        }
                    },
                    [&srv, job](bool success) {
                        if (!success) srv.cancel(*job);
                    });
            };
        };
        http.Post("/v1/completions", completions(false));
        http.Post("/v1/chat/completions", completions(true));

        // httplib's default socket options set SO_REUSEPORT (a second server on the same port
        // would share it silently instead of failing) and its listen backlog is 5 (a burst of
        // clients connecting at once waits out a 1 s SYN retransmission): take SO_REUSEADDR
        // alone, and listen again with a deep backlog once bound.
        int listen_fd = -1;
        http.set_socket_options([&listen_fd](socket_t sock) {
            int yes = 1;
            ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
            listen_fd = sock;  // the last socket made is the one that bound
        });
        int port = o->port;
        if (port == 0) {
            port = http.bind_to_any_port(o->host);
        } else if (!http.bind_to_port(o->host, port)) {
            port = -1;
        }
        if (port < 0)
            throw Error("--host " + o->host + " --port " + std::to_string(o->port) +
                        ": cannot listen there (in use, or not an address of this machine)");
        int listening = 0;
        socklen_t len = sizeof listening;
        if (listen_fd >= 0 &&
            ::getsockopt(listen_fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) == 0 && listening)
            ::listen(listen_fd, SOMAXCONN);
        std::fprintf(stderr,
                     "tmx serve: listening on http://%s:%d (model %s, backend %s, %s, %lld slots, "
                     "queue %lld, prefill %lld tokens per step%s)\n",
                     o->host.c_str(), port, o->model.c_str(), backend->name().c_str(),
                     to_string(backend->matmul_precision()), static_cast<long long>(o->parallel),
                     static_cast<long long>(o->queue),
                     static_cast<long long>(so.prefill_tokens_per_step),
                     o->api_key.empty() ? "" : ", API key required");
        std::fflush(stderr);

        std::atomic<bool> stopped{false};
        std::thread watcher([&] {
            int sig = 0;
            sigwait(&signals, &sig);
            if (stopped) return;
            std::fprintf(stderr, "tmx serve: %s: finishing running requests (at most %.0f s)\n",
                         sig == SIGINT ? "SIGINT" : "SIGTERM", o->shutdown_grace);
            srv.draining = true;
            const auto deadline =
                std::chrono::steady_clock::now() + std::chrono::duration<double>(o->shutdown_grace);
            while (std::chrono::steady_clock::now() < deadline) {
                const ServeLoop::Stats s = loop.stats();
                if (s.running == 0 && s.waiting == 0) break;
                std::this_thread::sleep_for(std::chrono::milliseconds(50));
            }
            loop.stop();  // cancels what is left: those streams end with an error event
            http.stop();
        });
        http.listen_after_bind();
        stopped = true;
        if (watcher.joinable()) {
            pthread_kill(watcher.native_handle(), SIGTERM);
            watcher.join();
        }
        loop.stop();
        if (const std::string failure = loop.failure(); !failure.empty())
            throw Error("tmx serve: stopped because the backend failed " +
                        std::to_string(ServeLoop::kMaxFailedSteps) + " steps in a row: " + failure);
        std::fprintf(stderr, "tmx serve: stopped\n");
    });
}

}  // namespace tmx::cli

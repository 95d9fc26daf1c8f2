// tmx serve: an OpenAI-compatible HTTP server on the engine's continuous batching
// (engine/infer/serve_loop.h). The HTTP server (apps/serve/http_server.h) reads every
// connection on one event-driven I/O thread and hands whole requests to handler threads, which
// stream their text; the engine's completion session (engine/infer/completion_session.h) turns
// them into sequences, which one engine thread runs on the model. Here: the flags, the listening
// socket, the connection limit and the signals; the routes are apps/serve/routes.h, the request
// and response bodies apps/serve/openai_api.h.
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <thread>

#include "apps/commands.h"
#include "apps/serve/http_server.h"
#include "apps/serve/openai_api.h"
#include "apps/serve/routes.h"
#include "engine/core/errors.h"
#include "engine/core/file_io.h"
#include "engine/data/tokenizer.h"
#include "engine/infer/completion_session.h"
#include "engine/infer/serve_loop.h"
#include "engine/model/checkpoint.h"

namespace tmx::cli {

namespace {

// The HTTP threads (the I/O thread and the handlers) run below the engine thread's priority
// (nice + 5): the engine thread is the server's throughput, and where the cores are busy
// (clients on the same machine, more connections than cores) a streaming thread woken for each
// token would otherwise take the engine's core from it mid-step. Relative to the thread's own
// niceness (a server started with nice 10 must not have threads raised to 5); best effort: one
// that cannot be lowered serves as it is.
void lower_this_thread_priority() {
    const auto tid = static_cast<id_t>(::gettid());
    errno = 0;
    const int now = ::getpriority(PRIO_PROCESS, tid);
    if (errno == 0) ::setpriority(PRIO_PROCESS, tid, now + 5);
}

// File descriptors kept for everything but connections (the listening socket, the event loop's,
// the model's files, the engine's libraries), with room to accept and refuse one more.
constexpr rlim_t kReservedFiles = 64;

// Raises the soft limit on open files to the hard one and returns the connections that fit
// under it: `wanted`, or fewer (said on stderr).
int64_t connections_within_file_limit(int64_t wanted) {
    rlimit files{};
    if (::getrlimit(RLIMIT_NOFILE, &files) != 0) return wanted;
    if (files.rlim_cur < files.rlim_max) {
        rlimit raised = files;
        raised.rlim_cur = files.rlim_max;
        if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) files = raised;
    }
    if (files.rlim_cur == RLIM_INFINITY ||
        files.rlim_cur >= static_cast<rlim_t>(wanted) + kReservedFiles)
        return wanted;
    const int64_t fit = std::max<int64_t>(
        1, static_cast<int64_t>(files.rlim_cur) - static_cast<int64_t>(kReservedFiles));
    std::fprintf(stderr,
                 "tmx serve: --max-connections %lld lowered to %lld: the process may open %llu "
                 "files (RLIMIT_NOFILE; raise it with ulimit -n)\n",
                 static_cast<long long>(wanted), static_cast<long long>(fit),
                 static_cast<unsigned long long>(files.rlim_cur));
    return fit;
}

// Binds the server to host:port (0: any free port) and returns the port bound.
int bind_listening_socket(serve::HttpServer& http, const std::string& host, int requested_port) {
    const int port = http.listen(host, requested_port);
    if (port < 0)
        throw Error("--host " + host + " --port " + std::to_string(requested_port) +
                    ": cannot listen there (in use, or not an address of this machine)");
    return port;
}

}  // namespace

void add_serve_command(CLI::App& app, CommonOptions& common) {
    struct Options {
        std::string model, host = "127.0.0.1", api_key, chat_template;
        int port = 8080;
        int64_t parallel = 4, queue = 64;
        int64_t max_body = 1 << 20;
        int64_t prefill_budget = 0;
        int64_t max_connections = 1024;
        double shutdown_grace = 10, timeout = 30, request_timeout = 10;
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
                    "Jinja chat template file to use instead of the model's own (its "
                    "tokenizer_config.json's chat_template)")
        ->check(CLI::ExistingFile);
    sub->add_option("--prefill-budget", o->prefill_budget,
                    "Prompt tokens prefilled between two decode steps: more gives new requests "
                    "their first token sooner, fewer keeps running streams' steps short "
                    "(default 0: the model's attention window)")
        ->check(in_range<int64_t>(0, int64_t{1} << 30));
    sub->add_option("--timeout", o->timeout,
                    "Seconds a client may take to accept the next piece of a response before "
                    "its connection is closed (a stream's sequence is then cancelled); an idle "
                    "connection closes after 5 s (or --timeout rounded up, when shorter)")
        ->check(CLI::Range(0.1, 3600.0))
        ->capture_default_str();
    sub->add_option("--request-timeout", o->request_timeout,
                    "Seconds from a request's first byte to its last (line, headers and body); "
                    "a request slower than that is answered 408 and its connection closed")
        ->check(CLI::Range(0.1, 3600.0))
        ->capture_default_str();
    sub->add_option("--max-connections", o->max_connections,
                    "Connections open at once (idle ones included); one more is answered 503 "
                    "and closed at once. Lowered to what the open-files limit allows")
        ->check(in_range<int64_t>(1, 1000000))
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
            throw Error(o->model +
                        ": the checkpoint has no tokenizer.model or tokenizer.json, "
                        "which serving needs");
        const Tokenizer tokenizer = Tokenizer::load(tok_path);
        ChatPrompt chat = ChatPrompt::for_tokenizer(tokenizer, tok_path, o->chat_template);
        std::fprintf(stderr, "chat template: %s\n", chat.source().c_str());

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
        so.prefill_tokens_per_step = serving_prefill_budget(model->config(), o->prefill_budget);
        serve::HttpServerOptions http_options;
        http_options.handler_threads = static_cast<size_t>(o->parallel + o->queue + 8);
        http_options.max_connections =
            static_cast<size_t>(connections_within_file_limit(o->max_connections));
        http_options.max_body_bytes = static_cast<size_t>(o->max_body);
        http_options.request_timeout_s = o->request_timeout;
        http_options.write_timeout_s = o->timeout;
        // An idle keep-alive connection costs little now, but a client that has gone quiet
        // should not hold one of --max-connections for long.
        http_options.idle_timeout_s = std::clamp(std::ceil(o->timeout), 1.0, 5.0);
        http_options.on_thread_start = lower_this_thread_priority;
        serve::HttpServer http(http_options);
        ServeLoop loop(*model, so, o->queue, [&http](const std::string& why) {
            std::fprintf(stderr, "tmx serve: the backend failed %d steps in a row: %s\n",
                         ServeLoop::kMaxFailedSteps, why.c_str());
            http.stop();
        });
        std::string model_name = std::filesystem::path(o->model).filename().string();
        if (model_name.empty()) model_name = "tmx";
        serve::Server srv(tokenizer, loop, model_name, o->api_key, std::move(chat), o->limits);

        serve::add_routes(http, srv);

        const int port = bind_listening_socket(http, o->host, o->port);
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
        http.run();
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

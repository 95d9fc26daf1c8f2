// tmx serve: an OpenAI-compatible HTTP server (cpp-httplib, the HTTP library llama.cpp's server
// uses, packaged by Debian) on the engine's continuous batching (engine/infer/serve_loop.h).
// HTTP threads parse requests and stream their text; the engine's completion session
// (engine/infer/completion_session.h) turns them into sequences, which one engine thread runs
// on the model. Here: the flags, the listening socket and the signals; the routes are
// apps/serve/routes.h, the request and response bodies apps/serve/openai_api.h.
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
#include <cstdio>
#include <filesystem>
#include <memory>
#include <thread>

#include "apps/commands.h"
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

// Binds the server to host:port (0: any free port) and returns the port bound.
// httplib's default socket options set SO_REUSEPORT (a second server on the same port would
// share it silently instead of failing) and its listen backlog is 5 (a burst of clients
// connecting at once waits out a 1 s SYN retransmission): take SO_REUSEADDR alone, and listen
// again with a deep backlog once bound.
int bind_listening_socket(httplib::Server& http, const std::string& host, int requested_port) {
    // Shared with the callback, which the server keeps.
    auto listen_fd = std::make_shared<socket_t>(-1);
    http.set_socket_options([listen_fd](socket_t sock) {
        int yes = 1;
        ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
        *listen_fd = sock;  // the last socket made is the one that bound
    });
    int port = requested_port;
    if (port == 0) {
        port = http.bind_to_any_port(host);
    } else if (!http.bind_to_port(host, port)) {
        port = -1;
    }
    if (port < 0)
        throw Error("--host " + host + " --port " + std::to_string(requested_port) +
                    ": cannot listen there (in use, or not an address of this machine)");
    int listening = 0;
    socklen_t len = sizeof listening;
    if (*listen_fd >= 0 &&
        ::getsockopt(*listen_fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) == 0 && listening)
        ::listen(*listen_fd, SOMAXCONN);
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
                    "Jinja chat template file to use instead of the model's own (its "
                    "tokenizer_config.json's chat_template)")
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
        httplib::Server http;
        ServeLoop loop(*model, so, o->queue, [&http](const std::string& why) {
            std::fprintf(stderr, "tmx serve: the backend failed %d steps in a row: %s\n",
                         ServeLoop::kMaxFailedSteps, why.c_str());
            http.stop();
        });
        std::string model_name = std::filesystem::path(o->model).filename().string();
        if (model_name.empty()) model_name = "tmx";
        serve::Server srv(tokenizer, loop, model_name, o->api_key, std::move(chat), o->limits);

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

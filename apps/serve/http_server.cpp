// One I/O thread runs an Asio event loop over the listening socket and every connection; each
// connection is a small state machine (idle, reading a request, handled, lingering, closed)
// whose reads, deadlines and writes are callbacks on that thread, so no lock guards its state.
// Beast's parser reads requests as bytes arrive; a request read whole goes to the handler pool.
// A handler's response is written by the I/O thread; a streamed one piece by piece, its handler
// waiting for each piece to be written (a slow client slows its own stream, nothing else).
#include "apps/serve/http_server.h"

// Beast's string_view as std::string_view (only this file includes Beast).
#define BOOST_BEAST_USE_STD_STRING_VIEW 1

#include <poll.h>

#include <algorithm>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/status.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <unordered_set>

namespace tmx::serve {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;
using boost::system::error_code;
using Clock = std::chrono::steady_clock;

namespace {

bool iequals(std::string_view a, std::string_view b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
               return std::tolower(static_cast<unsigned char>(x)) ==
                      std::tolower(static_cast<unsigned char>(y));
           });
}

Clock::duration seconds(double s) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

// A request body that grows with the bytes that arrive. Beast's string_body reserves the whole
// Content-Length at once: a client that announces --max-body bytes and stalls would hold them.
struct GrowingBody {
    using value_type = std::string;
    class reader {
      public:
        template <bool isRequest, class Fields>
        reader(http::header<isRequest, Fields>&, value_type& body) : body_(body) {}
        void init(const boost::optional<std::uint64_t>&, error_code& ec) { ec = {}; }
        template <class ConstBufferSequence>
        size_t put(const ConstBufferSequence& buffers, error_code& ec) {
            const size_t n = asio::buffer_size(buffers);
            const size_t at = body_.size();
            body_.resize(at + n);  // geometric growth: at most twice what arrived
            asio::buffer_copy(asio::buffer(body_.data() + at, n), buffers);
            ec = {};
            return n;
        }
        void finish(error_code& ec) { ec = {}; }

      private:
        value_type& body_;
    };
};
using RequestParser = http::request_parser<GrowingBody>;

// A response's status line and headers; `content_length` absent: the body is chunked (HTTP/1.1)
// or ends with the connection (HTTP/1.0).
std::string response_head(const HttpResponse& res, bool keep_alive, bool http10,
                          std::optional<size_t> content_length) {
    const http::status status = http::int_to_status(static_cast<unsigned>(res.status));
    const std::string_view reason =
        status == http::status::unknown ? "Unknown" : http::obsolete_reason(status);
    std::string head =
        "HTTP/1.1 " + std::to_string(res.status) + " " + std::string(reason) + "\r\n";
    for (const auto& [name, value] : res.headers) head += name + ": " + value + "\r\n";
    if (!res.content_type.empty()) head += "Content-Type: " + res.content_type + "\r\n";
    if (content_length)
        head += "Content-Length: " + std::to_string(*content_length) + "\r\n";
    else if (!http10)
        head += "Transfer-Encoding: chunked\r\n";
    if (!keep_alive)
        head += "Connection: close\r\n";
    else if (http10)
        head += "Connection: keep-alive\r\n";
    return head + "\r\n";
}

std::string chunk(std::string_view data) {
    char size[32];
    std::snprintf(size, sizeof size, "%zx\r\n", data.size());
    std::string out = size;
    out.append(data);
    out += "\r\n";
    return out;
}

}  // namespace

std::string HttpRequest::header(std::string_view name) const {
    for (const auto& [n, v] : headers)
        if (iequals(n, name)) return v;
    return "";
}

void HttpResponse::set_header(std::string name, std::string value) {
    headers.emplace_back(std::move(name), std::move(value));
}

void HttpResponse::set_content(std::string content, std::string type) {
    body = std::move(content);
    content_type = std::move(type);
}

class Connection;

class HttpServer::Impl {
  public:
    Impl(HttpServer& owner, HttpServerOptions options)
        : owner_(owner), options_(std::move(options)) {}

    int listen(const std::string& host, int port);
    void run();
    void stop();

    // I/O thread.
    void accept();
    void refuse(tcp::socket socket);
    void closed(Connection* c);
    bool stopping() const { return stopping_; }
    // A response the server makes itself, with the error handler's body.
    HttpResponse error_response(int status, const HttpRequest& request) const;

    // Handler threads.
    void submit(std::function<void()> task);
    void respond(const HttpRequest& request, HttpResponse& response) const;

    HttpServer& owner_;
    const HttpServerOptions options_;
    asio::io_context io_{1};
    tcp::acceptor acceptor_{io_};
    asio::steady_timer accept_retry_{io_};
    std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work_;
    std::unordered_set<Connection*> connections_;  // open ones
    bool stopping_ = false;                        // I/O thread's view

    std::map<std::pair<std::string, std::string>, HttpHandler> routes_;  // (method, path)
    std::set<std::string> paths_;
    std::function<bool(const HttpRequest&, HttpResponse&)> pre_routing_;
    std::function<void(const HttpRequest&, HttpResponse&)> error_handler_;

    std::mutex tasks_mutex_;
    std::condition_variable tasks_changed_;
    std::deque<std::function<void()>> tasks_;
    bool tasks_closed_ = false;
};

// One client connection. Everything but the handler's writes (write_and_wait, the mutex's part)
// runs on the I/O thread.
class Connection : public std::enable_shared_from_this<Connection> {
  public:
    Connection(HttpServer::Impl& server, tcp::socket socket)
        : server_(server),
          options_(server.options_),
          socket_(std::move(socket)),
          deadline_(server.io_),
          write_deadline_(server.io_) {}

    void start() {
        error_code ec;
        socket_.set_option(tcp::no_delay(true), ec);  // SSE pieces are small: no Nagle wait
        socket_.non_blocking(true, ec);
        become_idle();
    }

    // The server is stopping: a connection not being answered closes now.
    void close_if_waiting() {
        if (state_ == State::Idle || state_ == State::Reading) close();
    }

    // Handler threads: sends `bytes` and waits until written; false when the connection has
    // failed or closed.
    bool write_and_wait(std::string bytes) {
        std::unique_lock<std::mutex> lock(mutex_);
        if (closed_ || write_failed_) return false;
        handler_write_ = HandlerWrite::Pending;
        lock.unlock();
        asio::post(server_.io_, [self = shared_from_this(), bytes = std::move(bytes)]() mutable {
            self->queue_write(std::move(bytes), [self](bool ok) { self->handler_write_done(ok); });
        });
        lock.lock();
        handler_written_.wait(lock, [&] { return handler_write_ != HandlerWrite::Pending; });
        return handler_write_ == HandlerWrite::Done;
    }
    bool peer_open() const {
        std::lock_guard<std::mutex> lock(mutex_);
        return !closed_ && !write_failed_ && !peer_gone_;
    }

  private:
    enum class State {
        Idle,       // waiting for a request's first byte (idle timeout)
        Reading,    // reading a request (its deadline from the first byte)
        Handled,    // a handler has the request; its response is being written
        Lingering,  // answered, our side shut: reading and dropping until the client closes
        Closed,
    };
    enum class HandlerWrite { None, Pending, Done, Failed };
    struct PendingWrite {
        std::string bytes;
        size_t sent = 0;
        std::function<void(bool)> done;
    };

    // --- Reading ---------------------------------------------------------------------------

    void become_idle() {
        state_ = State::Idle;
        if (buffer_.size() == 0) buffer_.shrink_to_fit();  // an idle connection holds no buffer
        set_deadline(Clock::now() + seconds(options_.idle_timeout_s));
        if (buffer_.size() > 0) {  // the client sent its next request already (pipelining)
            begin_request();
            parse();
        } else {
            wait_readable();
        }
    }

    // One wait for readability at a time; what it means depends on the state when it fires.
    void wait_readable() {
        if (read_wait_pending_ || state_ == State::Closed) return;
        read_wait_pending_ = true;
        // Asio's epoll is edge-triggered and its waits are not tried first: bytes (or the end)
        // already there, whose edge has passed (a read that left some, a pipelined request seen
        // while handling), would never wake the wait.
        pollfd ready{socket_.native_handle(), POLLIN, 0};
        if (::poll(&ready, 1, 0) > 0) {
            asio::post(server_.io_, [self = shared_from_this()] {
                self->read_wait_pending_ = false;
                self->on_readable({});
            });
            return;
        }
        socket_.async_wait(tcp::socket::wait_read, [self = shared_from_this()](error_code ec) {
            self->read_wait_pending_ = false;
            self->on_readable(ec);
        });
    }

    void on_readable(error_code ec) {
        if (state_ == State::Closed) return;
        if (ec) return close();
        switch (state_) {
            case State::Idle:
            case State::Reading:
                return read_request_bytes();
            case State::Handled:
                return watch_peer();
            case State::Lingering:
                return drain();
            case State::Closed:
                return;
        }
    }

    void read_request_bytes() {
        error_code ec;
        const size_t available = socket_.available(ec);
        const size_t want = std::clamp<size_t>(available, 1024, 64 * 1024);
        const size_t n = socket_.read_some(buffer_.prepare(want), ec);
        if (ec == asio::error::would_block || ec == asio::error::try_again) return wait_readable();
        if (ec) return close();  // the client closed (a request cut short is dropped)
        buffer_.commit(n);
        if (state_ == State::Idle) begin_request();
        parse();
    }

    // A request's first bytes: its deadline starts.
    void begin_request() {
        state_ = State::Reading;
        parser_.emplace();
        parser_->header_limit(static_cast<std::uint32_t>(options_.max_head_bytes));
        parser_->body_limit(static_cast<std::uint64_t>(options_.max_body_bytes));
        parser_->eager(true);
        continue_answered_ = false;
        set_deadline(Clock::now() + seconds(options_.request_timeout_s));
    }

    void parse() {
        while (!parser_->is_done() && buffer_.size() > 0) {
            error_code ec;
            const size_t n = parser_->put(buffer_.data(), ec);
            buffer_.consume(n);
            if (ec == http::error::need_more) break;
            if (ec) return refuse_request(ec);
            if (parser_->is_header_done() && !continue_answered_) {
                continue_answered_ = true;
                // The client waits for this before sending its body (Content-Length was
                // checked against --max-body already).
                if (!parser_->is_done() && parser_->get().version() == 11 &&
                    iequals(parser_->get()[http::field::expect], "100-continue"))
                    queue_write("HTTP/1.1 100 Continue\r\n\r\n", [](bool) {});
            }
            if (n == 0) break;
        }
        if (parser_->is_done()) return dispatch();
        wait_readable();
    }

    // What Beast could not take: 431 (head too large), 413 (body over --max-body), else 400.
    void refuse_request(error_code ec) {
        const int status = ec == http::error::header_limit ? 431
                           : ec == http::error::body_limit ? 413
                                                           : 400;
        answer_and_close(server_.error_response(status, partial_request()));
    }

    HttpRequest partial_request() const {
        HttpRequest r;
        if (parser_ && parser_->is_header_done()) {
            r.method = std::string(parser_->get().method_string());
            r.path = std::string(parser_->get().target());
            r.path = r.path.substr(0, r.path.find('?'));
        }
        return r;
    }

    // The request is whole: to a handler. Meanwhile the socket is watched for the client
    // leaving (a stream then stops; other handlers see it through HttpRequest::client_gone).
    void dispatch() {
        clear_deadline();
        state_ = State::Handled;
        auto& message = parser_->get();
        auto request = std::make_shared<HttpRequest>();
        request->method = std::string(message.method_string());
        const std::string_view target = message.target();
        const size_t q = target.find('?');
        request->path = std::string(target.substr(0, q));
        if (q != std::string_view::npos) request->query = std::string(target.substr(q + 1));
        for (const auto& field : message)
            request->headers.emplace_back(std::string(field.name_string()),
                                          std::string(field.value()));
        request->body = std::move(message.body());
        request->client_gone = [weak = weak_from_this()] {
            const std::shared_ptr<Connection> c = weak.lock();
            return !c || !c->peer_open();
        };
        if (buffer_.size() == 0) buffer_.shrink_to_fit();
        const bool http10 = message.version() == 10;
        const bool keep_alive = message.keep_alive() && !server_.stopping() &&
                                ++requests_ < options_.max_requests_per_connection;
        parser_.reset();
        wait_readable();
        server_.submit([self = shared_from_this(), request, http10, keep_alive] {
            self->handle(*request, http10, keep_alive);
        });
    }

    // Handled: readable means the client sent more (the next request, read after this one's
    // answer) or left.
    void watch_peer() {
        char byte;
        error_code ec;
        const size_t n = socket_.receive(asio::buffer(&byte, 1), tcp::socket::message_peek, ec);
        if (ec == asio::error::would_block || ec == asio::error::try_again) return wait_readable();
        if (ec || n == 0) {
            std::lock_guard<std::mutex> lock(mutex_);
            peer_gone_ = true;
        }
    }

    // --- Handling (handler threads) --------------------------------------------------------

    void handle(const HttpRequest& request, bool http10, bool keep_alive) {
        HttpResponse response;
        server_.respond(request, response);
        if (!response.stream) {
            const bool head = request.method == "HEAD";
            std::string bytes = response_head(response, keep_alive, http10, response.body.size());
            if (!head) bytes += response.body;
            asio::post(server_.io_,
                       [self = shared_from_this(), bytes = std::move(bytes), keep_alive]() mutable {
                           self->queue_write(std::move(bytes), [self, keep_alive](bool ok) {
                               self->answered(ok && keep_alive);
                           });
                       });
            return;
        }
        // Streamed: chunked, or over HTTP/1.0 until the connection closes.
        const bool keep = keep_alive && !http10;
        class Stream : public ResponseStream {
          public:
            Stream(Connection& c, bool chunked) : c_(c), chunked_(chunked) {}
            bool write(std::string_view data) override {
                if (data.empty()) return is_writable();
                return c_.write_and_wait(chunked_ ? chunk(data) : std::string(data));
            }
            bool is_writable() const override { return c_.peer_open(); }

          private:
            Connection& c_;
            bool chunked_;
        } stream(*this, !http10);
        // Called even when the head could not be written: the stream finds the client gone
        // and gives up (cancelling its work) in one place.
        write_and_wait(response_head(response, keep, http10, std::nullopt));
        bool ok = false;
        try {
            ok = response.stream(stream);
        } catch (const std::exception&) {
        }
        if (ok && !http10) ok = write_and_wait("0\r\n\r\n");
        asio::post(server_.io_,
                   [self = shared_from_this(), keep = ok && keep] { self->answered(keep); });
    }

    // The response is out (or failed): the next request, or close.
    void answered(bool keep_alive) {
        if (state_ == State::Closed) return;
        bool gone;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            gone = peer_gone_;
        }
        if (keep_alive && !gone && !server_.stopping())
            become_idle();
        else
            close_after_writes();
    }

    // --- Writing ---------------------------------------------------------------------------

    void queue_write(std::string bytes, std::function<void(bool)> done) {
        if (state_ == State::Closed) return done(false);
        writes_.push_back({std::move(bytes), 0, std::move(done)});
        if (!writing_) write_next();
    }

    // One write_some at a time, each within --timeout: a client that takes nothing for that
    // long is closed.
    void write_next() {
        writing_ = true;
        PendingWrite& w = writes_.front();
        ++write_deadline_gen_;
        write_deadline_.expires_after(seconds(options_.write_timeout_s));
        write_deadline_.async_wait(
            [self = shared_from_this(), gen = write_deadline_gen_](error_code ec) {
                if (!ec && gen == self->write_deadline_gen_) self->close();
            });
        socket_.async_write_some(
            asio::buffer(w.bytes.data() + w.sent, w.bytes.size() - w.sent),
            [self = shared_from_this()](error_code ec, size_t n) { self->written(ec, n); });
    }

    void written(error_code ec, size_t n) {
        writing_ = false;
        ++write_deadline_gen_;
        write_deadline_.cancel();
        if (ec || state_ == State::Closed) {
            close();
            fail_writes();
            return;
        }
        PendingWrite& w = writes_.front();
        w.sent += n;
        if (w.sent < w.bytes.size()) return write_next();
        std::function<void(bool)> done = std::move(w.done);
        writes_.pop_front();
        if (!writes_.empty()) write_next();
        done(true);
    }

    void fail_writes() {
        std::deque<PendingWrite> failed;
        failed.swap(writes_);
        for (PendingWrite& w : failed) w.done(false);
    }

    void handler_write_done(bool ok) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!ok) write_failed_ = true;
        if (handler_write_ == HandlerWrite::Pending)
            handler_write_ = ok ? HandlerWrite::Done : HandlerWrite::Failed;
        handler_written_.notify_all();
    }

    // --- Deadlines and closing -------------------------------------------------------------

    void set_deadline(Clock::time_point at) {
        ++deadline_gen_;
        deadline_.expires_at(at);
        deadline_.async_wait([self = shared_from_this(), gen = deadline_gen_](error_code ec) {
            if (!ec && gen == self->deadline_gen_) self->deadline_passed();
        });
    }
    void clear_deadline() {
        ++deadline_gen_;
        deadline_.cancel();
    }

    void deadline_passed() {
        if (state_ == State::Reading && !writing_) {
            // Best effort, without waiting: a client this slow may not read it either.
            const std::string bytes =
                serialize_closing(server_.error_response(408, partial_request()));
            error_code ec;
            socket_.write_some(asio::buffer(bytes), ec);
            return lingering_close();
        }
        close();  // idle too long, or lingering long enough
    }

    static std::string serialize_closing(const HttpResponse& res) {
        return response_head(res, false, false, res.body.size()) + res.body;
    }

    // An error the server answers itself: the response, then the connection closes (the rest
    // of the request is read and dropped meanwhile, so the client sees the answer rather than
    // a reset).
    void answer_and_close(const HttpResponse& res) {
        clear_deadline();
        state_ = State::Handled;
        parser_.reset();
        queue_write(serialize_closing(res), [self = shared_from_this()](bool ok) {
            if (ok)
                self->lingering_close();
            else
                self->close();
        });
    }

    void close_after_writes() {
        if (writes_.empty()) return lingering_close();
        writes_.back().done = [self = shared_from_this(),
                               then = std::move(writes_.back().done)](bool ok) {
            then(ok);
            self->lingering_close();
        };
    }

    // Our side shut (the client reads the end of the answer), then what the client still sends
    // is dropped until it closes, for at most a second.
    void lingering_close() {
        if (state_ == State::Closed) return;
        state_ = State::Lingering;
        error_code ec;
        socket_.shutdown(tcp::socket::shutdown_send, ec);
        if (ec) return close();
        set_deadline(Clock::now() + std::chrono::seconds(1));
        drain();
    }

    void drain() {
        char sink[4096];
        for (int i = 0; i < 16; ++i) {
            error_code ec;
            socket_.read_some(asio::buffer(sink), ec);
            if (ec == asio::error::would_block || ec == asio::error::try_again)
                return wait_readable();
            if (ec) return close();
        }
        wait_readable();
    }

  public:
    void close() {
        if (state_ == State::Closed) return;
        state_ = State::Closed;
        error_code ec;
        socket_.close(ec);
        deadline_.cancel();
        write_deadline_.cancel();
        {
            std::lock_guard<std::mutex> lock(mutex_);
            closed_ = true;
            if (handler_write_ == HandlerWrite::Pending) handler_write_ = HandlerWrite::Failed;
            handler_written_.notify_all();
        }
        if (!writing_) fail_writes();  // an in-flight write fails in written()
        server_.closed(this);
    }

  private:
    HttpServer::Impl& server_;
    const HttpServerOptions& options_;
    tcp::socket socket_;
    asio::steady_timer deadline_;        // idle, request, or lingering
    asio::steady_timer write_deadline_;  // the write in flight
    uint64_t deadline_gen_ = 0, write_deadline_gen_ = 0;
    State state_ = State::Idle;
    boost::beast::flat_buffer buffer_;
    std::optional<RequestParser> parser_;
    bool continue_answered_ = false;
    bool read_wait_pending_ = false;
    bool writing_ = false;
    std::deque<PendingWrite> writes_;
    size_t requests_ = 0;

    // Shared with the handler's thread.
    mutable std::mutex mutex_;
    std::condition_variable handler_written_;
    HandlerWrite handler_write_ = HandlerWrite::None;
    bool closed_ = false, write_failed_ = false, peer_gone_ = false;
};

// --- The server ----------------------------------------------------------------------------

int HttpServer::Impl::listen(const std::string& host, int port) {
    error_code ec;
    tcp::resolver resolver(io_);
    const auto endpoints = resolver.resolve(
        host, std::to_string(port), tcp::resolver::passive | tcp::resolver::numeric_service, ec);
    if (ec) return -1;
    for (const auto& entry : endpoints) {
        acceptor_.open(entry.endpoint().protocol(), ec);
        if (ec) continue;
        acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
        acceptor_.bind(entry.endpoint(), ec);
        if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
        if (!ec) return acceptor_.local_endpoint().port();
        acceptor_.close();
    }
    return -1;
}

void HttpServer::Impl::accept() {
    acceptor_.async_accept([this](error_code ec, tcp::socket socket) {
        if (stopping_) return;
        if (ec) {
            if (ec == asio::error::operation_aborted) return;
            // Out of file descriptors (or another passing failure): retry shortly rather
            // than spin.
            accept_retry_.expires_after(std::chrono::milliseconds(50));
            accept_retry_.async_wait([this](error_code e) {
                if (!e && !stopping_) accept();
            });
            return;
        }
        if (connections_.size() >= options_.max_connections) {
            refuse(std::move(socket));
        } else {
            auto c = std::make_shared<Connection>(*this, std::move(socket));
            connections_.insert(c.get());
            owner_.open_connections_ = static_cast<int64_t>(connections_.size());
            c->start();
        }
        accept();
    });
}

// Over --max-connections: a 503 if the socket takes it at once, then closed, nothing read.
void HttpServer::Impl::refuse(tcp::socket socket) {
    owner_.refused_connections_++;
    HttpResponse res = error_response(503, HttpRequest{});
    res.set_header("Retry-After", "1");
    const std::string bytes = response_head(res, false, false, res.body.size()) + res.body;
    error_code ec;
    socket.non_blocking(true, ec);
    socket.write_some(asio::buffer(bytes), ec);
    socket.shutdown(tcp::socket::shutdown_send, ec);
    socket.close(ec);
}

void HttpServer::Impl::closed(Connection* c) {
    connections_.erase(c);
    owner_.open_connections_ = static_cast<int64_t>(connections_.size());
    if (stopping_ && connections_.empty()) work_.reset();
}

HttpResponse HttpServer::Impl::error_response(int status, const HttpRequest& request) const {
    HttpResponse res;
    res.status = status;
    if (error_handler_) error_handler_(request, res);
    return res;
}

void HttpServer::Impl::submit(std::function<void()> task) {
    {
        std::lock_guard<std::mutex> lock(tasks_mutex_);
        tasks_.push_back(std::move(task));
    }
    tasks_changed_.notify_one();
}

void HttpServer::Impl::respond(const HttpRequest& request, HttpResponse& response) const {
    try {
        if (pre_routing_ && pre_routing_(request, response)) return;
        const std::string& method = request.method == "HEAD" ? "GET" : request.method;
        if (const auto it = routes_.find({method, request.path}); it != routes_.end()) {
            it->second(request, response);
        } else if (paths_.count(request.path)) {
            response.status = 405;
            std::string allow;
            for (const auto& [key, handler] : routes_)
                if (key.second == request.path) allow += (allow.empty() ? "" : ", ") + key.first;
            response.set_header("Allow", allow);
        } else {
            response.status = 404;
        }
    } catch (const std::exception&) {
        response = HttpResponse{};
        response.status = 500;
    }
    if (response.status >= 400 && !response.stream && error_handler_)
        error_handler_(request, response);
}

void HttpServer::Impl::run() {
    work_.emplace(io_.get_executor());
    std::vector<std::thread> handlers;
    for (size_t i = 0; i < options_.handler_threads; ++i)
        handlers.emplace_back([this] {
            if (options_.on_thread_start) options_.on_thread_start();
            while (true) {
                std::function<void()> task;
                {
                    std::unique_lock<std::mutex> lock(tasks_mutex_);
                    tasks_changed_.wait(lock, [&] { return tasks_closed_ || !tasks_.empty(); });
                    if (tasks_.empty()) return;
                    task = std::move(tasks_.front());
                    tasks_.pop_front();
                }
                task();
            }
        });
    std::thread io_thread([this] {
        if (options_.on_thread_start) options_.on_thread_start();
        accept();
        io_.run();
    });
    io_thread.join();
    {
        std::lock_guard<std::mutex> lock(tasks_mutex_);
        tasks_closed_ = true;
    }
    tasks_changed_.notify_all();
    for (std::thread& t : handlers) t.join();
}

void HttpServer::Impl::stop() {
    asio::post(io_, [this] {
        if (stopping_) return;
        stopping_ = true;
        error_code ec;
        acceptor_.close(ec);
        accept_retry_.cancel();
        const std::vector<Connection*> open(connections_.begin(), connections_.end());
        for (Connection* c : open)
            if (connections_.count(c)) {
                const std::shared_ptr<Connection> alive = c->shared_from_this();
                alive->close_if_waiting();
            }
        if (connections_.empty()) work_.reset();
    });
}

HttpServer::HttpServer(HttpServerOptions options)
    : impl_(std::make_unique<Impl>(*this, std::move(options))) {}
HttpServer::~HttpServer() = default;

void HttpServer::route(const std::string& method, const std::string& path, HttpHandler handler) {
    impl_->routes_[{method, path}] = std::move(handler);
    impl_->paths_.insert(path);
}
void HttpServer::set_pre_routing(std::function<bool(const HttpRequest&, HttpResponse&)> check) {
    impl_->pre_routing_ = std::move(check);
}
void HttpServer::set_error_handler(std::function<void(const HttpRequest&, HttpResponse&)> explain) {
    impl_->error_handler_ = std::move(explain);
}
int HttpServer::listen(const std::string& host, int port) {
    return impl_->listen(host, port);
}
void HttpServer::run() {
    impl_->run();
}
void HttpServer::stop() {
    impl_->stop();
}

}  // namespace tmx::serve

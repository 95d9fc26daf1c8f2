// tmx serve's HTTP/1.1 server: one I/O thread multiplexes every connection (reads, deadlines,
// writes) on an event loop, so a connection that is open but idle or slow costs memory, not a
// thread; a request read whole is handed to a bounded pool of handler threads, which may block
// (on a completion) and may stream a response piece by piece. Beast (Boost's HTTP on Asio)
// parses requests inside http_server.cpp only: routes see the plain types below.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tmx::serve {

struct HttpRequest {
    std::string method;  // as sent, e.g. "POST"
    std::string path;    // the target before any '?'
    std::string query;   // after the '?' (without it)
    std::vector<std::pair<std::string, std::string>> headers;
    std::string body;
    // Whether the client has closed its connection since sending the request (a handler that
    // blocks, on a completion say, may then give up); unset where nobody watches the connection.
    std::function<bool()> client_gone;

    // The first header of that name (case-insensitive), or "".
    std::string header(std::string_view name) const;
    bool client_left() const { return client_gone && client_gone(); }
};

// Where a streamed response's pieces go, from the handler's thread.
class ResponseStream {
  public:
    virtual ~ResponseStream() = default;
    // Sends `data` as the next piece and waits until the connection has taken it (the client's
    // pace: a client that reads slowly slows the writer); false when the client has left or
    // took longer than the write timeout, and from then on.
    virtual bool write(std::string_view data) = 0;
    // Whether the client is still there (it has not closed its side), without writing.
    virtual bool is_writable() const = 0;
};

struct HttpResponse {
    int status = 200;
    std::vector<std::pair<std::string, std::string>> headers;  // besides the content type
    std::string content_type;
    std::string body;
    // A streamed response (chunked transfer encoding) instead of `body`: called on the handler's
    // thread once the head has gone out; returns true when it wrote everything (the response is
    // then ended and the connection may serve the next request), false when it gave up.
    std::function<bool(ResponseStream&)> stream;

    void set_header(std::string name, std::string value);
    void set_content(std::string content, std::string type);
};

using HttpHandler = std::function<void(const HttpRequest&, HttpResponse&)>;

struct HttpServerOptions {
    size_t handler_threads = 8;
    // Connections open at once; one more is accepted and closed at once (a 503 written if the
    // socket takes it without waiting).
    size_t max_connections = 1024;
    size_t max_head_bytes = 16 * 1024;  // request line and headers: beyond, 431
    size_t max_body_bytes = 1 << 20;    // beyond, 413 (from Content-Length, before reading)
    double request_timeout_s = 10;      // from a request's first byte to its last: beyond, 408
    double write_timeout_s = 30;        // for each write of a response to complete
    double idle_timeout_s = 5;          // a connection waiting for its next request
    size_t max_requests_per_connection = 1000;
    // Runs first on each thread the server starts (I/O and handlers), e.g. to lower its priority.
    std::function<void()> on_thread_start;
};

class HttpServer {
  public:
    explicit HttpServer(HttpServerOptions options);
    ~HttpServer();
    HttpServer(const HttpServer&) = delete;
    HttpServer& operator=(const HttpServer&) = delete;

    // Routes, matched on the exact path; a GET route answers HEAD too. Set before run().
    void route(const std::string& method, const std::string& path, HttpHandler handler);
    // Runs before routing on every request read whole; true when it answered the request.
    void set_pre_routing(std::function<bool(const HttpRequest&, HttpResponse&)> check);
    // Fills in the body of a response the server makes itself (its status set: 400, 404, 405,
    // 408, 413, 431, 503 for a connection over the limit); the request may be partly read.
    void set_error_handler(std::function<void(const HttpRequest&, HttpResponse&)> explain);

    // Binds host:port (0: a free port) with SO_REUSEADDR (not SO_REUSEPORT: a second server on
    // the port fails) and a deep listen backlog; the port bound, or -1 when it cannot.
    int listen(const std::string& host, int port);
    // Serves until stop(); then ends: no new connection, each request being handled is answered
    // (its stream to the end), and the threads are joined.
    void run();
    // From any thread, before or during run().
    void stop();

    int64_t open_connections() const { return open_connections_.load(); }
    uint64_t refused_connections() const { return refused_connections_.load(); }

    class Impl;  // the event loop, the connections and the handler pool (http_server.cpp)

  private:
    std::unique_ptr<Impl> impl_;
    std::atomic<int64_t> open_connections_{0};
    std::atomic<uint64_t> refused_connections_{0};
};

}  // namespace tmx::serve

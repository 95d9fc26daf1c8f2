// What the tests of `tmx serve` over real HTTP share (serve_cli_test.cpp: the API;
// serve_connections_test.cpp: the HTTP front end): the ServeCli fixture, which starts and stops
// the server on a checkpoint made once per suite, with an httplib client, and RawConnection for
// the bytes a client library would not send. Not in an anonymous namespace: both files' tests
// are one gtest suite, which must see one fixture class.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "backends/registry.h"
#include "engine/core/file_io.h"
#include "engine/core/rng.h"
#include "tests/test_util.h"

namespace tmx::serve_test {

using nlohmann::json;

inline double seconds_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// A client connection on loopback speaking raw HTTP: what a client library would not send.
class RawConnection {
  public:
    struct Response {
        int status = 0;                              // 0: the connection ended first
        std::map<std::string, std::string> headers;  // names in lower case
        std::string body;
    };

    explicit RawConnection(int port) : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(static_cast<uint16_t>(port));
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    }
    ~RawConnection() { ::close(fd_); }
    RawConnection(const RawConnection&) = delete;
    RawConnection& operator=(const RawConnection&) = delete;

    bool connected() const { return connected_; }
    // Closes the sending side only (the request is all sent), still reading.
    void shut_writes() { ::shutdown(fd_, SHUT_WR); }
    bool send(const std::string& bytes) {
        return ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
               static_cast<ssize_t>(bytes.size());
    }
    // The next response (1xx included), its body by Content-Length, chunks or the connection's
    // end; HEAD's has none. Waits at most `limit_s` for each piece.
    Response read_response(bool head_request = false, double limit_s = 60) {
        Response r;
        size_t end;
        while ((end = buffer_.find("\r\n\r\n")) == std::string::npos)
            if (!fill(limit_s)) return r;
        std::istringstream head(buffer_.substr(0, end));
        buffer_.erase(0, end + 4);
        std::string line;
        std::getline(head, line);
        if (line.rfind("HTTP/1.", 0) != 0 || line.size() < 12) return r;
        r.status = std::stoi(line.substr(9, 3));
        while (std::getline(head, line)) {
            if (!line.empty() && line.back() == '\r') line.pop_back();
            const size_t colon = line.find(':');
            std::string name = line.substr(0, colon);
            std::transform(name.begin(), name.end(), name.begin(), ::tolower);
            r.headers[name] = line.substr(line.find_first_not_of(' ', colon + 1));
        }
        if (r.status < 200 || head_request) return r;
        if (r.headers["transfer-encoding"] == "chunked") {
            while (true) {
                while ((end = buffer_.find("\r\n")) == std::string::npos)
                    if (!fill(limit_s)) return r;
                const size_t size = std::stoul(buffer_.substr(0, end), nullptr, 16);
                while (buffer_.size() < end + 2 + size + 2)
                    if (!fill(limit_s)) return r;
                r.body += buffer_.substr(end + 2, size);
                buffer_.erase(0, end + 2 + size + 2);
                if (size == 0) return r;
            }
        }
        if (r.headers.count("content-length")) {
            const size_t size = std::stoul(r.headers["content-length"]);
            while (buffer_.size() < size)
                if (!fill(limit_s)) return r;
            r.body = buffer_.substr(0, size);
            buffer_.erase(0, size);
            return r;
        }
        while (fill(limit_s)) {
        }
        r.body = std::move(buffer_);
        buffer_.clear();
        return r;
    }
    // Seconds until the server ends the connection (what it sends meanwhile is kept for
    // read_response), or -1 when it is still open after `limit_s`.
    double seconds_until_closed(double limit_s) {
        const auto t0 = std::chrono::steady_clock::now();
        while (fill(limit_s - seconds_since(t0))) {
        }
        return closed_ ? seconds_since(t0) : -1;
    }
    // Whether the server has sent something or closed, within `limit_s`.
    bool readable_within(double limit_s) {
        pollfd p{fd_, POLLIN, 0};
        return ::poll(&p, 1, static_cast<int>(limit_s * 1000)) > 0;
    }
    // Whatever has arrived and not been read as a response.
    const std::string& unread() const { return buffer_; }

  private:
    // Appends what arrives within `limit_s`; false on the connection's end (closed_) or time.
    bool fill(double limit_s) {
        if (closed_ || limit_s <= 0 || !readable_within(limit_s)) return false;
        char chunk[65536];
        const ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
        if (n <= 0) {
            closed_ = true;  // an orderly close, or a reset
            return false;
        }
        buffer_.append(chunk, static_cast<size_t>(n));
        return true;
    }

    int fd_;
    bool connected_ = false, closed_ = false;
    std::string buffer_;
};

// The body of a POST of JSON, as raw HTTP/1.1 (more headers may follow `extra`).
inline std::string raw_post(const std::string& path, const std::string& body,
                            const std::string& extra = "") {
    return "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
           "Content-Length: " + std::to_string(body.size()) + "\r\n" + extra + "\r\n" + body;
}

// A checkpoint with a trained tokenizer, made once for the suite.
class ServeCli : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        dir_ = new test::TempDir;
        Rng rng(test::fresh_seed());
        ASSERT_NE(test::make_cli_checkpoint(*dir_, rng, "{}", 5), "");
    }
    static void TearDownTestSuite() {
        delete dir_;
        dir_ = nullptr;
    }

    // Starts `tmx serve` on a free port with extra flags (and another checkpoint, another
    // backend); returns its port.
    int start(const std::string& flags = "", const std::string& model = "",
              const std::string& backend = "cpu") {
        log_ = *dir_ /
               ("serve-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++) + ".log");
        pid_ = ::fork();
        if (pid_ == 0) {
            const std::string cmd = std::string(TMX_BINARY) + " serve --model " +
                                    (model.empty() ? *dir_ / "ckpt" : model) + " --backend " +
                                    backend + " --port 0 " + flags + " 2>" + log_ +
                                    " >/dev/null </dev/null";
            ::execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), nullptr);
            ::_exit(127);
        }
        for (int i = 0; i < 600; ++i) {
            std::ifstream in(log_);
            std::stringstream ss;
            ss << in.rdbuf();
            const std::string s = ss.str();
            const size_t at = s.find("listening on http://127.0.0.1:");
            if (at != std::string::npos) {
                port_ = std::stoi(s.substr(at + 30));
                return port_;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        ADD_FAILURE() << "the server did not start";
        return -1;
    }
    // Sends SIGTERM and returns the exit status (or -1 if it did not exit in time).
    int stop() {
        if (pid_ <= 0) return -1;
        ::kill(pid_, SIGTERM);
        int status = 0;
        for (int i = 0; i < 1500; ++i) {
            if (::waitpid(pid_, &status, WNOHANG) == pid_) {
                pid_ = -1;
                return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        pid_ = -1;
        return -1;
    }
    void TearDown() override {
        if (pid_ > 0) stop();
    }

    httplib::Client client() const {
        httplib::Client c("127.0.0.1", port_);
        c.set_read_timeout(60);
        return c;
    }
    json post(const std::string& path, const json& body, int expect_status = 200,
              const httplib::Headers& headers = {}) {
        auto c = client();
        auto res = c.Post(path, headers, body.dump(), "application/json");
        EXPECT_TRUE(res) << "no response";
        if (!res) return {};
        EXPECT_EQ(res->status, expect_status) << res->body;
        return json::parse(res->body);
    }
    // The events of a streamed response, [DONE] excluded (done_seen tells whether it came).
    std::vector<json> stream(const std::string& path, json body, bool* done_seen = nullptr) {
        body["stream"] = true;
        auto c = client();
        std::string raw;
        auto res = c.Post(path, {}, body.dump(), "application/json");
        EXPECT_TRUE(res);
        if (!res) return {};
        EXPECT_EQ(res->status, 200) << res->body;
        EXPECT_EQ(res->get_header_value("Content-Type"), "text/event-stream");
        std::vector<json> events;
        bool done = false;
        std::istringstream in(res->body);
        std::string line;
        while (std::getline(in, line)) {
            if (line.empty()) continue;
            EXPECT_EQ(line.rfind("data: ", 0), 0u) << line;
            const std::string data = line.substr(6);
            if (data == "[DONE]") {
                done = true;
                continue;
            }
            EXPECT_FALSE(done) << "an event after [DONE]";
            events.push_back(json::parse(data));
        }
        EXPECT_TRUE(done || done_seen);
        if (done_seen) *done_seen = done;
        return events;
    }

    inline static test::TempDir* dir_ = nullptr;
    inline static int counter_ = 0;
    std::string log_;
    pid_t pid_ = -1;
    int port_ = -1;
};

}  // namespace tmx::serve_test

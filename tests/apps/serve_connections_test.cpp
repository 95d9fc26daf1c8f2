// tmx serve's HTTP front end over real HTTP on loopback: a port in use refused, slow, idle,
// stalled and excess connections closed or refused at their deadlines and limits without
// delaying others, and the parts of HTTP/1.1 a client library seldom sends (Expect, chunked
// bodies, pipelining, HEAD, HTTP/1.0).
#include "tests/apps/serve_fixture.h"

namespace tmx {
namespace {

using namespace serve_test;
using nlohmann::json;

// A second server on a port in use fails with a clear message instead of sharing the port.
TEST_F(ServeCli, APortInUseIsRefused) {
    ASSERT_GT(start(), 0);
    const std::string err = *dir_ / "second.err";
    const int status =
        std::system(("timeout 60 " + std::string(TMX_BINARY) + " serve --model " + *dir_ / "ckpt" +
                     " --backend cpu --port " + std::to_string(port_) + " 2>" + err + " </dev/null")
                        .c_str());
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status;
    EXPECT_NE(read_file(err).find("cannot listen there"), std::string::npos) << read_file(err);
}

// A connection that sends part of a request and stalls is answered 408 and closed after
// --request-timeout, one that sends nothing after the idle time (--timeout 1 here: 1 s);
// requests on other connections are served meanwhile.
TEST_F(ServeCli, SlowAndIdleConnectionsAreClosedWithoutStallingOthers) {
    ASSERT_GT(start("--timeout 1 --request-timeout 2"), 0);
    RawConnection slow(port_), idle(port_);
    ASSERT_TRUE(slow.connected() && idle.connected());
    ASSERT_TRUE(slow.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le"));
    const json r =
        post("/v1/completions", {{"prompt", "the fox"}, {"max_tokens", 3}, {"ignore_eos", true}});
    EXPECT_EQ(r["usage"]["completion_tokens"], 3);
    EXPECT_GE(idle.seconds_until_closed(30), 0) << "the server kept the idle connection open";
    EXPECT_GE(slow.seconds_until_closed(30), 0) << "the server kept the slow connection open";
    const RawConnection::Response timed_out = slow.read_response(false, 1);
    EXPECT_EQ(timed_out.status, 408);
    EXPECT_TRUE(json::parse(timed_out.body)["error"].contains("message")) << timed_out.body;
}

// The deadline is for the whole request, head and body, from its first byte: a client that
// sends its body a byte every 100 ms (no read waits long) is answered 408 and closed once
// --request-timeout has passed, although --timeout is long.
TEST_F(ServeCli, ARequestSlowerThanTheRequestTimeoutIsClosedAtItsDeadline) {
    ASSERT_GT(start("--request-timeout 1 --timeout 30"), 0);
    RawConnection drip(port_);
    ASSERT_TRUE(drip.connected());
    const std::string body = json{{"prompt", "the little fox ran to the tree"}}.dump();
    const std::string request = raw_post("/tokenize", body);
    const size_t head = request.size() - body.size();
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE(drip.send(request.substr(0, head)));
    for (size_t i = head; i < request.size(); ++i) {
        if (!drip.send(request.substr(i, 1)) || drip.readable_within(0.1)) break;
    }
    const double closed_after = seconds_since(t0) + drip.seconds_until_closed(10);
    EXPECT_GE(closed_after, 0.9);
    EXPECT_LT(closed_after, 3.0) << "a 4 s request was not cut at the 1 s deadline";
    EXPECT_EQ(drip.read_response(false, 1).status, 408);
}

// Many connections that send part of a request line and stall (each held until its
// --request-timeout) cost the server no thread: a completion on another connection is answered
// as if they were not there.
TEST_F(ServeCli, ManyStalledConnectionsDoNotDelayACompletion) {
    ASSERT_GT(start("--parallel 2 --queue 4 --request-timeout 60"), 0);
    std::vector<std::unique_ptr<RawConnection>> stalled;
    for (int i = 0; i < 200; ++i) {
        stalled.push_back(std::make_unique<RawConnection>(port_));
        ASSERT_TRUE(stalled.back()->connected()) << i;
        ASSERT_TRUE(
            stalled.back()->send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Len"));
    }
    const auto t0 = std::chrono::steady_clock::now();
    const json r =
        post("/v1/completions", {{"prompt", "the fox"}, {"max_tokens", 4}, {"ignore_eos", true}});
    EXPECT_EQ(r["usage"]["completion_tokens"], 4);
    EXPECT_LT(seconds_since(t0), 10.0);
    // They are all still open (and so counted, with this one and perhaps the last one's, whose
    // close the server may not have seen yet).
    auto metrics = client().Get("/metrics");
    ASSERT_TRUE(metrics);
    const size_t at = metrics->body.find("\ntmx_open_connections ");
    ASSERT_NE(at, std::string::npos) << metrics->body;
    const int open = std::stoi(metrics->body.substr(at + 22));
    EXPECT_GE(open, 201);
    EXPECT_LE(open, 202);
    for (auto& c : stalled) EXPECT_FALSE(c->readable_within(0)) << "closed before its deadline";
}

// Over --max-connections, a connection is answered 503 or closed at once (never queued), each
// counted; the server goes on serving the connections it has and new ones once some close.
TEST_F(ServeCli, ConnectionsOverTheLimitAreRefusedAtOnceAndCounted) {
    ASSERT_GT(start("--max-connections 4 --request-timeout 60"), 0);
    std::vector<std::unique_ptr<RawConnection>> held;
    for (int i = 0; i < 4; ++i) {
        held.push_back(std::make_unique<RawConnection>(port_));
        ASSERT_TRUE(held.back()->connected());
        // Held by a request that never ends (an idle one would close after 5 s).
        if (i > 0) {
            ASSERT_TRUE(held.back()->send("GET /health HTTP/1.1\r\nHo"));
        }
    }
    // The held connections are served meanwhile.
    ASSERT_TRUE(held[0]->send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n"));
    EXPECT_EQ(held[0]->read_response().status, 200);
    const int excess = 20;
    for (int i = 0; i < excess; ++i) {
        RawConnection extra(port_);
        const auto t0 = std::chrono::steady_clock::now();
        extra.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");  // may find it closed already
        const double closed = extra.seconds_until_closed(5);
        EXPECT_GE(closed, 0) << "connection " << i << " over the limit was kept waiting";
        EXPECT_LT(seconds_since(t0), 2.0);
        const RawConnection::Response res = extra.read_response(false, 0.1);
        if (res.status != 0) {  // a 503 when the answer beat the close
            EXPECT_EQ(res.status, 503);
            EXPECT_EQ(json::parse(res.body)["error"]["type"], "server_error") << res.body;
        }
    }
    held.pop_back();  // one closes: a new connection gets its place
    std::string metrics;
    int refused_meanwhile = 0;
    for (int attempt = 0; attempt < 100 && metrics.empty(); ++attempt) {
        RawConnection c(port_);
        c.send("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        const RawConnection::Response res = c.read_response(false, 5);
        if (res.status == 200)
            metrics = res.body;
        else
            ++refused_meanwhile;  // the server had not yet seen the close
    }
    ASSERT_FALSE(metrics.empty());
    EXPECT_NE(metrics.find("\ntmx_connections_refused_total " +
                           std::to_string(excess + refused_meanwhile) + "\n"),
              std::string::npos)
        << metrics;
    EXPECT_NE(metrics.find("\ntmx_open_connections 4\n"), std::string::npos) << metrics;
}

// The request line and headers may take 16 KiB (431 beyond); Expect: 100-continue is answered
// before the body is sent, or a body over --max-body is refused (413) before it is sent.
TEST_F(ServeCli, HeadsOverTheLimitAre431AndExpectContinueIsAnswered) {
    ASSERT_GT(start("--max-body 4096"), 0);
    {
        RawConnection c(port_);
        c.send("GET /health HTTP/1.1\r\nHost: x\r\nX-Filler: " + std::string(15000, 'a') +
               "\r\n\r\n");
        EXPECT_EQ(c.read_response().status, 200);
        c.send("GET /health HTTP/1.1\r\nHost: x\r\nX-Filler: " + std::string(17000, 'a') +
               "\r\n\r\n");
        const RawConnection::Response res = c.read_response();
        EXPECT_EQ(res.status, 431);
        EXPECT_EQ(json::parse(res.body)["error"]["type"], "invalid_request_error") << res.body;
        EXPECT_EQ(res.headers.at("connection"), "close");
        EXPECT_GE(c.seconds_until_closed(5), 0);
    }
    const std::string body = json{{"prompt", "the little fox"}}.dump();
    const json want = post("/tokenize", json::parse(body));
    {
        RawConnection c(port_);
        const std::string request = raw_post("/tokenize", body, "Expect: 100-continue\r\n");
        c.send(request.substr(0, request.size() - body.size()));
        EXPECT_EQ(c.read_response(false, 10).status, 100);
        c.send(body);
        const RawConnection::Response res = c.read_response();
        EXPECT_EQ(res.status, 200);
        EXPECT_EQ(json::parse(res.body), want);
    }
    {
        RawConnection c(port_);
        c.send(
            "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n"
            "Expect: 100-continue\r\n\r\n");
        const RawConnection::Response res = c.read_response(false, 10);
        EXPECT_EQ(res.status, 413);
        EXPECT_NE(json::parse(res.body)["error"]["message"].get<std::string>().find("--max-body"),
                  std::string::npos)
            << res.body;
    }
}

// A body in chunks (Transfer-Encoding: chunked) is read whole; its total counts against
// --max-body.
TEST_F(ServeCli, AChunkedRequestBodyIsReadWhole) {
    ASSERT_GT(start("--max-body 4096"), 0);
    const std::string body = json{{"prompt", "the little fox ran to the tree"}}.dump();
    const json want = post("/tokenize", json::parse(body));
    auto chunked = [](const std::string& piece) {
        std::ostringstream out;
        out << std::hex << piece.size() << "\r\n" << piece << "\r\n";
        return out.str();
    };
    RawConnection c(port_);
    c.send(
        "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n");
    for (size_t at = 0; at < body.size(); at += 7) {
        c.send(chunked(body.substr(at, 7)));
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    c.send("0\r\n\r\n");
    RawConnection::Response res = c.read_response();
    EXPECT_EQ(res.status, 200);
    EXPECT_EQ(json::parse(res.body), want);

    c.send("POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
    for (int i = 0; i < 5; ++i) c.send(chunked(std::string(1000, 'a')));
    res = c.read_response(false, 10);
    EXPECT_EQ(res.status, 413);
}

// One connection serves request after request (keep-alive), streamed answers included, and
// requests sent back to back before an answer (pipelining) in order; HEAD has no body; a wrong
// method is 405; Connection: close and HTTP/1.0 end the connection after the answer.
TEST_F(ServeCli, OneConnectionServesRequestAfterRequest) {
    ASSERT_GT(start("--request-timeout 4"), 0);
    RawConnection c(port_);
    const json completion = {{"prompt", "the fox"}, {"max_tokens", 3}, {"ignore_eos", true}};
    c.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    EXPECT_EQ(c.read_response().status, 200);
    c.send(raw_post("/v1/completions", completion.dump()));
    RawConnection::Response res = c.read_response();
    EXPECT_EQ(res.status, 200);
    EXPECT_EQ(json::parse(res.body)["usage"]["completion_tokens"], 3);
    json streamed = completion;
    streamed["stream"] = true;
    c.send(raw_post("/v1/completions", streamed.dump()));
    res = c.read_response();
    EXPECT_EQ(res.status, 200);
    EXPECT_EQ(res.headers["content-type"], "text/event-stream");
    EXPECT_EQ(res.headers["cache-control"], "no-cache");
    EXPECT_GE(res.body.size(), 14u);
    EXPECT_EQ(res.body.substr(res.body.size() - 14), "data: [DONE]\n\n") << res.body;
    // The next request sent while this one is being answered, and a body sent whole that is
    // larger than one read: each read as soon as the server gets to it.
    c.send(raw_post("/v1/completions", completion.dump()));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    c.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    EXPECT_EQ(c.read_response().status, 200);
    const auto t0 = std::chrono::steady_clock::now();
    res = c.read_response(false, 4);
    EXPECT_EQ(res.status, 200) << "a request that came during the last one's answer waited";
    EXPECT_LT(seconds_since(t0), 4.0);
    std::string words;
    while (words.size() < 300000) words += "the little fox ran to the tree ";
    c.send(raw_post("/tokenize", json{{"prompt", words}}.dump()));
    res = c.read_response();
    EXPECT_EQ(res.status, 200) << res.body.substr(0, 200);
    EXPECT_GT(json::parse(res.body)["count"].get<int>(), 10000);
    c.send("HEAD / HTTP/1.1\r\nHost: x\r\n\r\n");
    res = c.read_response(true);
    EXPECT_EQ(res.status, 200);
    EXPECT_GT(std::stoul(res.headers["content-length"]), 1000u);
    c.send("GET /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n");
    res = c.read_response();
    EXPECT_EQ(res.status, 405);
    EXPECT_EQ(res.headers["allow"], "POST");
    EXPECT_EQ(json::parse(res.body)["error"]["type"], "invalid_request_error") << res.body;
    // Pipelined: both requests in one write, both answers in order.
    c.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n" +
           raw_post("/tokenize", "{\"prompt\": \"fox\"}"));
    EXPECT_EQ(json::parse(c.read_response().body)["status"], "ok");
    EXPECT_TRUE(json::parse(c.read_response().body).contains("tokens"));
    c.send("GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    res = c.read_response();
    EXPECT_EQ(res.status, 200);
    EXPECT_EQ(res.headers["connection"], "close");
    EXPECT_GE(c.seconds_until_closed(5), 0);

    RawConnection old(port_);
    old.send("GET /health HTTP/1.0\r\n\r\n");
    EXPECT_EQ(old.read_response().status, 200);
    EXPECT_GE(old.seconds_until_closed(5), 0);
    RawConnection old_stream(port_);
    old_stream.send("POST /v1/completions HTTP/1.0\r\nContent-Length: " +
                    std::to_string(streamed.dump().size()) + "\r\n\r\n" + streamed.dump());
    res = old_stream.read_response();  // no chunks in HTTP/1.0: the body ends with the connection
    EXPECT_EQ(res.status, 200);
    EXPECT_EQ(res.body.substr(res.body.size() - 14), "data: [DONE]\n\n") << res.body;
}

}  // namespace
}  // namespace tmx

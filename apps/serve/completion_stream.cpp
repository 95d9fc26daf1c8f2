#include "apps/serve/completion_stream.h"

#include <chrono>
#include <optional>
#include <string>

namespace tmx::serve {

namespace {

using nlohmann::json;

// The response's stream, called once on the handler's thread: it writes events until the
// completion has ended (then true) or the client has left (false, the completion cancelled).
class CompletionStream {
  public:
    CompletionStream(std::shared_ptr<Completion> completion, ResponseHeader header, bool chat,
                     bool logprobs, bool usage, Metrics& metrics)
        : completion_(std::move(completion)),
          header_(std::move(header)),
          chat_(chat),
          logprobs_(logprobs),
          usage_(usage),
          metrics_(&metrics) {}

    bool operator()(ResponseStream& sink) const {
        while (true) {
            const Completion::Progress progress =
                completion_->next_updates(std::chrono::milliseconds(500));
            if (!send_updates(sink, progress.updates) || !sink.is_writable()) {
                metrics_->count_request("cancelled");
                completion_->cancel();  // the client left: free its slots
                return false;
            }
            if (progress.all_done) return finish(sink);
        }
    }

  private:
    static bool send(ResponseStream& sink, const json& j) {
        const std::string line = "data: " + dump(j) + "\n\n";
        return sink.write(line);
    }

    // A chunk for each update; false when the client has left.
    bool send_updates(ResponseStream& sink, const std::vector<Completion::Update>& updates) const {
        for (const Completion::Update& u : updates) {
            if (u.done && u.text.empty() && !u.error.empty()) continue;  // its error event says it
            json chunk = header_.fields();
            chunk["choices"] = json::array({stream_choice(u, chat_, logprobs_)});
            if (usage_) chunk["usage"] = nullptr;
            if (!send(sink, chunk)) return false;
        }
        return true;
    }

    // After every choice has ended: the usage chunk, or the error event of a completion that
    // failed or was cancelled; then [DONE]. False when the client has left.
    bool finish(ResponseStream& sink) const {
        const bool cancelled = completion_->cancelled();
        const std::optional<std::string> failure = completion_->failure();
        if (failure) {
            metrics_->count_request("server_error");
            send(sink, generation_failed(*failure).body());
        } else {
            metrics_->count_request(cancelled ? "cancelled" : "ok");
            if (usage_ && !cancelled) {
                json chunk = header_.fields();
                chunk["choices"] = json::array();
                chunk["usage"] = usage_json(completion_->usage());
                send(sink, chunk);
            }
        }
        if (cancelled && !failure) send(sink, completion_cancelled(500).body());
        return sink.write("data: [DONE]\n\n");
    }

    std::shared_ptr<Completion> completion_;
    ResponseHeader header_;
    bool chat_, logprobs_, usage_;
    Metrics* metrics_;
};

}  // namespace

void stream_completion(HttpResponse& res, std::shared_ptr<Completion> completion,
                       const ResponseHeader& header, const CompletionRequest& request,
                       Metrics& metrics) {
    res.set_header("Cache-Control", "no-cache");
    ResponseHeader chunk_header = header;
    if (request.chat) chunk_header.object += ".chunk";  // completions' chunks keep their name
    res.content_type = "text/event-stream";
    res.stream = CompletionStream(completion, chunk_header, request.chat, request.logprobs >= 0,
                                  request.stream_usage, metrics);
}

}  // namespace tmx::serve

#include "apps/serve/metrics.h"

#include <cstdio>

namespace tmx::serve {

namespace {

std::string number(double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    return buf;
}

}  // namespace

void Histogram::observe(double seconds) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < kBounds.size(); ++i)
        if (seconds <= kBounds[i]) ++counts_[i];
    ++count_;
    sum_ += seconds;
}

std::string Histogram::render(const std::string& name, const std::string& help) const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::string out = "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
    for (size_t i = 0; i < kBounds.size(); ++i)
        out += name + "_bucket{le=\"" + number(kBounds[i]) + "\"} " + std::to_string(counts_[i]) +
               "\n";
    out += name + "_bucket{le=\"+Inf\"} " + std::to_string(count_) + "\n";
    out += name + "_sum " + number(sum_) + "\n";
    out += name + "_count " + std::to_string(count_) + "\n";
    return out;
}

void Metrics::count_request(const std::string& outcome) {
    std::lock_guard<std::mutex> lock(mutex);
    ++requests[outcome];
}

std::string Metrics::render(int64_t running, int64_t waiting, int64_t slots,
                            const ConnectionCounts& connections) {
    std::string out;
    out += "# HELP tmx_requests_total Completion and chat requests, by outcome.\n";
    out += "# TYPE tmx_requests_total counter\n";
    {
        std::lock_guard<std::mutex> lock(mutex);
        for (const char* o : {"ok", "client_error", "queue_full", "cancelled", "server_error"})
            out += std::string("tmx_requests_total{outcome=\"") + o + "\"} " +
                   std::to_string(requests.count(o) ? requests.at(o) : 0) + "\n";
    }
    auto line = [&](const char* name, const char* type, const char* help, double v) {
        out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" +
               name + " " + number(v) + "\n";
    };
    line("tmx_prompt_tokens_total", "counter", "Prompt tokens prefilled (BOS included).",
         static_cast<double>(prompt_tokens.load()));
    line("tmx_completion_tokens_total", "counter", "Tokens generated.",
         static_cast<double>(completion_tokens.load()));
    line("tmx_queue_depth", "gauge", "Sequences waiting for a slot.", static_cast<double>(waiting));
    line("tmx_active_slots", "gauge", "Sequences in a KV-cache slot.",
         static_cast<double>(running));
    line("tmx_slots", "gauge", "KV-cache slots (--parallel).", static_cast<double>(slots));
    line("tmx_open_connections", "gauge", "HTTP connections open.",
         static_cast<double>(connections.open));
    line("tmx_connections_refused_total", "counter",
         "HTTP connections closed at once: --max-connections were open.",
         static_cast<double>(connections.refused));
    out += time_to_first_token.render("tmx_time_to_first_token_seconds",
                                      "From a request's arrival to its first generated token.");
    out += time_per_token.render("tmx_time_per_token_seconds",
                                 "Between consecutive generated tokens of a sequence.");
    return out;
}

}  // namespace tmx::serve

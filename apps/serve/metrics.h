// The server's counters for GET /metrics, in Prometheus' text format (version 0.0.4): counters,
// gauges and cumulative histograms. Thread-safe.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace tmx::serve {

class Histogram {
  public:
    void observe(double seconds);
    // "# HELP", "# TYPE" and the _bucket{le=...}, _sum and _count lines.
    std::string render(const std::string& name, const std::string& help) const;

  private:
    static constexpr std::array<double, 12> kBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                       0.1,   0.25,   0.5,   1,    2.5,   10};
    mutable std::mutex mutex_;
    std::array<uint64_t, kBounds.size()> counts_{};
    uint64_t count_ = 0;
    double sum_ = 0;
};

// The HTTP server's connections at one moment.
struct ConnectionCounts {
    int64_t open = 0;
    uint64_t refused = 0;  // since start: over --max-connections
};

struct Metrics {
    std::mutex mutex;
    std::map<std::string, uint64_t> requests;  // by outcome: ok, client_error, queue_full, ...
    std::atomic<uint64_t> prompt_tokens{0}, completion_tokens{0};
    Histogram time_to_first_token, time_per_token;

    void count_request(const std::string& outcome);
    // The whole page; `running`, `waiting` and `slots` are the scheduler's at this moment.
    std::string render(int64_t running, int64_t waiting, int64_t slots,
                       const ConnectionCounts& connections);
};

}  // namespace tmx::serve

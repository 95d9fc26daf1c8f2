// The scheduler behind one engine thread, for a server: any thread submits and cancels; the
// engine thread alone owns the scheduler, the model and the backend, and steps while there is
// work. Requests' callbacks (on_token, on_done) run on the engine thread.
//
// A step that throws (a backend error) fails the sequences that were in it (StopReason::Failed)
// and the loop goes on with the next requests. kMaxFailedSteps steps failing in a row mean the
// device is gone: every request ends, failure() says why, on_failure runs, and the loop stops.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/infer/scheduler.h"

namespace tmx {

class ServeLoop {
  public:
    using Ticket = uint64_t;

    static constexpr int kMaxFailedSteps = 3;

    // Starts the engine thread. At most `max_waiting` requests wait for a slot. on_failure (if
    // any) runs once on the engine thread when the loop gives up on the device.
    ServeLoop(Model& model, const SchedulerOptions& options, int64_t max_waiting,
              std::function<void(const std::string& why)> on_failure = {});
    ~ServeLoop();  // stop()
    ServeLoop(const ServeLoop&) = delete;
    ServeLoop& operator=(const ServeLoop&) = delete;

    // A tmx::Error when the request cannot run (Scheduler::check); nullopt when the queue is
    // full; otherwise its ticket.
    std::optional<Ticket> submit(SequenceRequest request);
    // Ends the request (StopReason::Cancelled) if it has not ended yet.
    void cancel(Ticket ticket);

    struct Stats {
        int64_t slots = 0, running = 0, waiting = 0;
    };
    Stats stats() const;
    // The error that stopped the engine thread (the device is gone), or "" while it runs.
    std::string failure() const;

    // Cancels every request and joins the engine thread.
    void stop();

  private:
    void run();
    // After kMaxFailedSteps failed steps: ends every request and refuses new ones.
    void give_up(const std::string& error);

    Scheduler scheduler_;
    const int64_t max_waiting_;
    mutable std::mutex mutex_;
    std::condition_variable wake_;
    std::deque<std::pair<Ticket, SequenceRequest>> inbox_;
    std::vector<Ticket> cancels_;
    Ticket next_ticket_ = 1;
    bool stopping_ = false;
    std::string failure_;
    std::function<void(const std::string&)> on_failure_;
    Stats stats_;
    std::map<Ticket, Scheduler::Id> ids_;  // engine thread only
    std::thread thread_;
};

}  // namespace tmx

#include "engine/infer/serve_loop.h"

#include <pthread.h>

#include "engine/core/errors.h"
#include "engine/core/threads.h"

namespace tmx {

ServeLoop::ServeLoop(Model& model, const SchedulerOptions& options, int64_t max_waiting,
                     std::function<void(const std::string&)> on_failure)
    : scheduler_(model, options), max_waiting_(max_waiting), on_failure_(std::move(on_failure)) {
    stats_.slots = scheduler_.slots();
    // OpenMP's thread count is per thread: a new thread starts from the default (every core),
    // not from what this one was given (--threads), so the engine thread sets it again.
    thread_ = std::thread([this, threads = num_threads()] {
        set_num_threads(threads);
        // Named for top -H and profilers; the backend's worker threads it starts inherit it.
        pthread_setname_np(pthread_self(), "tmx-engine");
        run();
    });
}

ServeLoop::~ServeLoop() {
    stop();
}

std::optional<ServeLoop::Ticket> ServeLoop::submit(SequenceRequest request) {
    scheduler_.check(request);
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_ || !failure_.empty()) return std::nullopt;
    const int64_t free_slots = stats_.slots - stats_.running;
    const int64_t waiting = stats_.waiting + static_cast<int64_t>(inbox_.size());
    if (waiting - free_slots >= max_waiting_) return std::nullopt;
    const Ticket t = next_ticket_++;
    inbox_.emplace_back(t, std::move(request));
    wake_.notify_one();
    return t;
}

void ServeLoop::cancel(Ticket ticket) {
    std::lock_guard<std::mutex> lock(mutex_);
    cancels_.push_back(ticket);
    wake_.notify_one();
}

ServeLoop::Stats ServeLoop::stats() const {
    std::lock_guard<std::mutex> lock(mutex_);
    Stats s = stats_;
    s.waiting += static_cast<int64_t>(inbox_.size());
    return s;
}

std::string ServeLoop::failure() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return failure_;
}

void ServeLoop::stop() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stopping_ = true;
        wake_.notify_one();
    }
    if (thread_.joinable()) thread_.join();
}

void ServeLoop::run() {
    int failed_steps = 0;  // in a row
    while (true) {
        std::deque<std::pair<Ticket, SequenceRequest>> arrived;
        std::vector<Ticket> cancels;
        bool stopping = false;
        {
            std::unique_lock<std::mutex> lock(mutex_);
            wake_.wait(lock, [&] {
                return stopping_ || !inbox_.empty() || !cancels_.empty() ||
                       scheduler_.running() > 0 || scheduler_.waiting() > 0;
            });
            arrived.swap(inbox_);
            cancels.swap(cancels_);
            stopping = stopping_;
        }
        for (auto& [ticket, request] : arrived) {
            // A request whose ticket is forgotten when it ends: its on_done runs first.
            auto done = std::move(request.on_done);
            request.on_done = [this, t = ticket, done = std::move(done)](TokenGeneration&& g) {
                ids_.erase(t);
                if (done) done(std::move(g));
            };
            ids_[ticket] = scheduler_.submit(std::move(request));
        }
        for (Ticket t : cancels)
            if (auto it = ids_.find(t); it != ids_.end()) scheduler_.cancel(it->second);
        if (stopping)
            for (const auto& [ticket, id] : ids_) scheduler_.cancel(id);
        try {
            scheduler_.step();
            failed_steps = 0;
            // Threads woken by this step's tokens may run below this one (tmx serve's HTTP
            // threads do): one woken on this core would wait for the engine to go idle, at one
            // client for the whole answer. Letting it run between two steps costs nothing here.
            std::this_thread::yield();
        } catch (const std::exception& e) {
            scheduler_.fail_running(std::string("the backend failed: ") + e.what());
            if (++failed_steps >= kMaxFailedSteps) {
                give_up(e.what());
                return;
            }
        }
        {
            std::lock_guard<std::mutex> lock(mutex_);
            stats_.running = scheduler_.running();
            stats_.waiting = scheduler_.waiting();
        }
        if (stopping && scheduler_.running() == 0 && scheduler_.waiting() == 0) return;
    }
}

void ServeLoop::give_up(const std::string& error) {
    std::deque<std::pair<Ticket, SequenceRequest>> unsubmitted;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        failure_ = error;  // submit() refuses from now on
        unsubmitted.swap(inbox_);
        stats_.running = stats_.waiting = 0;
    }
    const std::string why = "the backend failed " + std::to_string(kMaxFailedSteps) +
                            " steps in a row (is the device gone?): " + error;
    // Requests not handed to the scheduler yet end through it too (submit() checked them).
    for (auto& [ticket, request] : unsubmitted) scheduler_.submit(std::move(request));
    scheduler_.fail_all(why);
    if (on_failure_) on_failure_(error);
}

}  // namespace tmx

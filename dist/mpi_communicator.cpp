#include "dist/mpi_communicator.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "engine/core/errors.h"

// MPI's default error handler (MPI_ERRORS_ARE_FATAL) ends the whole job on any MPI error, which
// is what a failed collective must do here, so the calls' return codes are not checked.

namespace tmx {

class MpiCommunicator::Watchdog {
  public:
    using Clock = std::chrono::steady_clock;

    Watchdog(int rank, double timeout_s) : rank_(rank), timeout_s_(timeout_s) {
        timeout_ =
            std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
        thread_ = std::thread([this] { run(); });
    }
    ~Watchdog() {
        {
            std::lock_guard lock(mutex_);
            stop_ = true;
        }
        wake_.notify_one();
        thread_.join();
    }

    void arm(const char* what) {
        {
            std::lock_guard lock(mutex_);
            what_ = what;
            deadline_ = Clock::now() + timeout_;
        }
        wake_.notify_one();
    }
    void disarm() {
        std::lock_guard lock(mutex_);
        what_ = nullptr;
    }

  private:
    void run() {
        std::unique_lock lock(mutex_);
        while (!stop_) {
            if (!what_) {
                wake_.wait(lock);
            } else if (Clock::now() < deadline_) {
                wake_.wait_until(lock, deadline_);
            } else {
                // No MPI here (only the main thread calls it), and no unwinding: the main
                // thread is blocked inside MPI. mpirun ends the other ranks when this one exits.
                std::fprintf(stderr,
                             "tmx: rank %d: no progress in %s for %g s: another rank has hung or "
                             "died; ending the job\n",
                             rank_, what_, timeout_s_);
                std::fflush(stderr);
                std::_Exit(1);
            }
        }
    }

    const int rank_;
    const double timeout_s_;
    Clock::duration timeout_{};
    std::mutex mutex_;
    std::condition_variable wake_;
    const char* what_ = nullptr;  // the MPI call in progress, or null
    Clock::time_point deadline_;
    bool stop_ = false;
    std::thread thread_;
};

struct MpiCommunicator::Watch {
    Watch(Watchdog* watchdog, const char* what) : watchdog(watchdog) {
        if (watchdog) watchdog->arm(what);
    }
    ~Watch() {
        if (watchdog) watchdog->disarm();
    }
    Watch(const Watch&) = delete;
    Watch& operator=(const Watch&) = delete;
    Watchdog* watchdog;
};

namespace {

int as_count(size_t n) {
    if (n > static_cast<size_t>(INT_MAX)) throw std::logic_error("MPI count over INT_MAX");
    return static_cast<int>(n);
}

size_t ceil_div(size_t a, size_t b) {
    return (a + b - 1) / b;
}

}  // namespace

MpiCommunicator::MpiCommunicator(const MpiOptions& options) : bucket_(options.bucket_elements) {
    if (!(options.collective_timeout_s >= 0) || !std::isfinite(options.collective_timeout_s))
        throw std::invalid_argument("MpiCommunicator: the timeout must be a number >= 0");
    if (bucket_ == 0 || bucket_ > static_cast<size_t>(INT_MAX))
        throw std::invalid_argument("MpiCommunicator: bucket_elements outside [1, INT_MAX]");
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) throw std::logic_error("MpiCommunicator: MPI is already initialised");
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    if (provided < MPI_THREAD_FUNNELED) {
        // The watchdog and OpenMP's workers are threads, though none calls MPI.
        abort("this MPI does not support threads (MPI_THREAD_FUNNELED)", 1);
    }
    // Longer than anyone waits: a bound std::chrono can represent.
    const double timeout_s = std::min(options.collective_timeout_s, 1e9);
    if (timeout_s > 0) watchdog_ = std::make_unique<Watchdog>(rank_, timeout_s);
}

MpiCommunicator::~MpiCommunicator() {
    if (std::uncaught_exceptions() > 0) {
        watchdog_.reset();
        return;
    }
    {
        Watch watch(watchdog_.get(), "MPI_Finalize");
        MPI_Finalize();
    }
    watchdog_.reset();
}

std::string MpiCommunicator::description() const {
    return "MPI, " + std::to_string(size_) + (size_ == 1 ? " rank" : " ranks");
}

void MpiCommunicator::all_reduce_sum(std::vector<double>& values) {
    if (values.empty()) return;
    const int n = as_count(values.size());
    Watch watch(watchdog_.get(), "all_reduce_sum (host values)");
    // Summed once, on rank 0, and its bits sent to all: MPI_Allreduce may sum in a different
    // order on each rank.
    if (rank_ == 0)
        MPI_Reduce(MPI_IN_PLACE, values.data(), n, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    else
        MPI_Reduce(values.data(), nullptr, n, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    MPI_Bcast(values.data(), n, MPI_DOUBLE, 0, MPI_COMM_WORLD);
}

void MpiCommunicator::broadcast(std::string& bytes, int root) {
    check_collective_root("broadcast", root, size_);
    Watch watch(watchdog_.get(), "broadcast (host bytes)");
    uint64_t n = bytes.size();
    MPI_Bcast(&n, 1, MPI_UINT64_T, root, MPI_COMM_WORLD);
    if (rank_ != root) bytes.resize(static_cast<size_t>(n));
    constexpr size_t kPiece = size_t{1} << 30;  // MPI counts are ints
    for (size_t at = 0; at < bytes.size(); at += kPiece) {
        const size_t len = std::min(kPiece, bytes.size() - at);
        MPI_Bcast(bytes.data() + at, as_count(len), MPI_BYTE, root, MPI_COMM_WORLD);
    }
}

void MpiCommunicator::barrier() {
    Watch watch(watchdog_.get(), "barrier");
    MPI_Barrier(MPI_COMM_WORLD);
}

void MpiCommunicator::all_reduce_sum(Backend& backend, const Tensor& t) {
    check_collective_tensors("all_reduce_sum", t, nullptr, size_);
    const size_t n = static_cast<size_t>(t.numel()), ranks = static_cast<size_t>(size_);
    for (size_t at = 0; at < n; at += bucket_) {
        const size_t len = std::min(bucket_, n - at);
        // Reduce-scatter wants equal parts: pad with zeros to a multiple of the rank count.
        const size_t part = ceil_div(len, ranks);
        staging_.resize(std::max(staging_.size(), part * ranks));
        part_.resize(std::max(part_.size(), part));
        const Tensor piece = t.slice(static_cast<int64_t>(at), {static_cast<int64_t>(len)});
        backend.download(piece, staging_.data());
        std::fill(staging_.begin() + len, staging_.begin() + part * ranks, 0.0f);
        {
            Watch watch(watchdog_.get(), "all_reduce_sum");
            MPI_Reduce_scatter_block(staging_.data(), part_.data(), as_count(part), MPI_FLOAT,
                                     MPI_SUM, MPI_COMM_WORLD);
            MPI_Allgather(part_.data(), as_count(part), MPI_FLOAT, staging_.data(), as_count(part),
                          MPI_FLOAT, MPI_COMM_WORLD);
        }
        backend.upload(piece, staging_.data());
    }
}

void MpiCommunicator::reduce_scatter_sum(Backend& backend, const Tensor& t, const Tensor& shard) {
    check_collective_tensors("reduce_scatter_sum", t, &shard, size_);
    const size_t n = static_cast<size_t>(shard.numel()), ranks = static_cast<size_t>(size_);
    const size_t step = std::max<size_t>(1, bucket_ / ranks);
    for (size_t at = 0; at < n; at += step) {
        const size_t len = std::min(step, n - at);
        staging_.resize(std::max(staging_.size(), len * ranks));
        part_.resize(std::max(part_.size(), len));
        // Elements [at, at + len) of every rank's part, packed side by side.
        for (size_t r = 0; r < ranks; ++r)
            backend.download(t.slice(static_cast<int64_t>(r * n + at), {static_cast<int64_t>(len)}),
                             staging_.data() + r * len);
        {
            Watch watch(watchdog_.get(), "reduce_scatter_sum");
            MPI_Reduce_scatter_block(staging_.data(), part_.data(), as_count(len), MPI_FLOAT,
                                     MPI_SUM, MPI_COMM_WORLD);
        }
        backend.upload(shard.slice(static_cast<int64_t>(at), {static_cast<int64_t>(len)}),
                       part_.data());
    }
}

void MpiCommunicator::all_gather(Backend& backend, const Tensor& shard, const Tensor& t) {
    check_collective_tensors("all_gather", t, &shard, size_);
    const size_t n = static_cast<size_t>(shard.numel()), ranks = static_cast<size_t>(size_);
    const size_t step = std::max<size_t>(1, bucket_ / ranks);
    for (size_t at = 0; at < n; at += step) {
        const size_t len = std::min(step, n - at);
        staging_.resize(std::max(staging_.size(), len * ranks));
        part_.resize(std::max(part_.size(), len));
        backend.download(shard.slice(static_cast<int64_t>(at), {static_cast<int64_t>(len)}),
                         part_.data());
        {
            Watch watch(watchdog_.get(), "all_gather");
            MPI_Allgather(part_.data(), as_count(len), MPI_FLOAT, staging_.data(), as_count(len),
                          MPI_FLOAT, MPI_COMM_WORLD);
        }
        for (size_t r = 0; r < ranks; ++r)
            backend.upload(t.slice(static_cast<int64_t>(r * n + at), {static_cast<int64_t>(len)}),
                           staging_.data() + r * len);
    }
}

void MpiCommunicator::broadcast(Backend& backend, const Tensor& t, int root) {
    check_collective_tensors("broadcast", t, nullptr, size_);
    check_collective_root("broadcast", root, size_);
    const size_t n = static_cast<size_t>(t.numel());
    for (size_t at = 0; at < n; at += bucket_) {
        const size_t len = std::min(bucket_, n - at);
        staging_.resize(std::max(staging_.size(), len));
        const Tensor piece = t.slice(static_cast<int64_t>(at), {static_cast<int64_t>(len)});
        if (rank_ == root) backend.download(piece, staging_.data());
        {
            Watch watch(watchdog_.get(), "broadcast");
            MPI_Bcast(staging_.data(), as_count(len), MPI_FLOAT, root, MPI_COMM_WORLD);
        }
        if (rank_ != root) backend.upload(piece, staging_.data());
    }
}

void MpiCommunicator::abort(const std::string& message, int code) {
    if (!message.empty()) std::fprintf(stderr, "tmx: rank %d: %s\n", rank_, message.c_str());
    std::fflush(stdout);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);  // MPI_Abort does not return; [[noreturn]] either way
}

}  // namespace tmx

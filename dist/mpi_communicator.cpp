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

// out = shares[0] + shares[1] + ... + shares[ranks - 1], element by element in that order, where
// shares holds `ranks` runs of `count` floats: the one order every rank and every collective
// here sums in.
void sum_in_rank_order(const float* shares, size_t count, size_t ranks, float* out) {
    std::copy(shares, shares + count, out);
    for (size_t r = 1; r < ranks; ++r) {
        const float* share = shares + r * count;
        for (size_t i = 0; i < count; ++i) out[i] += share[i];
    }
}

}  // namespace

// Started sums exchange and gather on communicators of their own: each bucket's all-gather
// starts when its exchange has completed on this rank, which differs between ranks, while
// MPI wants the collectives of one communicator started in the same order everywhere. On
// these two, each kind starts in bucket order on every rank.
struct MpiCommunicator::SumComms {
    MPI_Comm exchange = MPI_COMM_NULL, gather = MPI_COMM_NULL;
};

struct MpiCommunicator::Sum {
    enum class Stage { Exchanging, Gathering, Done };
    Backend* backend = nullptr;
    Tensor piece;             // the bucket's elements of the tensor
    size_t part = 0;          // elements per rank's part (the bucket padded to ranks * part)
    std::vector<float> out;   // [ranks][part]: this rank's bucket, then every part's sum
    std::vector<float> in;    // [ranks][part]: every rank's share of this rank's part
    std::vector<float> mine;  // [part]: this rank's part, summed
    MPI_Request request = MPI_REQUEST_NULL;
    Stage stage = Stage::Done;
};

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
    sum_comms_ = std::make_unique<SumComms>();
    Watch watch(watchdog_.get(), "MPI_Comm_dup");
    MPI_Comm_dup(MPI_COMM_WORLD, &sum_comms_->exchange);
    MPI_Comm_dup(MPI_COMM_WORLD, &sum_comms_->gather);
}

MpiCommunicator::~MpiCommunicator() {
    if (std::uncaught_exceptions() > 0) {
        watchdog_.reset();
        return;
    }
    {
        Watch watch(watchdog_.get(), "MPI_Finalize");
        // Every started sum was finished (the backend its results go to may be gone by now).
        MPI_Comm_free(&sum_comms_->exchange);
        MPI_Comm_free(&sum_comms_->gather);
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
    start_all_reduce_sum(backend, t);
    finish_sums();
}

void MpiCommunicator::start_all_reduce_sum(Backend& backend, const Tensor& t) {
    check_collective_tensors("start_all_reduce_sum", t, nullptr, size_);
    const size_t n = static_cast<size_t>(t.numel()), ranks = static_cast<size_t>(size_);
    for (size_t at = 0; at < n; at += bucket_) {
        while (sums_.size() >= kSumsInFlight) advance_sums(/*wait=*/true);
        std::unique_ptr<Sum> sum;
        if (spare_.empty()) {
            sum = std::make_unique<Sum>();
        } else {
            sum = std::move(spare_.back());
            spare_.pop_back();
        }
        const size_t len = std::min(bucket_, n - at);
        // Parts of equal size: the bucket padded with zeros to a multiple of the rank count.
        sum->part = ceil_div(len, ranks);
        sum->out.resize(sum->part * ranks);
        sum->in.resize(sum->part * ranks);
        sum->mine.resize(sum->part);
        sum->backend = &backend;
        sum->piece = t.slice(static_cast<int64_t>(at), {static_cast<int64_t>(len)});
        backend.download(sum->piece, sum->out.data());
        std::fill(sum->out.begin() + len, sum->out.end(), 0.0f);
        MPI_Ialltoall(sum->out.data(), as_count(sum->part), MPI_FLOAT, sum->in.data(),
                      as_count(sum->part), MPI_FLOAT, sum_comms_->exchange, &sum->request);
        sum->stage = Sum::Stage::Exchanging;
        sums_.push_back(std::move(sum));
    }
}

void MpiCommunicator::advance_sums(bool wait) {
    if (sums_.empty()) return;
    if (wait) {
        Watch watch(watchdog_.get(), "all_reduce_sum");
        MPI_Wait(&sums_.front()->request, MPI_STATUS_IGNORE);  // then tested as done below
    }
    const size_t ranks = static_cast<size_t>(size_);
    for (auto& sum : sums_) {
        int done = 0;
        if (sum->stage == Sum::Stage::Exchanging) {
            MPI_Test(&sum->request, &done, MPI_STATUS_IGNORE);
            // The later buckets are exchanging too: their gathers start after this one's.
            if (!done) break;
            sum_in_rank_order(sum->in.data(), sum->part, ranks, sum->mine.data());
            MPI_Iallgather(sum->mine.data(), as_count(sum->part), MPI_FLOAT, sum->out.data(),
                           as_count(sum->part), MPI_FLOAT, sum_comms_->gather, &sum->request);
            sum->stage = Sum::Stage::Gathering;
        } else if (sum->stage == Sum::Stage::Gathering) {
            MPI_Test(&sum->request, &done, MPI_STATUS_IGNORE);
            if (!done) continue;
            sum->backend->upload(sum->piece, sum->out.data());
            sum->stage = Sum::Stage::Done;
        }
    }
    while (!sums_.empty() && sums_.front()->stage == Sum::Stage::Done) {
        sums_.front()->piece = Tensor{};
        spare_.push_back(std::move(sums_.front()));
        sums_.pop_front();
    }
}

void MpiCommunicator::finish_sums() {
    while (!sums_.empty()) advance_sums(/*wait=*/true);
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
        received_.resize(std::max(received_.size(), len * ranks));
        {
            Watch watch(watchdog_.get(), "reduce_scatter_sum");
            MPI_Alltoall(staging_.data(), as_count(len), MPI_FLOAT, received_.data(), as_count(len),
                         MPI_FLOAT, MPI_COMM_WORLD);
        }
        sum_in_rank_order(received_.data(), len, ranks, part_.data());
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

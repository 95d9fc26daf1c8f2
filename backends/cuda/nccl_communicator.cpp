#include "backends/cuda/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <thread>

#include "backends/cuda/cuda_backend.h"

// Non-blocking communicators and ncclCommGetAsyncError's ncclInProgress state: NCCL 2.14.
#if NCCL_VERSION_CODE < NCCL_VERSION(2, 14, 0)
#error "the NCCL communicator needs NCCL 2.14 or newer"
#endif

namespace tmx {

namespace {

using Clock = std::chrono::steady_clock;

// Polls `done` until it returns true; false when `timeout_s` (> 0) passed first. Short sleeps
// between polls: a collective of a training step takes milliseconds, and a spinning host thread
// would take a core from the data loader.
template <typename Done>
bool poll_until(double timeout_s, Done done) {
    const auto start = Clock::now();
    const auto limit = std::chrono::duration<double>(timeout_s);
    for (int polls = 0;; ++polls) {
        if (done()) return true;
        if (timeout_s > 0 && Clock::now() - start > limit) return false;
        if (polls > 100) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
}

std::string nccl_error(ncclResult_t r) {
    std::string why = ncclGetErrorString(r);
    // The detail of the last error in this process (NCCL keeps one, not one per call).
    if (const char* last = ncclGetLastError(nullptr); last && *last)
        why += std::string(": ") + last;
    return why;
}

}  // namespace

NcclCommunicator::NcclCommunicator(CudaBackend& backend, std::unique_ptr<Communicator> host,
                                   double timeout_s)
    : backend_(backend),
      host_(std::move(host)),
      rank_(host_->rank()),
      size_(host_->size()),
      timeout_s_(timeout_s) {
    // NCCL binds a communicator to the device current at its creation.
    if (const cudaError_t e = cudaSetDevice(backend_.device().index); e != cudaSuccess)
        fail("setup", std::string("cudaSetDevice: ") + cudaGetErrorString(e));
    ncclUniqueId id;
    std::memset(&id, 0, sizeof id);
    std::string bytes;
    if (rank_ == 0) {
        // A failure here ends every rank (fail() aborts through the host communicator), so no
        // rank waits in the broadcast for an id that never comes.
        if (const ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess)
            fail("ncclGetUniqueId", nccl_error(r));
        bytes.assign(reinterpret_cast<const char*>(&id), sizeof id);
    }
    host_->broadcast(bytes, 0);
    if (bytes.size() != sizeof id)
        fail("setup", "the bootstrap id has " + std::to_string(bytes.size()) + " bytes, expected " +
                          std::to_string(sizeof id));
    std::memcpy(&id, bytes.data(), sizeof id);

    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    const ncclResult_t r = ncclCommInitRankConfig(&comm, size_, id, rank_, &config);
    comm_ = comm;
    wait_issued("ncclCommInitRankConfig", r);
}

NcclCommunicator::~NcclCommunicator() {
    if (sum_ready_) cudaEventDestroy(sum_ready_);
    if (sum_stream_) cudaStreamDestroy(sum_stream_);  // returns at once; freed once idle
    if (!comm_) return;
    // Leaving on an error: peers may never finish with us, so do not wait for them.
    if (std::uncaught_exceptions() > 0) {
        ncclCommAbort(comm_);
        return;
    }
    // ncclCommFinalize flushes this rank's operations (non-blocking: its state goes from
    // ncclInProgress to ncclSuccess); only then does ncclCommDestroy free without blocking.
    ncclResult_t state = ncclCommFinalize(comm_);
    if (state == ncclInProgress || state == ncclSuccess) {
        poll_until(timeout_s_, [&] {
            if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) state = ncclInternalError;
            return state != ncclInProgress;
        });
    }
    if (state == ncclSuccess)
        ncclCommDestroy(comm_);
    else
        ncclCommAbort(comm_);
}

std::string NcclCommunicator::description() const {
    return "NCCL, " + std::to_string(size_) + (size_ == 1 ? " rank" : " ranks") +
           " (bootstrap: " + host_->description() + ")";
}

void NcclCommunicator::check_backend(const Backend& backend, const char* op) const {
    if (&backend != &backend_)
        throw std::logic_error(std::string("NcclCommunicator::") + op +
                               ": not the backend the communicator was made for");
}

void NcclCommunicator::wait_issued(const char* op, int result) {
    ncclResult_t state = static_cast<ncclResult_t>(result);
    if (state == ncclInProgress) {
        const bool settled = poll_until(timeout_s_, [&] {
            if (const ncclResult_t r = ncclCommGetAsyncError(comm_, &state); r != ncclSuccess)
                state = r;
            return state != ncclInProgress;
        });
        if (!settled) fail(op, "");
    }
    if (state != ncclSuccess) fail(op, nccl_error(state));
}

void NcclCommunicator::wait_done(const char* op, cudaStream_t stream) {
    if (!stream) stream = backend_.stream();
    cudaError_t cuda = cudaSuccess;
    ncclResult_t state = ncclSuccess;
    const bool settled = poll_until(timeout_s_, [&] {
        cuda = cudaStreamQuery(stream);
        if (cuda != cudaErrorNotReady) return true;
        // A peer that failed shows as an asynchronous error while our kernels wait for it.
        if (const ncclResult_t r = ncclCommGetAsyncError(comm_, &state); r != ncclSuccess)
            state = r;
        return state != ncclSuccess && state != ncclInProgress;
    });
    if (!settled) fail(op, "");
    if (state != ncclSuccess && state != ncclInProgress) fail(op, nccl_error(state));
    if (cuda != cudaSuccess) fail(op, std::string("CUDA: ") + cudaGetErrorString(cuda));
}

void NcclCommunicator::check_cuda(const char* op, const char* call, int error) {
    const auto e = static_cast<cudaError_t>(error);
    if (e != cudaSuccess) fail(op, std::string(call) + ": " + cudaGetErrorString(e));
}

void NcclCommunicator::fail(const char* op, const std::string& why) {
    if (comm_) ncclCommAbort(comm_);  // stops this rank's NCCL kernels and threads
    comm_ = nullptr;
    const std::string where =
        "NCCL (rank " + std::to_string(rank_) + " of " + std::to_string(size_) + "): ";
    std::string message = where + op + " failed: " + why;
    if (why.empty()) {
        char seconds[32];
        std::snprintf(seconds, sizeof seconds, "%g", timeout_s_);
        message = where + "no progress in " + op + " for " + seconds +
                  " s: another rank has hung or died; ending the job";
    }
    host_->abort(message, 1);
    std::_Exit(1);  // not reached: a virtual call is not known to be [[noreturn]]
}

void NcclCommunicator::all_reduce_sum(Backend& backend, const Tensor& t) {
    const char* op = "all_reduce_sum";
    check_backend(backend, op);
    check_collective_tensors(op, t, nullptr, size_);
    if (t.numel() == 0) return;
    float* p = CudaBackend::data<float>(t);
    wait_issued(op, ncclAllReduce(p, p, static_cast<size_t>(t.numel()), ncclFloat32, ncclSum, comm_,
                                  backend_.stream()));
    wait_done(op);
}

void NcclCommunicator::start_all_reduce_sum(Backend& backend, const Tensor& t) {
    const char* op = "start_all_reduce_sum";
    check_backend(backend, op);
    check_collective_tensors(op, t, nullptr, size_);
    if (t.numel() == 0) return;
    if (!sum_stream_) {
        check_cuda(op, "cudaStreamCreateWithFlags",
                   cudaStreamCreateWithFlags(&sum_stream_, cudaStreamNonBlocking));
        check_cuda(op, "cudaEventCreateWithFlags",
                   cudaEventCreateWithFlags(&sum_ready_, cudaEventDisableTiming));
    }
    // After what the backend's stream has been given so far (t's last writes among it); what
    // it is given next runs beside the sum.
    check_cuda(op, "cudaEventRecord", cudaEventRecord(sum_ready_, backend_.stream()));
    check_cuda(op, "cudaStreamWaitEvent", cudaStreamWaitEvent(sum_stream_, sum_ready_, 0));
    float* p = CudaBackend::data<float>(t);
    wait_issued(op, ncclAllReduce(p, p, static_cast<size_t>(t.numel()), ncclFloat32, ncclSum, comm_,
                                  sum_stream_));
    sums_started_ = true;
}

void NcclCommunicator::finish_sums() {
    if (!sums_started_) return;
    sums_started_ = false;
    // The host waits for the sums (bounded, watching NCCL's error state), so whatever the
    // backend's stream is given from here on runs after them.
    wait_done("finish_sums", sum_stream_);
}

void NcclCommunicator::reduce_scatter_sum(Backend& backend, const Tensor& t, const Tensor& shard) {
    const char* op = "reduce_scatter_sum";
    check_backend(backend, op);
    check_collective_tensors(op, t, &shard, size_);
    if (shard.numel() == 0) return;
    wait_issued(op, ncclReduceScatter(CudaBackend::data<float>(t), CudaBackend::data<float>(shard),
                                      static_cast<size_t>(shard.numel()), ncclFloat32, ncclSum,
                                      comm_, backend_.stream()));
    wait_done(op);
}

void NcclCommunicator::all_gather(Backend& backend, const Tensor& shard, const Tensor& t) {
    const char* op = "all_gather";
    check_backend(backend, op);
    check_collective_tensors(op, t, &shard, size_);
    if (shard.numel() == 0) return;
    wait_issued(op, ncclAllGather(CudaBackend::data<float>(shard), CudaBackend::data<float>(t),
                                  static_cast<size_t>(shard.numel()), ncclFloat32, comm_,
                                  backend_.stream()));
    wait_done(op);
}

void NcclCommunicator::broadcast(Backend& backend, const Tensor& t, int root) {
    const char* op = "broadcast";
    check_backend(backend, op);
    check_collective_tensors(op, t, nullptr, size_);
    check_collective_root(op, root, size_);
    if (t.numel() == 0) return;
    float* p = CudaBackend::data<float>(t);
    wait_issued(op, ncclBroadcast(p, p, static_cast<size_t>(t.numel()), ncclFloat32, root, comm_,
                                  backend_.stream()));
    wait_done(op);
}

void NcclCommunicator::abort(const std::string& message, int code) {
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
    host_->abort(message, code);
    std::_Exit(code);  // not reached
}

std::unique_ptr<Communicator> make_nccl_communicator(Backend& backend,
                                                     std::unique_ptr<Communicator> host,
                                                     double timeout_s) {
    auto* cuda = dynamic_cast<CudaBackend*>(&backend);
    if (!cuda)
        throw std::logic_error("make_nccl_communicator: the " + backend.name() +
                               " backend is not the CUDA backend");
    return std::make_unique<NcclCommunicator>(*cuda, std::move(host), timeout_s);
}

}  // namespace tmx

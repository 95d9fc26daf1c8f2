// Collectives on the CUDA backend's device memory with NCCL (built with TMX_HAS_NCCL), one GPU
// per rank. The ranks are those of a host communicator (MPI, or one process), which carries
// NCCL's bootstrap id and, afterwards, the host values and barriers.
//
// The communicator is non-blocking (NCCL's config.blocking = 0) so that no NCCL call can hang
// the process: setting it up and every collective are waited for with a bound (the timeout),
// polling NCCL's asynchronous error state. An NCCL error or a timeout aborts the NCCL
// communicator (ncclCommAbort) and ends the job through the host communicator, with a message
// naming the rank and NCCL's error.
//
// A tensor collective returns once its result is on the device (it waits for the backend's
// stream, so also for the work enqueued before it). NCCL's all-reduce algorithms all end by
// sending one reduced copy to every rank, so every rank gets the same bits. A started sum
// (start_all_reduce_sum) runs on a stream of its own after the work the backend's stream had
// when it started, so the kernels enqueued afterwards (the rest of a backward pass) run beside
// it; finish_sums() waits for it, bounded like the others.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/dist/communicator.h"

struct ncclComm;     // nccl.h: ncclComm_t is a pointer to it
struct CUstream_st;  // cuda_runtime.h: cudaStream_t is a pointer to it
struct CUevent_st;   // and cudaEvent_t to this

namespace tmx {

class CudaBackend;

class NcclCommunicator final : public Communicator {
  public:
    // Collective: every rank of `host` constructs one, each on its own GPU. timeout_s: the
    // longest wait for NCCL's setup or one collective (0: wait for ever).
    NcclCommunicator(CudaBackend& backend, std::unique_ptr<Communicator> host, double timeout_s);
    ~NcclCommunicator() override;
    NcclCommunicator(const NcclCommunicator&) = delete;
    NcclCommunicator& operator=(const NcclCommunicator&) = delete;

    int rank() const override { return rank_; }
    int size() const override { return size_; }
    std::string description() const override;

    // Host values and barriers: the host communicator's.
    void all_reduce_sum(std::vector<double>& values) override { host_->all_reduce_sum(values); }
    void broadcast(std::string& bytes, int root) override { host_->broadcast(bytes, root); }
    void barrier() override { host_->barrier(); }

    // Tensors on the backend this communicator was made with.
    void all_reduce_sum(Backend& backend, const Tensor& t) override;
    void reduce_scatter_sum(Backend& backend, const Tensor& t, const Tensor& shard) override;
    void all_gather(Backend& backend, const Tensor& shard, const Tensor& t) override;
    void broadcast(Backend& backend, const Tensor& t, int root) override;

    void start_all_reduce_sum(Backend& backend, const Tensor& t) override;
    void finish_sums() override;

    [[noreturn]] void abort(const std::string& message, int code) override;

  private:
    void check_backend(const Backend& backend, const char* op) const;
    // After an NCCL call that returned `result` (an ncclResult_t): waits, bounded, until NCCL
    // has finished the call's host side (ncclInProgress on a non-blocking communicator).
    void wait_issued(const char* op, int result);
    // Waits, bounded, until `stream` (the backend's by default) has run the collective.
    void wait_done(const char* op, CUstream_st* stream = nullptr);
    // A CUDA runtime call's error code: fail() unless it is cudaSuccess (0).
    void check_cuda(const char* op, const char* call, int error);
    [[noreturn]] void fail(const char* op, const std::string& why);

    CudaBackend& backend_;
    std::unique_ptr<Communicator> host_;
    ncclComm* comm_ = nullptr;
    int rank_ = 0, size_ = 1;
    double timeout_s_ = 0;
    // Started sums: their stream, made on first use, and the event that orders it after the
    // backend's stream.
    CUstream_st* sum_stream_ = nullptr;
    CUevent_st* sum_ready_ = nullptr;
    bool sums_started_ = false;
};

// A NcclCommunicator on `backend`, which must be the CUDA backend (std::logic_error otherwise).
std::unique_ptr<Communicator> make_nccl_communicator(Backend& backend,
                                                     std::unique_ptr<Communicator> host,
                                                     double timeout_s);

}  // namespace tmx

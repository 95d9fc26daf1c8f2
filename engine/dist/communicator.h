// The ranks of a data-parallel run and the collectives they train with
// (docs/design.md#15-layering).
//
// The engine sees this interface only: dist/ implements it on MPI (any backend, through host
// memory) and backends/cuda on NCCL (on the device, bootstrapped through an MPI communicator).
// A run on one process uses SoloCommunicator, whose collectives are the identity.
//
// Every collective is called by every rank in the same order with agreeing sizes; a rank that
// cannot go on calls abort(), which ends every rank of the job (no rank is left waiting in a
// collective). Results are identical bits on every rank, so replicated weights never drift.
#pragma once

#include <string>
#include <vector>

#include "engine/compute/backend.h"
#include "engine/compute/tensor.h"

namespace tmx {

class Communicator {
  public:
    virtual ~Communicator() = default;
    virtual int rank() const = 0;
    virtual int size() const = 0;
    // For logs: "MPI, 3 ranks", "NCCL, 2 ranks (bootstrap: MPI)".
    virtual std::string description() const = 0;

    // ---- host values (a few numbers per step: losses, counts, flags)
    // Element-wise sum over the ranks, in place (the sizes agree on every rank).
    virtual void all_reduce_sum(std::vector<double>& values) = 0;
    // root's bytes to every rank; the other ranks' `bytes` are replaced (any size).
    virtual void broadcast(std::string& bytes, int root) = 0;
    virtual void barrier() = 0;

    // ---- F32 tensors on `backend` (the backend the communicator was made for)
    // Sum over the ranks, in place.
    virtual void all_reduce_sum(Backend& backend, const Tensor& t) = 0;
    // t.numel() == size() * shard.numel(): shard = the sum over the ranks of t's part rank()
    // (elements [rank() * shard.numel(), (rank() + 1) * shard.numel())).
    virtual void reduce_scatter_sum(Backend& backend, const Tensor& t, const Tensor& shard) = 0;
    // The inverse layout: t's part r = rank r's shard, on every rank.
    virtual void all_gather(Backend& backend, const Tensor& shard, const Tensor& t) = 0;
    // root's t to every rank.
    virtual void broadcast(Backend& backend, const Tensor& t, int root) = 0;

    // ---- overlapped sums (gradient buckets summed while the backward pass goes on)
    // Starts summing t over the ranks, in place, with the result bits all_reduce_sum(backend, t)
    // gives; nothing may read or write t until finish_sums() returns. The work enqueued on the
    // backend before the call is what is summed (a device backend need not have run it yet).
    // Every rank starts the same sums in the same order, and calls finish_sums() before its next
    // other collective. This default sums at once.
    virtual void start_all_reduce_sum(Backend& backend, const Tensor& t) {
        all_reduce_sum(backend, t);
    }
    // Moves the started sums on without waiting: for transports that progress only inside the
    // caller's calls (MPI's non-blocking collectives). Cheap; call it between pieces of work.
    virtual void progress_sums() {}
    // Returns once every started sum is final (work enqueued on the backend afterwards sees it).
    virtual void finish_sums() {}

    // Ends every rank of the job with exit status `code`, after `message` (printed by this
    // rank, prefixed with its rank, when not empty).
    [[noreturn]] virtual void abort(const std::string& message, int code) = 0;
};

// One process: rank 0 of 1; every collective leaves its data as it is.
class SoloCommunicator final : public Communicator {
  public:
    int rank() const override { return 0; }
    int size() const override { return 1; }
    std::string description() const override { return "one process"; }
    void all_reduce_sum(std::vector<double>&) override {}
    void broadcast(std::string&, int) override {}
    void barrier() override {}
    void all_reduce_sum(Backend&, const Tensor&) override {}
    void reduce_scatter_sum(Backend& backend, const Tensor& t, const Tensor& shard) override;
    void all_gather(Backend& backend, const Tensor& shard, const Tensor& t) override;
    void broadcast(Backend&, const Tensor&, int) override {}
    [[noreturn]] void abort(const std::string& message, int code) override;
};

// What the launcher (mpirun, srun, mpiexec) put in the environment, read without MPI: so that a
// build without MPI can refuse to run as one of N uncoordinated copies.
struct LaunchEnv {
    int world_size = 1, world_rank = 0;  // 1 and 0 when not launched by an MPI launcher
    int local_size = 1, local_rank = 0;  // ranks on this node, and this one's index among them
    std::string launcher;                // "OpenMPI", "Slurm", "PMI"; "" when none
};
LaunchEnv detect_launch_env();

// For implementations: the arguments every implementation refuses alike (std::logic_error
// naming `op`): a tensor that is not F32, a shard whose size is not t's divided by `ranks`
// (when `shard` is given), a root outside [0, ranks).
void check_collective_tensors(const char* op, const Tensor& t, const Tensor* shard, int ranks);
void check_collective_root(const char* op, int root, int ranks);

}  // namespace tmx

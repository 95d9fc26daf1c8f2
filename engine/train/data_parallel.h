// Data parallelism's share of an optimizer step: the gradients summed over the ranks (in buckets
// started while the backward pass goes on, or after it), the global gradient norm, and AdamW over
// moments that every rank holds whole (replicated) or that each rank holds a share of (sharded,
// ZeRO-1: the gradients reduce-scattered, each rank stepping its share, the weights all-gathered).
// The trainer decides when a step is taken; this decides how it is spread. One process is rank 0
// of 1 (SoloCommunicator), where the sums are the identity and nothing is sharded.
#pragma once

#include <chrono>
#include <cstdint>
#include <utility>
#include <vector>

#include "engine/compute/backend.h"
#include "engine/dist/communicator.h"
#include "engine/model/model.h"

namespace tmx {

// How a run spreads over the ranks of a data-parallel job.
struct DataParallel {
    Communicator* comm = nullptr;  // nullptr: one process
    // ZeRO-1: each rank keeps and steps its share of the AdamW moments only (the gradients are
    // reduce-scattered, the stepped weights all-gathered). The same steps as replicated moments
    // (bit for bit on MPI; NCCL may add the ranks in another order); no effect on one rank.
    bool shard_optimizer = false;
    // Replicated moments: the last micro-batch's backward pass hands its finished gradients to
    // the communicator in buckets of at least this many bytes, so that summing them over the
    // ranks overlaps the rest of the pass. 0: one sum after the pass. The same bits either way.
    // (Sharded moments reduce-scatter after the pass.)
    int64_t bucket_bytes = int64_t{16} << 20;
};

// Refuses (a UsageError) a global batch of grad_accum micro-batches that `ranks` cannot share
// evenly.
void check_ranks_share_the_batch(int64_t grad_accum, int64_t batch_size, int ranks);

// Wall-clock seconds spent in collectives, as the host sees them (waiting for slower ranks
// included), for the progress reports' share of time in communication.
class CollectiveClock {
  public:
    // Runs a collective, adding its time.
    template <class F>
    void time(F&& collective) {
        const auto start = std::chrono::steady_clock::now();
        collective();
        seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    // The seconds added since the last take().
    double take() { return std::exchange(seconds_, 0.0); }

  private:
    double seconds_ = 0.0;
};

// The AdamW moments of one rank and the collectives of a step. `model`, `backend`, `comm` and
// `clock` outlive it; every rank makes one alike and calls its collectives in the same order.
class DataParallelOptimizer {
  public:
    // Allocates this rank's moments, zero. Throws std::invalid_argument for a bucket_bytes < 0.
    DataParallelOptimizer(Model& model, Backend& backend, Communicator& comm,
                          const DataParallel& dp, CollectiveClock& clock);

    // Whether the last backward pass of a step starts the gradient sums (replicated moments,
    // DataParallel::bucket_bytes > 0): pass start_gradient_sums() to it, then
    // reduce_gradients(true).
    bool overlaps_backward() const { return bucket_elements_ > 0; }
    // The hook the last backward pass of a step calls (Model::GradsFinal): starts summing each
    // run of finished gradients once it holds bucket_elements_ (and the last run at offset 0).
    Model::GradsFinal start_gradient_sums();
    // Sums the micro-batches' gradients over the ranks (each rank's own share of them when the
    // optimizer is sharded) and returns the global gradient norm. `started`: the backward pass
    // has started the sums of all of them (replicated moments, overlapped buckets): finish them.
    double reduce_gradients(bool started);
    // The AdamW step of this rank's moments, then (sharded) the all-gather of the weights.
    void step(const Backend::AdamWParams& hp);

    // The full moments on rank 0 (a collective when sharded; empty on the other ranks).
    void moments_to_host(std::vector<float>& m, std::vector<float>& v);
    // This rank's part of the full moments `m`, `v` (host, num_params each) to the device.
    void moments_from_host(const std::vector<float>& m, const std::vector<float>& v);
    // Bytes of AdamW moments this rank holds (smaller by the rank count when sharded).
    int64_t moment_bytes() const { return 2 * adam_m_.bytes(); }

  private:
    int rank() const { return comm_.rank(); }
    int ranks() const { return comm_.size(); }
    bool is_root() const { return rank() == 0; }
    template <class F>
    void timed(F&& collective) {
        clock_.time(std::forward<F>(collective));
    }

    Model& model_;
    Backend& backend_;
    Communicator& comm_;
    CollectiveClock& clock_;
    // Sharded moments: this rank owns the parameters [rank * shard_, (rank + 1) * shard_) and,
    // like every rank, the tail [ranks * shard_, num_params) that does not divide evenly.
    bool sharded_ = false;
    int64_t shard_ = 0, tail_ = 0;
    // Gradients per overlapped bucket (DataParallel::bucket_bytes); 0: no overlap.
    int64_t bucket_elements_ = 0;
    Tensor adam_m_, adam_v_;
};

}  // namespace tmx

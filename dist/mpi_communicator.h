// The ranks of a job launched by mpirun or srun, over MPI_COMM_WORLD (built with TMX_HAS_MPI).
//
// Tensors of any backend travel through host memory, a bucket at a time, so the staging memory
// stays bounded however large the model. Identical bits on every rank: a tensor sum sends each
// rank the others' shares of the part it owns (an all-to-all), adds them in rank order (0, 1,
// ...; never in an order MPI's algorithm picks, which may differ with the message size), and
// all-gathers the sums. Every element's sum is thus the same bits whatever the bucketing, the
// rank count's algorithm or the collective (all-reduce, reduce-scatter, started or blocking).
// A host sum is reduced on rank 0 and broadcast from there.
//
// Started sums (start_all_reduce_sum) are MPI's non-blocking collectives on communicators of
// their own, at most kSumsInFlight buckets at once; they progress inside progress_sums() and
// the other calls of this class.
//
// A watchdog bounds every blocking MPI call: a call that has not returned after the timeout
// prints which collective made no progress and ends this process (std::_Exit(1)); mpirun then
// ends the other ranks. No job waits forever on a rank that hung or died. Work one rank does
// while the others wait in a collective (rank 0 writing a checkpoint while the rest wait in a
// barrier) counts against the timeout.
#pragma once

#include <cstddef>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "engine/dist/communicator.h"

namespace tmx {

struct MpiOptions {
    // Longest wait in one MPI call before the job is ended; 0: wait for ever.
    double collective_timeout_s = 600;
    // Elements per host staging bucket (4 Mi floats: 16 MiB per buffer).
    size_t bucket_elements = size_t{4} << 20;
};

class MpiCommunicator final : public Communicator {
  public:
    // Initialises MPI (MPI_THREAD_FUNNELED: only this thread calls MPI). One per process: MPI
    // cannot be initialised again after MPI_Finalize.
    explicit MpiCommunicator(const MpiOptions& options = {});
    // MPI_Finalize; skipped while an exception unwinds (a rank leaving on an error must not
    // wait in MPI_Finalize for ranks that wait for it: mpirun ends the job when it exits).
    // Where every rank stops alike (an interrupt), destroy it in the catch block instead, which
    // finalises.
    ~MpiCommunicator() override;
    MpiCommunicator(const MpiCommunicator&) = delete;
    MpiCommunicator& operator=(const MpiCommunicator&) = delete;

    int rank() const override { return rank_; }
    int size() const override { return size_; }
    std::string description() const override;

    void all_reduce_sum(std::vector<double>& values) override;
    void broadcast(std::string& bytes, int root) override;
    void barrier() override;

    void all_reduce_sum(Backend& backend, const Tensor& t) override;
    void reduce_scatter_sum(Backend& backend, const Tensor& t, const Tensor& shard) override;
    void all_gather(Backend& backend, const Tensor& shard, const Tensor& t) override;
    void broadcast(Backend& backend, const Tensor& t, int root) override;

    void start_all_reduce_sum(Backend& backend, const Tensor& t) override;
    void progress_sums() override { advance_sums(/*wait=*/false); }
    void finish_sums() override;

    // Buckets of started sums in flight at once; starting another first waits for the oldest.
    static constexpr size_t kSumsInFlight = 4;

    // "tmx: rank R: message" on stderr, then MPI_Abort.
    [[noreturn]] void abort(const std::string& message, int code) override;

  private:
    class Watchdog;
    struct Watch;     // arms the watchdog for the lifetime of one MPI call
    struct Sum;       // one bucket of a started sum, in flight (MPI types: in the .cpp)
    struct SumComms;  // the communicators started sums use (MPI types: in the .cpp)

    // Moves the started sums on as far as they have got; with `wait`, first waits until the
    // oldest has finished its current stage.
    void advance_sums(bool wait);

    int rank_ = 0, size_ = 1;
    size_t bucket_;
    std::unique_ptr<Watchdog> watchdog_;            // null without a timeout
    std::vector<float> staging_, received_, part_;  // host buffers, reused across calls
    std::unique_ptr<SumComms> sum_comms_;
    std::deque<std::unique_ptr<Sum>> sums_;    // started, oldest first
    std::vector<std::unique_ptr<Sum>> spare_;  // finished: their buffers serve the next
};

}  // namespace tmx

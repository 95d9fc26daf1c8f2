// Training on any backend: data sampling, the AdamW step with warmup + cosine schedule and
// global-norm clipping, evaluation, metrics, and resumable checkpoints. Device-independent:
// it talks to the model and the Backend interface only.
//
// A run directory holds step_NNNNNNNN/ checkpoints (the last keep_last of them), best/ (the
// checkpoint with the lowest validation loss) and metrics.jsonl. Each checkpoint carries the
// optimizer moments (optimizer.safetensors, F32) and trainer_state.json (step, best validation
// loss, every option). Batches are a pure function of (seed, step), so a run stopped at step k
// and resumed continues exactly as the uninterrupted run would have.
//
// Data parallelism (`mpirun -np N tmx train`): the run defines its global batch and its data
// order, not the number of ranks. options().grad_accum counts the micro-batches of one optimizer
// step over all ranks; rank r computes the micro-batches [r * L, (r + 1) * L) of each step, L =
// grad_accum / N, and the gradients are summed over the ranks before the step. So N ranks take
// the steps of one process accumulating all grad_accum micro-batches (equal up to the order of
// the sums), and a run may resume on any N that divides grad_accum. Rank 0 alone writes the run
// directory (lock, metrics, checkpoints in the format of a one-process run) and reports.
//
// A trainer holds RUN/train.lock while it lives, so two processes never write one run; a
// checkpoint write that was killed leaves a temporary sibling (step_N.tmp-PID) that is never
// taken for a checkpoint and is removed by the next trainer of the run. No non-finite value
// reaches a checkpoint: a step whose loss or gradient norm is not finite is not applied (it is
// skipped, up to skip_nonfinite times, else the run stops with an error).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/compute/precision.h"
#include "engine/core/errors.h"
#include "engine/data/dataset.h"
#include "engine/model/adamw.h"
#include "engine/model/model.h"
#include "engine/model/training_memory.h"
#include "engine/train/run_dir.h"
#include "engine/train/train_options.h"

namespace tmx {

// One progress report (every log_every steps, after evaluations and at the end).
struct TrainReport {
    int64_t step = 0, max_steps = 0;
    int64_t tokens = 0;              // training tokens consumed so far
    double loss = 0.0, aux = 0.0;    // mean over the steps since the last report
    std::optional<double> val_loss;  // when this step evaluated
    double lr = 0.0, grad_norm = 0.0;
    double tokens_per_s = 0.0, eta_s = 0.0, elapsed_s = 0.0;  // tokens of all ranks
    // Under data parallelism: the share of the time since the last report this rank spent in
    // collectives, as the host sees it (waiting for slower ranks included; MPI's collectives
    // block, NCCL's are only enqueued and show up in the next read from the device).
    std::optional<double> comm_share;
    // Per layer, the share of routed (token, choice) slots each expert received since the last
    // report (MoE models).
    std::vector<std::vector<double>> expert_load;
    int64_t skipped = 0;     // non-finite steps skipped since the last report
    std::string checkpoint;  // a checkpoint written at this step, if any
};

// Polled before every micro-batch and every evaluation batch: true stops the run. Under data
// parallelism the ranks stop together when any of them sees true.
using StopPredicate = std::function<bool()>;

class Communicator;

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

class RunDirLock;

class Trainer {
  public:
    // A new run: fresh weights from init_seed, written into run_dir (created; an existing run
    // there is refused).
    static std::unique_ptr<Trainer> start(const ModelConfig& config, const TrainOptions& options,
                                          const std::string& run_dir, uint64_t init_seed,
                                          Backend& backend, DataParallel dp = {});
    // Continues a run from a run directory (its latest checkpoint) or one of its checkpoints.
    // `overrides` may change the budget and the cadence options (not the math).
    static std::unique_ptr<Trainer> resume(const std::string& path, Backend& backend,
                                           const nlohmann::json& overrides, DataParallel dp = {});

    ~Trainer();

    // Trains until the budget is reached or *stop becomes true. The flag is checked before
    // every micro-batch and evaluation batch: a step it interrupts is dropped (it is redone on
    // resume) and an interrupted evaluation is recorded as due. A checkpoint of the last
    // completed step is written at the end either way. Throws tmx::Error when a step is not
    // finite beyond skip_nonfinite (no checkpoint is written then), and when metrics.jsonl
    // cannot be written (after a last checkpoint attempt). Returns the last report.
    TrainReport run(const std::function<void(const TrainReport&)>& on_report,
                    const std::atomic<bool>* stop = nullptr);
    TrainReport run(const std::function<void(const TrainReport&)>& on_report,
                    const StopPredicate& should_stop);

    Model& model() { return *model_; }
    const TrainOptions& options() const { return options_; }
    int64_t step() const { return step_; }
    int64_t max_steps() const { return max_steps_; }
    const std::string& run_dir() const { return run_dir_; }
    // The run's latest step checkpoint written or resumed from; "" before the first.
    const std::string& last_checkpoint() const { return last_checkpoint_; }

    // Learning rate at a 0-based step: linear warmup, then cosine decay to min_lr at max_steps.
    static double learning_rate(const TrainOptions& o, int64_t step, int64_t max_steps);

    // Mean cross-entropy over the validation windows (a collective under data parallelism).
    double evaluate();

    // This rank's index and the number of ranks (0 and 1 in one process).
    int rank() const;
    int ranks() const;
    // Bytes of AdamW moments this rank holds (smaller by the rank count when sharded).
    int64_t optimizer_bytes() const { return 2 * adam_m_.bytes(); }

  private:
    // The steps since the last progress report: what its averages are made of. Saved in
    // checkpoints, so that the first report after a resume averages the same steps as in the
    // uninterrupted run.
    struct ReportWindow {
        int64_t applied = 0, skipped = 0;
        double loss_sum = 0.0, aux_sum = 0.0, grad_norm_sum = 0.0;
        std::vector<std::vector<int64_t>> expert_slots;
    };
    enum class StepOutcome { Applied, Skipped, Interrupted };

    Trainer(std::unique_ptr<Model> model, TrainOptions options, std::string run_dir,
            Backend& backend, DataParallel dp);
    bool is_root() const { return rank() == 0; }
    // should_stop, agreed over the ranks.
    bool stop_requested(const StopPredicate& should_stop);
    // Sums the micro-batches' gradients over the ranks (each rank's own share of them when the
    // optimizer is sharded) and returns the global gradient norm. `started`: the backward pass
    // has started the sums of all of them (replicated moments, overlapped buckets): finish them.
    double reduce_gradients(bool started);
    // The hook the last backward pass of a step calls (Model::GradsFinal): starts summing each
    // run of finished gradients once it holds bucket_elements_ (and the last run at offset 0).
    Model::GradsFinal start_gradient_sums();
    // The AdamW step of this rank's moments, then (sharded) the all-gather of the weights.
    void optimizer_step(const Backend::AdamWParams& hp);
    // The full moments on rank 0 (a collective when sharded; empty on the other ranks).
    void moments_to_host(std::vector<float>& m, std::vector<float>& v);
    // This rank's part of the full moments `m`, `v` (host, num_params each) to the device.
    void moments_from_host(const std::vector<float>& m, const std::vector<float>& v);
    void open_data();
    // The micro-batch `micro` of optimizer step `step`: inputs and shifted targets.
    void sample_batch(int64_t step, int64_t micro, std::vector<int32_t>& inputs,
                      std::vector<int32_t>& targets) const;
    // One optimizer step, added to window_.
    StepOutcome train_step(const StopPredicate& should_stop);
    // A step whose loss or gradient norm is not finite: logs it, then skips it while the
    // budget of skip_nonfinite lasts, else throws.
    StepOutcome reject_nonfinite(const std::string& what, double loss, double aux,
                                 std::optional<double> grad_norm);
    // The work after step_: evaluation (and best/), report, checkpoint. False when
    // should_stop interrupted the evaluation (finish_pending_ stays set).
    bool finish_step(const StopPredicate& should_stop,
                     const std::function<void(const TrainReport&)>& on_report, TrainReport& report);
    // Mean validation loss, or nullopt when should_stop interrupted it.
    std::optional<double> evaluate_until(const StopPredicate& should_stop);
    std::string save(bool is_best_copy_too);
    void prune_checkpoints();
    void append_metrics(const nlohmann::json& line);
    // Appends the line of a failure about to be thrown; "" or what kept it from the file.
    std::string log_before_error(const nlohmann::json& line);
    // "the last checkpoint is RUN/step_N", for the messages of a run that stops.
    std::string last_checkpoint_phrase() const;
    // Continues the run state of a checkpoint's trainer_state.json.
    void restore_state(const nlohmann::json& state, const std::string& source);
    // Drops the metrics lines logged after step_ (they are logged again).
    void trim_metrics();
    // metrics.jsonl failed: a checkpoint of the current state if it has none, then the error.
    [[noreturn]] void stop_after_metrics_failure(const Error& failure);

    std::unique_ptr<Model> model_;
    TrainOptions options_;
    std::string run_dir_;
    Backend& backend_;
    // The backend's mode while the trainer lives: the run's precision, in training mode.
    std::optional<Backend::ModeScope> mode_;
    std::unique_ptr<Communicator> solo_;  // the communicator of a one-process run
    Communicator* comm_ = nullptr;
    // Sharded moments: this rank owns the parameters [rank * shard_, (rank + 1) * shard_) and,
    // like every rank, the tail [ranks * shard_, num_params) that does not divide evenly.
    bool sharded_ = false;
    int64_t shard_ = 0, tail_ = 0;
    // Gradients per overlapped bucket (DataParallel::bucket_bytes); 0: no overlap.
    int64_t bucket_elements_ = 0;
    std::unique_ptr<RunDirLock> lock_;
    std::string tokenizer_path_;
    std::optional<TokenDataset> train_data_, val_data_;
    Tensor adam_m_, adam_v_;
    int64_t seq_len_ = 0, max_steps_ = 0, step_ = 0;
    double best_val_loss_ = 0.0;
    bool has_best_ = false;
    int64_t nonfinite_skipped_ = 0;  // over the whole run
    ReportWindow window_;
    bool finish_pending_ = false;  // step_'s evaluation, report or checkpoint not yet done
    bool unsaved_ = false;         // the state has changed since the last step checkpoint
    std::string last_checkpoint_;
    // Timing of the current run() call, for the reports' throughput and ETA.
    std::chrono::steady_clock::time_point run_start_, last_report_time_;
    int64_t run_start_step_ = 0, last_report_step_ = 0;
    double comm_seconds_ = 0.0;  // in collectives since the last report
    // Runs a collective, adding its time to comm_seconds_.
    template <class F>
    void timed(F&& collective);
};

}  // namespace tmx

// Training on any backend: data sampling, the AdamW step with warmup + cosine schedule and
// global-norm clipping, evaluation, metrics, and resumable checkpoints. Device-independent:
// it talks to the model and the Backend interface only.
//
// The trainer is the step loop: what is due when. Its parts, each usable alone: what a run reads
// (train_data.h), the gradient sums across ranks and the AdamW step (data_parallel.h), the
// run's files (run_store.h, over run_dir.h), a progress report (train_report.h), and the
// options with their schedule (train_options.h).
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
#include "engine/train/data_parallel.h"
#include "engine/train/run_dir.h"
#include "engine/train/run_store.h"
#include "engine/train/train_data.h"
#include "engine/train/train_options.h"
#include "engine/train/train_report.h"

namespace tmx {

// Polled before every micro-batch and every evaluation batch: true stops the run. Under data
// parallelism the ranks stop together when any of them sees true.
using StopPredicate = std::function<bool()>;

class Trainer {
  public:
    // A new run: fresh weights from init_seed, written into run_dir (created; an existing run
    // there is refused).
    static std::unique_ptr<Trainer> start(const ModelConfig& config, const TrainOptions& options,
                                          const std::string& run_dir, uint64_t init_seed,
                                          Backend& backend, DataParallel dp = {});
    // Continues a run from a run directory (its latest checkpoint) or one of its checkpoints.
    // `overrides` may change the budget, the cadence options and the backend the run records
    // (not the math).
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

    // Mean cross-entropy over the validation windows (a collective under data parallelism).
    double evaluate();

    // This rank's index and the number of ranks (0 and 1 in one process).
    int rank() const { return comm_->rank(); }
    int ranks() const { return comm_->size(); }
    // Bytes of AdamW moments this rank holds (smaller by the rank count when sharded).
    int64_t optimizer_bytes() const { return optimizer_->moment_bytes(); }

  private:
    enum class StepOutcome { Applied, Skipped, Interrupted };
    // What is due after a step: an evaluation (and best/), a progress report (and its metrics
    // line), a step checkpoint.
    struct DueWork {
        bool evaluation = false, report = false, checkpoint = false;
    };

    Trainer(std::unique_ptr<Model> model, TrainOptions options, std::string run_dir,
            Backend& backend, DataParallel dp);
    bool is_root() const { return rank() == 0; }
    // should_stop, agreed over the ranks.
    bool stop_requested(const StopPredicate& should_stop);
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
    DueWork due_after(int64_t step) const;
    // Evaluates into report.val_loss and keeps best/ when it is the lowest yet; false when
    // should_stop interrupted it. Throws on a validation loss that is not finite.
    bool evaluate_and_keep_best(const StopPredicate& should_stop, TrainReport& report);
    // Fills the report's averages over window_ and its timing, logs its metrics line, and
    // starts the next window.
    void report_progress(TrainReport& report);
    // Mean validation loss, or nullopt when should_stop interrupted it.
    std::optional<double> evaluate_until(const StopPredicate& should_stop);
    // The run state a checkpoint of step_ carries.
    RunState run_state() const;
    void restore(const RunState& state);
    // Writes best/ or step_N (and, for a step checkpoint, records it as the last).
    std::string save(bool is_best_copy_too);
    // A step checkpoint, then the step checkpoints beyond keep_last removed.
    std::string save_step_checkpoint();
    void append_metrics(const nlohmann::json& line);
    // Appends the line of a failure about to be thrown; "" or what kept it from the file.
    std::string log_before_error(const nlohmann::json& line);
    // "the last checkpoint is RUN/step_N", for the messages of a run that stops.
    std::string last_checkpoint_phrase() const;
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
    CollectiveClock comm_clock_;  // time in collectives since the last report
    std::unique_ptr<DataParallelOptimizer> optimizer_;
    std::unique_ptr<RunDirLock> lock_;
    std::optional<TrainData> data_;  // opened once the model is (its errors come after)
    int64_t seq_len_ = 0, max_steps_ = 0, step_ = 0;
    std::optional<double> best_val_loss_;
    int64_t nonfinite_skipped_ = 0;  // over the whole run
    ReportWindow window_;
    bool finish_pending_ = false;  // step_'s evaluation, report or checkpoint not yet done
    bool unsaved_ = false;         // the state has changed since the last step checkpoint
    std::string last_checkpoint_;
    // Timing of the current run() call, for the reports' throughput and ETA.
    std::chrono::steady_clock::time_point run_start_, last_report_time_;
    int64_t run_start_step_ = 0, last_report_step_ = 0;
};

}  // namespace tmx

// Everything on disk about a training run, beside run_dir.h's names, leftovers and lock: a new
// run's directory, the state each checkpoint carries beside the weights (trainer_state.json: the
// run state and every option; optimizer.safetensors: the AdamW moments) written and read back,
// step checkpoints pruned to keep_last, and the metrics log (metrics.jsonl) appended to and, on
// resume, trimmed to the checkpoint's step. The trainer decides when; this is how. Under data
// parallelism rank 0 alone calls what writes.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/errors.h"
#include "engine/model/model.h"
#include "engine/train/run_dir.h"
#include "engine/train/train_options.h"
#include "engine/train/train_report.h"

namespace tmx {

// A metrics.jsonl write that failed: the run stops after a last checkpoint attempt.
class MetricsWriteError : public Error {
  public:
    using Error::Error;
};

// What trainer_state.json holds beside the options.
struct RunState {
    int64_t step = 0;       // optimizer steps taken (applied or skipped)
    int64_t max_steps = 0;  // the budget then, for the reader (a resume works out its own)
    int64_t tokens = 0;     // training tokens by `step`, for the reader
    std::optional<double> best_val_loss;  // the one best/ holds
    int64_t nonfinite_skipped = 0;        // over the whole run
    bool finish_pending = false;          // step's evaluation, report or checkpoint not yet done
    ReportWindow since_report;
};

// ---- A new run
// Refuses `run_dir` (naming --out and --resume) when it exists and is not a directory, or holds
// more than a lock file (what a start that failed after creating it leaves).
void refuse_existing_run(const std::string& run_dir);
// Creates run_dir, locks it, refuses it again should another run have taken it meanwhile, and
// starts its metrics.jsonl empty.
std::unique_ptr<RunDirLock> create_run_dir(const std::string& run_dir);

// ---- An existing run
// Locks the run of `path` (a run directory or one of its checkpoints), removes its leftovers and
// sets `checkpoint` to the one `path` names, resolved under the lock (a holder that just ended
// may have written a newer one).
std::unique_ptr<RunDirLock> lock_run(const std::string& path, std::string& checkpoint);
// The options of a checkpoint's trainer_state.json (`state`, read from `state_path`) with
// `overrides` (train_options_to_json's keys) applied: a UsageError naming the flag for one
// --resume may not change; a new budget replaces the other kind.
TrainOptions resumed_options(const nlohmann::json& state, const std::string& state_path,
                             const nlohmann::json& overrides);
// The checkpoint's config, once it is known that a resume on `backend` can train it: a
// UsageError when the backend lacks the run's precision (which a run keeps), or the weights
// were stored in q8_0.
ModelConfig check_resumable(const std::string& checkpoint, const TrainOptions& options,
                            const Backend& backend);
// The run state of trainer_state.json; errors name `source` and the field, and a step whose
// tokens (x tokens_per_step) overflow.
RunState read_run_state(const nlohmann::json& state, const std::string& source,
                        int64_t tokens_per_step);
// optimizer.safetensors' exp_avg and exp_avg_sq into m and v: num_params each, finite.
void read_optimizer_moments(const std::string& checkpoint, int64_t num_params,
                            std::vector<float>& m, std::vector<float>& v);
// The backend the run of `path` (a run directory or a checkpoint) trained on last
// (TrainOptions::backend), read without the run's lock; nullopt for a run from before the
// backend was recorded (or a state whose field is not a string: resuming reports it).
std::optional<std::string> recorded_backend(const std::string& path);

// ---- Checkpoints
// What a run's checkpoint holds beside the model.
struct RunCheckpoint {
    const RunState& state;
    const TrainOptions& options;
    const std::vector<float>& m;  // the full AdamW moments (num_params each)
    const std::vector<float>& v;
    std::string tokenizer_path;  // copied in when not empty
};
// Writes `dir` whole (replacing it). A checkpoint must be a state worth resuming: weights or
// moments that are not finite are refused (an Error naming the tensor, the step, and
// `last_checkpoint_phrase` for where the run can go on) before anything is written.
void write_run_checkpoint(const Model& model, const std::string& dir, const RunCheckpoint& c,
                          const std::string& last_checkpoint_phrase);
// Removes the oldest step checkpoints of run_dir beyond the newest keep_last.
void prune_step_checkpoints(const std::string& run_dir, int64_t keep_last);

// ---- metrics.jsonl
// Appends one line; a MetricsWriteError when it cannot (the file never keeps a torn line).
void append_metrics(const std::string& run_dir, const nlohmann::json& line);
// The same for the line of a failure about to be thrown: "" or, when it could not be written,
// " (and it could not be logged: WHY)" for the failure's message.
std::string append_metrics_before_error(const std::string& run_dir, const nlohmann::json& line);
// Drops the lines logged after `step` (a resume logs them again) and a line torn by a kill.
void trim_metrics(const std::string& run_dir, int64_t step);

}  // namespace tmx

// A training run's options: what `tmx train`'s flags set, their validation (errors name the flag),
// and their JSON form, which every checkpoint's trainer_state.json carries.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "engine/compute/backend.h"
#include "engine/compute/precision.h"
#include "engine/model/config.h"

namespace tmx {

struct TrainOptions {
    std::string data_dir;        // token dataset (tmx prepare): its train split
    std::string val_dir;         // dataset whose val split evaluates; default data_dir
    int64_t batch_size = 8;      // sequences per micro-batch
    int64_t seq_len = 0;         // tokens per sequence; 0 = the config's max_seq_len
    int64_t grad_accum = 1;      // micro-batches per optimizer step
    int64_t max_steps = 0;       // budget in optimizer steps ...
    int64_t max_tokens = 0;      // ... or in training tokens (one of the two)
    double lr = 1e-3;            // peak learning rate
    double min_lr = 1e-4;        // floor of the cosine decay
    int64_t warmup_steps = 100;  // linear warmup from lr/warmup_steps
    double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
    double grad_clip = 1.0;    // global-norm clipping; 0 = off
    int64_t eval_every = 100;  // steps between evaluations (and at the end); 0 = only at the end
    int64_t eval_batches = 8;  // batches of validation windows per evaluation
    int64_t checkpoint_every = 500;  // steps between checkpoints (and at the end)
    int64_t keep_last = 2;           // step checkpoints kept (best/ is kept besides)
    int64_t log_every = 10;          // steps between progress reports and metrics lines
    uint64_t seed = 0;               // data order
    int64_t skip_nonfinite = 0;      // steps with a non-finite loss or gradient norm the run may
                                     // skip (not apply) before it stops
    Precision precision = Precision::F32;  // of the matmuls (Backend::Mode)
    // The backend the run trains on, by the name that opens it ("cpu", "vulkan", "vulkan:1",
    // "cuda"), recorded so that a resume keeps it. A trainer sets it to its backend's name
    // unless it names that backend already (with a device); "" in runs from before it was
    // recorded.
    std::string backend;

    int64_t tokens_per_step(int64_t seq) const { return batch_size * grad_accum * seq; }
};

nlohmann::json train_options_to_json(const TrainOptions& o);
// Throws tmx::Error naming `source` and the field for a missing or mistyped option.
TrainOptions train_options_from_json(const nlohmann::json& j, const std::string& source);

// Throws tmx::UsageError naming (by field) the first option out of range for `config`.
void validate_train_options(const TrainOptions& o, const ModelConfig& config);

// The learning rate at a 0-based step: linear warmup, then cosine decay to min_lr at max_steps.
double learning_rate(const TrainOptions& o, int64_t step, int64_t max_steps);
// AdamW's settings for the 0-based step `step` whose gradients have the global norm grad_norm:
// the learning rate above, and the clip factor as the gradients' scale (AdamW reads them scaled:
// clipping takes no pass of its own).
Backend::AdamWParams adamw_params(const TrainOptions& o, int64_t step, int64_t max_steps,
                                  double grad_norm);

// Throws tmx::UsageError naming batch_size and seq_len when a step of the run needs more
// memory than `backend` has (model/training_memory.h).
void check_train_memory(const ModelConfig& config, const TrainOptions& o, const Backend& backend);

// Whether a resume may change the option (its JSON key, which is also its field): those that
// change the run's cadence or budget but not its math.
bool resume_may_override(const std::string& key);

}  // namespace tmx

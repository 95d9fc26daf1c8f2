// Training on any backend: data sampling, the AdamW step with warmup + cosine schedule and
// global-norm clipping, evaluation, metrics, and resumable checkpoints. Device-independent:
// it talks to the model and the Backend interface only.
//
// A run directory holds step_NNNNNNNN/ checkpoints (the last keep_last of them), best/ (the
// checkpoint with the lowest validation loss) and metrics.jsonl. Each checkpoint carries the
// optimizer moments (optimizer.safetensors, F32) and trainer_state.json (step, best validation
// loss, every option). Batches are a pure function of (seed, step), so a run stopped at step k
// and resumed continues exactly as the uninterrupted run would have.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "engine/model.h"
#include "engine/token_shards.h"

namespace tmx {

struct TrainOptions {
    std::string data_dir;       // token dataset (tmx prepare): its train split
    std::string val_dir;        // dataset whose val split evaluates; default data_dir
    int64_t batch_size = 8;     // sequences per micro-batch
    int64_t seq_len = 0;        // tokens per sequence; 0 = the config's max_seq_len
    int64_t grad_accum = 1;     // micro-batches per optimizer step
    int64_t max_steps = 0;      // budget in optimizer steps ...
    int64_t max_tokens = 0;     // ... or in training tokens (one of the two)
    double lr = 1e-3;           // peak learning rate
    double min_lr = 1e-4;       // floor of the cosine decay
    int64_t warmup_steps = 100; // linear warmup from lr/warmup_steps
    double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
    double grad_clip = 1.0;     // global-norm clipping; 0 = off
    int64_t eval_every = 100;   // steps between evaluations (and at the end); 0 = only at the end
    int64_t eval_batches = 8;   // batches of validation windows per evaluation
    int64_t checkpoint_every = 500;  // steps between checkpoints (and at the end)
    int64_t keep_last = 2;      // step checkpoints kept (best/ is kept besides)
    int64_t log_every = 10;     // steps between progress reports and metrics lines
    uint64_t seed = 0;          // data order

    int64_t tokens_per_step(int64_t seq) const { return batch_size * grad_accum * seq; }
};

nlohmann::json train_options_to_json(const TrainOptions& o);
TrainOptions train_options_from_json(const nlohmann::json& j, const std::string& source);

// One progress report (every log_every steps, after evaluations and at the end).
struct TrainReport {
    int64_t step = 0, max_steps = 0;
    int64_t tokens = 0;               // training tokens consumed so far
    double loss = 0.0, aux = 0.0;     // mean over the steps since the last report
    std::optional<double> val_loss;   // when this step evaluated
    double lr = 0.0, grad_norm = 0.0;
    double tokens_per_s = 0.0, eta_s = 0.0, elapsed_s = 0.0;
    // Per layer, the share of routed (token, choice) slots each expert received since the last
    // report (MoE models).
    std::vector<std::vector<double>> expert_load;
    std::string checkpoint;           // a checkpoint written at this step, if any
};

class Trainer {
public:
    // A new run: fresh weights from init_seed, written into run_dir (created; an existing run
    // there is refused).
    static std::unique_ptr<Trainer> start(const ModelConfig& config, const TrainOptions& options,
                                          const std::string& run_dir, uint64_t init_seed,
                                          Backend& backend);
    // Continues a run from a run directory (its latest checkpoint) or one of its checkpoints.
    // `overrides` may change the budget and the cadence options (not the math).
    static std::unique_ptr<Trainer> resume(const std::string& path, Backend& backend,
                                           const nlohmann::json& overrides);

    // Trains until the budget is reached or *stop becomes true (checked between steps); writes
    // a checkpoint at the end either way. Returns the last report.
    TrainReport run(const std::function<void(const TrainReport&)>& on_report,
                    const std::atomic<bool>* stop = nullptr);

    Model& model() { return *model_; }
    const TrainOptions& options() const { return options_; }
    int64_t step() const { return step_; }
    int64_t max_steps() const { return max_steps_; }
    const std::string& run_dir() const { return run_dir_; }

    // Learning rate at a 0-based step: linear warmup, then cosine decay to min_lr at max_steps.
    static double learning_rate(const TrainOptions& o, int64_t step, int64_t max_steps);

    // Mean cross-entropy over the validation windows.
    double evaluate();

private:
    Trainer(std::unique_ptr<Model> model, TrainOptions options, std::string run_dir,
            Backend& backend);
    void open_data();
    // The micro-batch `micro` of optimizer step `step`: inputs and shifted targets.
    void sample_batch(int64_t step, int64_t micro, std::vector<int32_t>& inputs,
                      std::vector<int32_t>& targets) const;
    // One optimizer step; returns (loss, aux, grad norm) and adds expert slot counts.
    void train_step(double& loss, double& aux, double& grad_norm,
                    std::vector<std::vector<int64_t>>& expert_slots);
    std::string save(bool is_best_copy_too);
    void prune_checkpoints();
    void append_metrics(const nlohmann::json& line);

    std::unique_ptr<Model> model_;
    TrainOptions options_;
    std::string run_dir_;
    Backend& backend_;
    std::string tokenizer_path_;
    std::optional<TokenDataset> train_data_, val_data_;
    Tensor adam_m_, adam_v_, decay_mask_;
    int64_t seq_len_ = 0, max_steps_ = 0, step_ = 0;
    double best_val_loss_ = 0.0;
    bool has_best_ = false;
};

// The checkpoint directory a path names: itself when it holds trainer_state.json, else the
// run directory's latest step checkpoint.
std::string resolve_run_checkpoint(const std::string& path);

}  // namespace tmx

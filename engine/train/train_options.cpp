#include "engine/train/train_options.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <nlohmann/json.hpp>

#include "engine/core/checked_math.h"
#include "engine/core/errors.h"
#include "engine/core/format.h"
#include "engine/core/json_fields.h"
#include "engine/core/option_text.h"
#include "engine/core/range_checks.h"
#include "engine/model/training_memory.h"

namespace tmx {

using nlohmann::json;

namespace {

// Options that change the run's cadence or budget but not its math: a resume may override them.
// (skip_nonfinite changes only what happens to a step that is not finite; another backend
// computes the same steps, to its rounding.)
const char* const kResumeOverridable[] = {"max_steps",    "max_tokens",       "eval_every",
                                          "eval_batches", "checkpoint_every", "keep_last",
                                          "log_every",    "skip_nonfinite",   "backend"};

// Token counts are products of options; one that overflows is a usage error naming them.
int64_t checked_flag_product(std::initializer_list<int64_t> factors, const OptionText& options) {
    try {
        return checked_option_product(factors, options);
    } catch (const Error& e) {
        throw UsageError(e.text());
    }
}

}  // namespace

void validate_train_options(const TrainOptions& o, const ModelConfig& c) {
    // Options are named by their fields (the front end spells them: tmx prints flags).
    const RangeChecks check([](const OptionText& option, const std::string& problem) {
        throw UsageError(option + ": " + problem);
    });
    if (o.data_dir.empty())
        throw UsageError(opt("data_dir") + ": a token dataset directory is required");
    check.positive(o.batch_size, opt("batch_size"));
    check.positive(o.grad_accum, opt("grad_accum"));
    check.require(o.seq_len >= 0 && o.seq_len <= c.max_seq_len, opt("seq_len"),
                  "must be between 1 and the model's max_seq_len (" +
                      std::to_string(c.max_seq_len) + "), got " + std::to_string(o.seq_len));
    check.not_negative(o.max_steps, opt("max_steps"));
    check.not_negative(o.max_tokens, opt("max_tokens"));
    if ((o.max_steps > 0) == (o.max_tokens > 0))
        throw UsageError("give exactly one budget: " + opt("max_steps") + " N or " +
                         opt("max_tokens") + " N");
    check.real(o.lr, o.lr > 0, opt("lr"), "> 0");
    if (!std::isfinite(o.min_lr) || o.min_lr < 0 || o.min_lr > o.lr)
        throw UsageError(opt("min_lr") + ": must be a finite number between 0 and " + opt("lr") +
                         ", got " + format_real(o.min_lr));
    check.not_negative(o.warmup_steps, opt("warmup_steps"));
    check.real(o.beta1, o.beta1 >= 0 && o.beta1 < 1, opt("beta1"), "in [0, 1)");
    check.real(o.beta2, o.beta2 >= 0 && o.beta2 < 1, opt("beta2"), "in [0, 1)");
    check.real(o.eps, o.eps > 0, opt("eps"), "> 0");
    check.real(o.weight_decay, o.weight_decay >= 0, opt("weight_decay"), ">= 0");
    check.real(o.grad_clip, o.grad_clip >= 0, opt("grad_clip"), ">= 0 (0 = off)");
    check.not_negative(o.eval_every, opt("eval_every"));
    check.positive(o.eval_batches, opt("eval_batches"));
    check.not_negative(o.checkpoint_every, opt("checkpoint_every"));
    check.positive(o.keep_last, opt("keep_last"));
    check.positive(o.log_every, opt("log_every"));
    check.not_negative(o.skip_nonfinite, opt("skip_nonfinite"));
    const int64_t seq = o.seq_len > 0 ? o.seq_len : c.max_seq_len;
    const int64_t per_step = checked_flag_product(
        {o.batch_size, o.grad_accum, seq},
        opt("batch_size") + " x " + opt("grad_accum") + " x " + opt("seq_len"));
    checked_flag_product({o.max_steps, per_step}, opt("max_steps") + " x tokens per step");
    checked_flag_product({o.eval_batches, o.batch_size},
                         opt("eval_batches") + " x " + opt("batch_size"));
}

json train_options_to_json(const TrainOptions& o) {
    return {{"data_dir", o.data_dir},
            {"val_dir", o.val_dir},
            {"batch_size", o.batch_size},
            {"seq_len", o.seq_len},
            {"grad_accum", o.grad_accum},
            {"max_steps", o.max_steps},
            {"max_tokens", o.max_tokens},
            {"lr", o.lr},
            {"min_lr", o.min_lr},
            {"warmup_steps", o.warmup_steps},
            {"beta1", o.beta1},
            {"beta2", o.beta2},
            {"eps", o.eps},
            {"weight_decay", o.weight_decay},
            {"grad_clip", o.grad_clip},
            {"eval_every", o.eval_every},
            {"eval_batches", o.eval_batches},
            {"checkpoint_every", o.checkpoint_every},
            {"keep_last", o.keep_last},
            {"log_every", o.log_every},
            {"seed", o.seed},
            {"skip_nonfinite", o.skip_nonfinite},
            {"precision", to_string(o.precision)},
            {"backend", o.backend}};
}

TrainOptions train_options_from_json(const json& j, const std::string& source) {
    const json_fields::Fields f(j, source);
    TrainOptions o;
    o.data_dir = f.string("data_dir");
    o.val_dir = f.string("val_dir");
    o.batch_size = f.integer("batch_size");
    o.seq_len = f.integer("seq_len");
    o.grad_accum = f.integer("grad_accum");
    o.max_steps = f.integer("max_steps");
    o.max_tokens = f.integer("max_tokens");
    o.lr = f.number("lr");
    o.min_lr = f.number("min_lr");
    o.warmup_steps = f.integer("warmup_steps");
    o.beta1 = f.number("beta1");
    o.beta2 = f.number("beta2");
    o.eps = f.number("eps");
    o.weight_decay = f.number("weight_decay");
    o.grad_clip = f.number("grad_clip");
    o.eval_every = f.integer("eval_every");
    o.eval_batches = f.integer("eval_batches");
    o.checkpoint_every = f.integer("checkpoint_every");
    o.keep_last = f.integer("keep_last");
    o.log_every = f.integer("log_every");
    o.seed = f.uinteger("seed");
    // Absent from the checkpoints of versions before it existed: those runs skip nothing.
    if (j.contains("skip_nonfinite")) o.skip_nonfinite = f.integer("skip_nonfinite");
    // Absent before bf16 existed: those runs were fp32.
    if (j.contains("precision"))
        o.precision = parse_precision(f.string("precision"), source + ": precision");
    // Absent before it was recorded: such a run resumes on the backend `auto` picks.
    if (j.contains("backend")) o.backend = f.string("backend");
    return o;
}

void check_train_memory(const ModelConfig& c, const TrainOptions& o, const Backend& backend) {
    check_training_memory(c, o.batch_size, o.seq_len > 0 ? o.seq_len : c.max_seq_len, o.precision,
                          backend,
                          {opt("batch_size"), opt("seq_len"),
                           " (" + opt("grad_accum") + " keeps the tokens per step)"});
}

double learning_rate(const TrainOptions& o, int64_t step, int64_t max_steps) {
    if (o.warmup_steps > 0 && step < o.warmup_steps)
        return o.lr * static_cast<double>(step + 1) / static_cast<double>(o.warmup_steps);
    const int64_t decay_steps = max_steps - o.warmup_steps;
    if (decay_steps <= 0) return o.lr;
    const double progress = std::clamp(
        static_cast<double>(step - o.warmup_steps) / static_cast<double>(decay_steps), 0.0, 1.0);
    return o.min_lr + 0.5 * (o.lr - o.min_lr) * (1.0 + std::cos(M_PI * progress));
}

Backend::AdamWParams adamw_params(const TrainOptions& o, int64_t step, int64_t max_steps,
                                  double grad_norm) {
    const bool clip = o.grad_clip > 0 && grad_norm > o.grad_clip;
    return {.lr = static_cast<float>(learning_rate(o, step, max_steps)),
            .beta1 = static_cast<float>(o.beta1),
            .beta2 = static_cast<float>(o.beta2),
            .eps = static_cast<float>(o.eps),
            .weight_decay = static_cast<float>(o.weight_decay),
            .step = step + 1,
            .grad_scale = clip ? static_cast<float>(o.grad_clip / (grad_norm + 1e-6)) : 1.0f};
}

bool resume_may_override(const std::string& key) {
    return std::find(std::begin(kResumeOverridable), std::end(kResumeOverridable), key) !=
           std::end(kResumeOverridable);
}

}  // namespace tmx

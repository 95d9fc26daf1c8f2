// The flag of each option the engine names in its messages and reports. The engine names an
// option by its field (engine/core/option_text.h: "train_batch", "overwrite"); tmx prints the
// flag that sets it. One table for every command: a field means one option wherever it appears.
// tests/apps/option_flags_test.cpp checks that every field the engine names is here and that
// every flag is one a command takes.
#pragma once

#include <string>
#include <string_view>

namespace tmx::cli {

struct OptionFlag {
    std::string_view field, flag;
};

inline constexpr OptionFlag kOptionFlags[] = {
    // Running a model (engine/compute, engine/report/bench.cpp, engine/infer).
    {"backends", "--backends"},
    {"precision", "--precision"},
    {"weight_format", "--weights"},
    {"prompt_tokens", "--prompt"},
    {"decode_tokens", "--decode"},
    {"batch", "--batch"},
    {"repeats", "--repeats"},
    {"warm_seconds", "--warm-seconds"},
    {"train_batch", "--train-batch"},
    {"train_seq", "--train-seq"},
    {"max_new_tokens", "--max-new-tokens"},
    {"prefill_chunk", "--prefill-chunk"},
    {"temperature", "--temperature"},
    {"top_k", "--top-k"},
    {"top_p", "--top-p"},
    {"min_p", "--min-p"},
    {"repetition_penalty", "--repetition-penalty"},
    {"frequency_penalty", "--frequency-penalty"},
    {"presence_penalty", "--presence-penalty"},
    // Sizing a model (engine/report: param_report, dp_scaling; engine/model/training_memory).
    {"seq", "--seq"},
    {"ranks", "--ranks"},
    {"step_latency_us", "--latency-us"},
    {"step_time_s", "--step-time"},
    {"tokens_per_step", "--tokens-per-step"},
    {"peak_tflops", "--peak-tflops"},
    {"mfu", "--mfu"},
    {"batch_size", "--batch-size"},
    {"shard_optimizer", "--shard-optimizer"},
    // Writing files (engine/data, engine/model/checkpoint, engine/interop).
    {"overwrite", "--force"},
    {"dtype", "--dtype"},
    {"format", "--format"},
    {"val_fraction", "--val-fraction"},
    // Training (engine/train: the options of a run, the run directory, resuming).
    {"data_dir", "--data"},
    {"seq_len", "--seq-len"},
    {"grad_accum", "--grad-accum"},
    {"max_steps", "--max-steps"},
    {"max_tokens", "--max-tokens"},
    {"lr", "--lr"},
    {"min_lr", "--min-lr"},
    {"warmup_steps", "--warmup-steps"},
    {"beta1", "--beta1"},
    {"beta2", "--beta2"},
    {"eps", "--eps"},
    {"weight_decay", "--weight-decay"},
    {"grad_clip", "--grad-clip"},
    {"eval_every", "--eval-every"},
    {"eval_batches", "--eval-batches"},
    {"checkpoint_every", "--checkpoint-every"},
    {"keep_last", "--keep-last"},
    {"log_every", "--log-every"},
    {"skip_nonfinite", "--skip-nonfinite"},
    {"backend", "--backend"},
    {"resume", "--resume"},
    {"out", "--out"},
};

// The flag of `field`; the field itself when the table has none (as the engine names it).
inline std::string flag_of(std::string_view field) {
    for (const OptionFlag& o : kOptionFlags)
        if (o.field == field) return std::string(o.flag);
    return std::string(field);
}

}  // namespace tmx::cli

// What a training run allocates, computed from the config without allocating: the sizing
// that `tmx params --batch` reports and that `tmx train` and `tmx bench` check against the device
// before a run. training_memory() is defined in engine/model/model.cpp, beside the allocations it
// counts; the check in training_memory.cpp.
#pragma once

#include <cstdint>
#include <string>

#include "engine/compute/backend.h"
#include "engine/compute/precision.h"
#include "engine/core/option_text.h"
#include "engine/model/config.h"

namespace tmx {

// Device memory of a training step as the engine allocates it, in bytes: the tensors Trainer
// and Model hold at the step's peak, as Backend::memory_stats() counts them (exactly, on the
// CPU backend). A backend's own scratch inside an op (CUDA: bf16 copies of fp32 matmul
// operands, sort buffers) comes on top. Each step frees what it kept before the next one.
struct TrainingMemory {
    double weights = 0;       // fp32 master weights, 4 B/param
    double gradients = 0;     // fp32, 4 B/param
    double optimizer = 0;     // AdamW m and v: 8 B/param
    double bf16_weights = 0;  // the bf16 copy the matmuls read (BF16 precision): 2 B/param
    // What the forward pass keeps for the backward pass: every layer's activations, the
    // residual stream, the final norm's output, token ids and positions.
    double activations = 0;
    // The rest of the peak: the most held beside those at once (the classifier's chunks and
    // head gradients, or the backward pass's scratch), or what a validation pass holds instead
    // of them (one layer's activations and a chunk of logits), whichever is larger.
    double step_scratch = 0;
    // What a validation pass (Model::forward_loss) allocates beside the weights: counted in
    // step_scratch when it is the largest, which it is not for any model with more than a layer
    // or so; kept apart so that tests can hold the pass to it.
    double validation_pass = 0;
    double total() const {
        return weights + gradients + optimizer + bf16_weights + activations + step_scratch;
    }
};
// In fp32 or BF16 precision (BF16: bf16 storage, as Model's default) at batch x seq, with the
// classifier taking classifier_chunk_values logits at a time (Model's default), and with
// validation passes of `batch` sequences between steps (as Trainer runs them) or without.
TrainingMemory training_memory(const ModelConfig& config, int64_t batch, int64_t seq,
                               Precision precision, bool with_validation = true,
                               int64_t classifier_chunk_values = int64_t{1} << 25);

// The options a training-memory refusal names (the caller's: opt("train_batch"), ...), and
// advice appended to it.
struct TrainingMemoryOptions {
    OptionText batch, seq, advice;
};
// Training at batch x seq in `precision` must stay within 1 EiB (kMaxMemoryBytes), and
// the engine's own tensors (training_memory(): weights, gradients, AdamW state, the bf16 weight
// copy, kept activations and the step's scratch) must fit in backend.memory_capacity():
// otherwise a UsageError naming the options. Called before anything is allocated, so that an
// absurd batch is a usage error rather than a run that grows until the system kills it.
void check_training_memory(const ModelConfig& c, int64_t batch, int64_t seq, Precision precision,
                           const Backend& backend, const TrainingMemoryOptions& options);

}  // namespace tmx

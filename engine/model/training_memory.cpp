#include "engine/model/training_memory.h"

#include "engine/core/checked_math.h"
#include "engine/core/errors.h"
#include "engine/core/format.h"

namespace tmx {

void check_training_memory(const ModelConfig& c, int64_t batch, int64_t seq, Precision precision,
                           const Backend& backend, const TrainingMemoryOptions& options) {
    const OptionText at = options.batch + " " + with_thousands(batch) + " x " + options.seq + " " +
                          with_thousands(seq);
    const OptionText beyond = ", more than the limit of 1 EiB (2^60 bytes); lower " +
                              options.batch + " or " + options.seq;
    TrainingMemory m;
    try {
        m = training_memory(c, batch, seq, precision);
    } catch (const OverflowError&) {
        throw UsageError(at + ": training would need more bytes than an int64 counts" + beyond);
    }
    if (m.total() > kMaxMemoryBytes)
        throw UsageError(at + ": training in " + to_string(precision) + " would need " +
                         fmt_bytes(m.total()) + beyond);
    const uint64_t capacity = backend.memory_capacity();
    if (capacity > 0 && m.total() > static_cast<double>(capacity))
        throw UsageError(
            at + ": training in " + to_string(precision) + " would need " + fmt_bytes(m.total()) +
            " (weights" + (m.bf16_weights > 0 ? " with their bf16 copy" : "") +
            ", gradients and AdamW state " +
            fmt_bytes(m.weights + m.gradients + m.optimizer + m.bf16_weights) + ", activations " +
            fmt_bytes(m.activations) + ", step scratch " + fmt_bytes(m.step_scratch) +
            "; tmx params " + opt("batch") + " B " + opt("seq") + " T shows it), more than the " +
            backend.name() + " backend's " + fmt_bytes(static_cast<double>(capacity)) + "; lower " +
            options.batch + " or " + options.seq + options.advice);
}

}  // namespace tmx

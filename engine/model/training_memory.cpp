#include "engine/model/training_memory.h"

#include "engine/core/checked_math.h"
#include "engine/core/errors.h"
#include "engine/core/format.h"

namespace tmx {

void check_training_memory(const ModelConfig& c, int64_t batch, int64_t seq, Precision precision,
                           const Backend& backend, const TrainingMemoryFlags& flags) {
    const std::string at =
        flags.batch + " " + with_thousands(batch) + " x " + flags.seq + " " + with_thousands(seq);
    const std::string beyond =
        ", more than the limit of 1 EiB (2^60 bytes); lower " + flags.batch + " or " + flags.seq;
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
            "; tmx params --batch B --seq T shows it), more than the " + backend.name() +
            " backend's " + fmt_bytes(static_cast<double>(capacity)) + "; lower " + flags.batch +
            " or " + flags.seq + flags.advice);
}

}  // namespace tmx

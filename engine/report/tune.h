// tmx tune: the shapes of a backend's tunable kernels (engine/compute/kernel_tuning.h) measured
// on this device at a model's real shapes. The model's prefill, batch-1 and batch-N decoding and
// (optionally) a training step run once on the backend with its call log on; each distinct
// shape the log shows is then repeated with fresh random inputs under every variant the device
// can run. A variant whose output is not within the op's tolerance of the CPU's on the same
// inputs is dropped; the fastest of the rest is kept, and the backend saves the winners as this
// device's tuning.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/compute/backend.h"
#include "engine/compute/kernel_tuning.h"
#include "engine/model/config.h"

namespace tmx {

struct TuneOptions {
    int64_t prompt_tokens = 512;  // the prefill whose shapes are tuned
    int64_t batch = 8;            // decoding at batch 1 and at this batch
    // > 0: also the shapes of a training step of train_batch sequences of train_seq tokens.
    int64_t train_batch = 0, train_seq = 0;
    // > 0: also the fp32 gemm x gemm x gemm matmul that `tmx bench --gemm` times (its square
    // product, the figure GPUs' fp32 peaks are quoted for), so that the bench runs it tuned.
    int64_t gemm = 0;
    int repeats = 5;      // timed batches per variant (the median is kept)
    double min_ms = 5.0;  // launches per timed batch: enough to last about this long
    uint64_t seed = 0;    // the model's weights and the inputs
    bool save = true;     // false: measure and report only
    std::function<void(const std::string&)> progress;
};

// One shape: every variant's time, and the choice.
struct TunedShapeReport {
    TunableCall call;  // a call of the shape, as the backend logged it
    struct Tried {
        std::string variant;
        double ms = 0;     // median time of one launch; 0 when rejected
        double error = 0;  // max |out - cpu| / max(1, max |cpu|)
        bool rejected = false;
    };
    std::vector<Tried> tried;
    std::string best, default_variant;
    double best_ms = 0, default_ms = 0;
    double tolerance = 0;
};

struct TuneReport {
    std::vector<TunedShapeReport> shapes;
    std::string saved_to;  // empty when not saved
};

// Tunes `be` (which must have kernel_tuning_of()) for the model `config`, against `cpu` (the CPU
// backend). Throws tmx::Error when the backend has nothing to tune, or when no variant of a
// shape matches the CPU.
TuneReport tune_kernels(const ModelConfig& config, Backend& be, Backend& cpu, const TuneOptions& o);

}  // namespace tmx

// Backend comparison runs (tmx bench): the model's ops timed at its real shapes, then prefill
// and decode throughput, on each backend; every result is checked against the CPU backend's
// on the same inputs in the same run. Timings are the median of `repeats` runs after warm-up,
// each ending with synchronize().
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/config.h"

namespace tmx {

struct BenchOptions {
    std::vector<std::string> backends;  // e.g. {"cpu", "vulkan"}
    int warmup = 1;
    int repeats = 5;
    int64_t prompt_tokens = 128;  // prefill length (and the "prefill" op shapes)
    int64_t decode_tokens = 32;   // decode steps timed
    int64_t batch = 8;            // sequences in the batch-N decode
    int64_t gemm = 0;             // > 0: also an fp32 gemm x gemm x gemm matmul (a peak check)
    uint64_t seed = 0;            // inputs and, with no weights given, the model's init
    // Called before each measurement with a short description (progress on stderr).
    std::function<void(const std::string&)> progress;
};

struct OpBench {
    std::string op, shape;
    double ms = 0;          // median time
    double gflops = 0;      // 0 when the op is not about arithmetic
    double gbytes_per_s = 0;  // main memory traffic the op cannot avoid, per second
    double max_error = 0;   // max |out - cpu| / max(1, max |cpu|)
};

struct ModelBench {
    double prefill_tokens_per_s = 0, decode_tokens_per_s = 0, batch_decode_tokens_per_s = 0;
    double logits_error = 0;        // prefill's last logits and every decode step's, vs CPU
    int64_t greedy_matching = 0;    // greedy batch-1 decode steps that chose the CPU's token,
    int64_t greedy_steps = 0;       // out of this many (counted up to the first difference)
};

struct BackendBench {
    std::string backend;
    std::string description;  // Backend::description(): the device and its precision
    std::vector<OpBench> ops;
    ModelBench model;
};

// Runs the comparison for a model given by its config and host weights (empty: random
// initialisation from options.seed).
std::vector<BackendBench> run_bench(const ModelConfig& config, std::vector<float> weights,
                                    const BenchOptions& options);

}  // namespace tmx

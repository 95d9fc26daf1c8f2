// Backend comparison runs (tmx bench): the model's ops timed at its real shapes, then prefill
// and decode throughput, on each backend; every result is checked against the CPU backend's
// on the same inputs in the same run. Timings are the median of `repeats` runs after warm-up,
// each ending with synchronize(); an op's run is a batch of back-to-back launches
// (bench_util.h's median_launch_seconds).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/compute/backend.h"
#include "engine/compute/precision.h"
#include "engine/model/config.h"

namespace tmx {

struct BenchOptions {
    std::vector<std::string> backends;  // e.g. {"cpu", "vulkan"}
    int warmup = 1;
    int repeats = 5;
    // Before a backend other than the CPU measures anything, fp32 matrix products back to back
    // for this long: a GPU that was idle runs at lowered clocks, and its first timings would
    // be a fraction of its speed (the first ops of an H200's Vulkan-only bench ran 3x slower).
    double warm_seconds = 1.0;
    int64_t prompt_tokens = 128;  // prefill length (and the "prefill" op shapes)
    int64_t decode_tokens = 32;   // decode steps timed
    int64_t batch = 8;            // sequences in the batch-N decode
    int64_t gemm = 0;             // > 0: also an fp32 gemm x gemm x gemm matmul (a peak check)
    // > 0: also time training steps (forward, backward, gradient norm, AdamW) of train_batch
    // sequences of train_seq tokens, on the backends that train.
    int64_t train_batch = 0, train_seq = 0;
    // false: the training step's loss is not checked against an untimed CPU step on the same
    // batch (which takes minutes at a GPU's batch sizes); TrainBench::cpu_loss stays unset.
    bool train_check = true;
    // > 0: the device's peak for the training step's MFU; else the backend's published one
    // (Backend::spec_peak_tflops), where it knows it.
    double peak_tflops = 0;
    // The matmul precision of every measurement (ops, prefill, decode, the training step) but
    // the fp32 --gemm; unset: each backend's default_precision(). The CPU results a backend is
    // checked against are made in its precision too.
    std::optional<Precision> precision;
    // The format the models of prefill and decode hold their weights in (every backend's; a
    // backend that cannot hold it is refused up front). They are checked against the CPU on the
    // weights' values: in f32, bf16 and f16 the CPU's model in the format; in q8_0 an f32 model
    // holding the q8_0 values, since the CPU's q8_0 also quantises the activations (so the
    // CPU's own q8_0 row shows that rounding).
    DType weight_format = DType::F32;
    // Also profile the batch-1 and batch-N decode steps and, with train_batch, one training
    // step, on the backends that can_profile(): device time per kind of command
    // (Backend::begin_profile).
    bool profile = false;
    uint64_t seed = 0;  // inputs and, with no weights given, the model's init
    // Opens a backend by name (the front end passes make_backend from backends/registry.h;
    // the engine knows no backend). "cpu" must open the CPU backend, the reference.
    std::function<std::unique_ptr<Backend>(const std::string&)> open_backend;
    // Called before each measurement with a short description (progress on stderr).
    std::function<void(const std::string&)> progress;
};

struct OpBench {
    std::string op, shape;
    double ms = 0;            // median time of one launch
    int launches = 1;         // back-to-back launches per timed batch (median_launch_seconds)
    double gflops = 0;        // 0 when the op is not about arithmetic
    double gbytes_per_s = 0;  // main memory traffic the op cannot avoid, per second
    double max_error = 0;     // max |out - cpu| / max(1, max |cpu|)
    // Non-empty: the op could not run on this backend at this shape (e.g. an operand past what
    // a Vulkan device can bind), and this is why; the other fields are then unset. The rest of
    // the bench goes on.
    std::string skipped;
};

// Steps profiled (--profile): one prefill of the prompt (1 step, batch 1), decode steps of
// `batch` sequences, or one training step of `batch` sequences; wall time (host and device, with
// the profiler's timestamps) and the device's time per kind of command, summed over the steps.
struct StepProfile {
    int64_t batch = 0, steps = 0;
    int64_t tokens = 0;  // the prefill's: the prompt's tokens (0 for the others)
    double wall_seconds = 0;
    std::vector<Backend::ProfiledCommands> commands;
    std::optional<int64_t> barriers;  // Backend::profiled_barriers(), summed over the steps
};

struct ModelBench {
    double prefill_tokens_per_s = 0, decode_tokens_per_s = 0, batch_decode_tokens_per_s = 0;
    double logits_error = 0;            // prefill's last logits and every decode step's, vs CPU
    int64_t greedy_matching = 0;        // greedy batch-1 decode steps that chose the CPU's token,
    int64_t greedy_steps = 0;           // out of this many (counted up to the first difference)
    std::vector<StepProfile> profiles;  // --profile: batch 1, then batch N
    std::optional<StepProfile> prefill_profile;  // --profile: the prompt's prefill
};

// One training step: forward with kept activations, backward, the global gradient norm, and
// an AdamW update of every parameter.
struct TrainBench {
    bool measured = false;  // false: the backend does not train, or not asked
    double tokens_per_s = 0;
    double model_tflops = 0;  // training FLOPs of the model (3x forward) per second
    double mfu = 0;           // model_tflops / peak_tflops (0 without a peak)
    // The peak MFU is against: BenchOptions::peak_tflops, else the backend's
    // spec_peak_tflops() in the step's precision (peak_from_spec); 0 when neither is known.
    double peak_tflops = 0;
    bool peak_from_spec = false;
    Precision precision = Precision::F32;  // of the step's matmuls
    size_t peak_bytes = 0;                 // the backend's peak allocation during the step
    // training_memory() of the step (no validation pass): its engine tensors. peak_bytes adds
    // the backend's scratch inside ops, and whatever else the backend holds (the CPU: the
    // bench's reference model).
    double engine_bytes = 0;
    double loss = 0;                 // the step's cross-entropy, and the CPU's on the same batch
    std::optional<double> cpu_loss;  // unset without BenchOptions::train_check
    // --profile, on a backend that can_profile(): one more step, profiled.
    std::optional<StepProfile> profile;
};

struct BackendBench {
    std::string backend;
    std::string description;               // Backend::description(): the device and its precision
    Precision precision = Precision::F32;  // of every measurement's matmuls (BenchOptions)
    std::vector<OpBench> ops;
    ModelBench model;
    TrainBench train;
};

// Runs the comparison for a model given by its config and host weights (empty: random
// initialisation from options.seed).
std::vector<BackendBench> run_bench(const ModelConfig& config, std::vector<float> weights,
                                    const BenchOptions& options);

}  // namespace tmx

// Kernels whose shape a backend chooses per device and per call (tile, workgroup, register
// block): the seam `tmx tune` measures through (engine/report/tune.h). A backend with such
// kernels also derives from KernelTuning (kernel_tuning_of() finds it); the engine never learns
// what a variant is, only its name.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/compute/backend.h"
#include "engine/compute/tensor.h"

namespace tmx {

// One tunable call a backend made, enough to repeat it with fresh inputs of the same shape.
struct TunableCall {
    enum class Op : uint8_t {
        Matmul,                 // matmul(a, b): out [rows, n], contraction k
        Linear,                 // linear(x, w): rows x [k] -> [n] through the weight w [n, k]
        GroupedMatmul,          // grouped_matmul: rows slots over `experts`, w [experts, n, k]
        GroupedMatmulBackward,  // its backward (d_x and d_w)
        Attention,              // attention of rows queries over the window k, head_dim n
        // decoding's attention: rows queries, each of its own sequence, over a full cache, so
        // that each sees k keys; head_dim n
        AttentionCached,
    };
    Op op = Op::Matmul;
    int64_t rows = 0, n = 0, k = 0, experts = 0;
    int64_t heads = 0, kv_heads = 0;  // Attention, AttentionCached
    bool trans_a = false, trans_b = false;
    DType weight = DType::F32;     // Linear, GroupedMatmul: the weight's format
    bool reduced_weights = false;  // the weight was read below fp32 (the op's tolerance widens)
    std::string kernel;            // the backend's kernel family that ran it
    std::string key;               // calls with the same key share a choice
};

// One tuned shape's result, as the backend keeps it.
struct TunedChoice {
    TunableCall call;  // a call of the shape
    std::string best;
    double best_ms = 0, default_ms = 0;
    int candidates_tried = 0;
};

class KernelTuning {
  public:
    virtual ~KernelTuning() = default;
    // While `log` is set, every tunable call is appended to it (nullptr stops).
    virtual void log_calls(std::vector<TunableCall>* log) = 0;
    // The variants of the call's kernel family that this device can run for the call (a form
    // may need, say, fp16 weights).
    virtual std::vector<std::string> variants(const TunableCall& call) const = 0;
    // The variant the backend runs the call with when untuned (its built-in default).
    virtual std::string default_variant(const TunableCall& call) const = 0;
    // Every call of `kernel` runs `variant` ("": back to the backend's own choice).
    virtual void force_variant(const std::string& kernel, const std::string& variant) = 0;
    // Keeps the choices as this device's tuning (used from now on, and by later starts), with
    // the shapes an earlier tuning of the device holds and these do not. Returns where they
    // were written.
    virtual std::string save_tuning(const std::vector<TunedChoice>& choices) = 0;
    // Where the tuning of this device is kept.
    virtual std::string tuning_path() const = 0;
};

// The backend's tuning seam, or null when its kernels have no shapes to choose.
inline KernelTuning* kernel_tuning_of(Backend& be) {
    return dynamic_cast<KernelTuning*>(&be);
}

}  // namespace tmx

// The operation codes of the activation shaders (elementwise.comp, activation_backward.comp,
// and grouped_matmul_gemv.comp's epilogue, which runs elementwise.comp's activations through
// shaders/activations.glsl, or kCombine), shared by the files that record them.
#pragma once

#include <cstdint>
#include <stdexcept>

#include "engine/compute/op_kinds.h"

namespace tmx {

// elementwise.comp's operations.
enum ElementwiseOp : uint32_t {
    kAdd = 0,
    kSwiglu = 1,
    kGelu = 2,
    kSilu = 3,
    kRelu = 4,
    kRelu2 = 5
};

// grouped_matmul_gemv.comp's epilogue past the activations: the experts' outputs combined into
// the residual (Backend::grouped_ffn_down).
constexpr uint32_t kCombine = 6;

// activation_backward.comp's operations.
enum ActivationBackwardOp : uint32_t {
    kGeluBackward = 0,
    kSiluBackward = 1,
    kReluBackward = 2,
    kRelu2Backward = 3,
    kSwigluBackward = 4
};

// elementwise.comp's and activation_backward.comp's operations for an activation.
struct ActivationOps {
    uint32_t forward, backward;
};
inline ActivationOps activation_ops(Activation act) {
    switch (act) {
        case Activation::Gelu:
            return {kGelu, kGeluBackward};
        case Activation::Silu:
            return {kSilu, kSiluBackward};
        case Activation::Relu:
            return {kRelu, kReluBackward};
        case Activation::Relu2:
            return {kRelu2, kRelu2Backward};
    }
    throw std::logic_error("Vulkan: an unknown activation");
}

}  // namespace tmx

// Scalar math shared by the CPU backend's ops (and, later, their backward passes).
#pragma once

#include <cmath>

#include "engine/config.h"

namespace tmx::cpu {

inline float gelu_tanh(float x) {
    const float k = 0.7978845608028654f;  // sqrt(2 / pi)
    return 0.5f * x * (1.0f + std::tanh(k * (x + 0.044715f * x * x * x)));
}

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }

// d act(x) / dx.
inline float activation_derivative(Activation act, float x) {
    switch (act) {
        case Activation::Gelu: {
            const float k = 0.7978845608028654f;
            const float t = std::tanh(k * (x + 0.044715f * x * x * x));
            return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * k * (1.0f + 3.0f * 0.044715f * x * x);
        }
        case Activation::Silu: {
            const float s = 1.0f / (1.0f + std::exp(-x));
            return s * (1.0f + x * (1.0f - s));
        }
        case Activation::Relu: return x > 0.0f ? 1.0f : 0.0f;
        case Activation::Relu2: return x > 0.0f ? 2.0f * x : 0.0f;
    }
    return 0.0f;
}

}  // namespace tmx::cpu

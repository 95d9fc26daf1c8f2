// Scalar math of the CUDA backend's elementwise kernels, shared by the host and the device so
// that g++ can test it without a GPU (tests/backends/cuda/cuda_math_test.cpp). The formulas are
// those of backends/cpu/cpu_math.h and CpuBackend::adamw_impl, written the same way term by
// term, so that the two backends differ only by the rounding of exp (the CPU's exp_fast against
// CUDA's expf, both within 2 ulp) and by FMA contraction.
//
// The header is plain C++ where __CUDACC__ is not defined; keep it free of device intrinsics
// (__expf and the like: fast, but wrong by many ulp for large arguments).
#pragma once

#include <cmath>
#include <cstdint>

#include "backends/cuda/host_device.h"
#include "engine/model/config.h"

namespace tmx::cuda {

// exp(x) with x clamped to [-87, 88], the range of the CPU's exp_fast: the result is a finite
// normal float (1.6e-38 .. 1.7e38), so callers may form e * (1 / (1 + e)) without inf * 0.
TMX_HOST_DEVICE inline float exp_clamped(float x) {
    return expf(fminf(fmaxf(x, -87.0f), 88.0f));
}

// GELU, tanh approximation: 0.5 x (1 + tanh(u)), u = k (x + 0.044715 x^3), computed as the same
// function x * sigmoid(2u): one exp, and no cancellation where 1 + tanh(u) -> 0.
constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluC = 0.044715f;

TMX_HOST_DEVICE inline float gelu_tanh(float x) {
    const float e = exp_clamped(-2.0f * kGeluK * (x + kGeluC * x * x * x));
    return x / (1.0f + e);
}

// d gelu_tanh / dx = s + 2 x s (1 - s) du/dx with s = sigmoid(2u) = 1 / (1 + e), e = exp(-2u),
// and 1 - s written as e s (exact where s -> 1, where 1 - s would cancel).
TMX_HOST_DEVICE inline float gelu_tanh_derivative(float x) {
    const float x2 = x * x;
    const float e = exp_clamped(-2.0f * kGeluK * (x + kGeluC * x2 * x));
    const float s = 1.0f / (1.0f + e);
    return s + 2.0f * x * kGeluK * (1.0f + 3.0f * kGeluC * x2) * (e * s) * s;
}

TMX_HOST_DEVICE inline float silu(float x) {
    return x / (1.0f + exp_clamped(-x));
}

// d silu / dx = s (1 + x (1 - s)), s = sigmoid(x), 1 - s = e s as above.
TMX_HOST_DEVICE inline float silu_derivative(float x) {
    const float e = exp_clamped(-x);
    const float s = 1.0f / (1.0f + e);
    return s * (1.0f + x * (e * s));
}

TMX_HOST_DEVICE inline float relu(float x) {
    return x > 0.0f ? x : 0.0f;
}
TMX_HOST_DEVICE inline float relu_derivative(float x) {
    return x > 0.0f ? 1.0f : 0.0f;
}
TMX_HOST_DEVICE inline float relu2(float x) {
    return x > 0.0f ? x * x : 0.0f;
}
TMX_HOST_DEVICE inline float relu2_derivative(float x) {
    return x > 0.0f ? 2.0f * x : 0.0f;
}

// An activation's function and derivative as a type, so that a kernel template instantiated
// per activation has no per-element switch.
template <Activation A>
struct ActivationFn;

template <>
struct ActivationFn<Activation::Gelu> {
    TMX_HOST_DEVICE static float value(float x) { return gelu_tanh(x); }
    TMX_HOST_DEVICE static float derivative(float x) { return gelu_tanh_derivative(x); }
};
template <>
struct ActivationFn<Activation::Silu> {
    TMX_HOST_DEVICE static float value(float x) { return silu(x); }
    TMX_HOST_DEVICE static float derivative(float x) { return silu_derivative(x); }
};
template <>
struct ActivationFn<Activation::Relu> {
    TMX_HOST_DEVICE static float value(float x) { return relu(x); }
    TMX_HOST_DEVICE static float derivative(float x) { return relu_derivative(x); }
};
template <>
struct ActivationFn<Activation::Relu2> {
    TMX_HOST_DEVICE static float value(float x) { return relu2(x); }
    TMX_HOST_DEVICE static float derivative(float x) { return relu2_derivative(x); }
};

// The per-step constants of PyTorch's AdamW, derived on the host in double as the CPU backend
// does (the bias corrections 1 - beta^step lose everything in fp32 when beta is close to 1).
struct AdamWCoefficients {
    float beta1, beta2, eps;
    float decay;      // lr * weight_decay: p *= 1 - decay
    float step_size;  // lr / (1 - beta1^step)
    float bc2_sqrt;   // sqrt(1 - beta2^step)
};

inline AdamWCoefficients adamw_coefficients(float lr, float beta1, float beta2, float eps,
                                            float weight_decay, int64_t step) {
    const double t = static_cast<double>(step);
    const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), t);
    const double bc2 = 1.0 - std::pow(static_cast<double>(beta2), t);
    return {beta1,
            beta2,
            eps,
            lr * weight_decay,
            static_cast<float>(static_cast<double>(lr) / bc1),
            static_cast<float>(std::sqrt(bc2))};
}

// One element of an AdamW step: decoupled decay (c.decay is 0 for tensors without decay), the
// moments, and the bias-corrected update p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps).
TMX_HOST_DEVICE inline void adamw_update(float& p, float& m, float& v, float g,
                                         const AdamWCoefficients& c) {
    p *= 1.0f - c.decay;
    m = c.beta1 * m + (1.0f - c.beta1) * g;
    v = c.beta2 * v + (1.0f - c.beta2) * g * g;
    p -= c.step_size * m / (sqrtf(v) / c.bc2_sqrt + c.eps);
}

}  // namespace tmx::cuda

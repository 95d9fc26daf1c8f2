// Scalar math shared by the CPU backend's ops and their backward passes. Everything here is
// branch-free and call-free so that loops under `#pragma omp simd` vectorise it: glibc's expf
// and tanhf are scalar calls, and were a tenth of a training step.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#include "engine/model/config.h"

namespace tmx::cpu {

// exp(x) in fp32 within 1.5 ulp (relative error < 8e-8 over the whole range). The argument is
// clamped to [-87, 88], so the result stays a finite normal float (1.6e-38 .. 1.7e38): callers
// may form e * (1 / (1 + e)) without inf * 0.
inline float exp_fast(float x) {
    x = std::min(std::max(x, -87.0f), 88.0f);
    // n = round(x / ln 2): adding 1.5 * 2^23 rounds to an integer in round-to-nearest.
    const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    // r = x - n ln 2 in [-ln2/2, ln2/2], with ln 2 split in two (Cody-Waite) so that n * hi is
    // exact.
    float r = std::fma(n, -0.693145751953125f, x);
    r = std::fma(n, -1.428606765330187045e-06f, r);
    // exp(r) by its Taylor series to r^7 (truncation error < 6e-9), in Horner form.
    float p = 1.0f / 5040.0f;
    p = std::fma(p, r, 1.0f / 720.0f);
    p = std::fma(p, r, 1.0f / 120.0f);
    p = std::fma(p, r, 1.0f / 24.0f);
    p = std::fma(p, r, 1.0f / 6.0f);
    p = std::fma(p, r, 0.5f);
    p = std::fma(p, r, 1.0f);
    p = std::fma(p, r, 1.0f);
    // times 2^n, built from its exponent bits (n is in [-126, 127]). A NaN argument passes the
    // clamp as NaN: its n is taken as 0 (converting NaN to an integer is undefined), and p,
    // already NaN, carries it to the result.
    const float n_or_zero = n == n ? n : 0.0f;
    return p * std::bit_cast<float>((static_cast<int32_t>(n_or_zero) + 127) << 23);
}

// GELU, tanh approximation: 0.5 x (1 + tanh(u)) with u = k (x + 0.044715 x^3). Computed as
// x * sigmoid(2u), the same function: one exp, and no cancellation where 1 + tanh(u) -> 0.
constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluC = 0.044715f;

inline float gelu_tanh(float x) {
    const float e = exp_fast(-2.0f * kGeluK * (x + kGeluC * x * x * x));
    return x / (1.0f + e);
}

// d gelu_tanh / dx = s + 2 x s (1 - s) du/dx, with s = sigmoid(2u) = 1 / (1 + e), e = exp(-2u),
// and 1 - s = e s (exact where s -> 1, unlike 1 - s).
inline float gelu_tanh_derivative(float x) {
    const float x2 = x * x;
    const float e = exp_fast(-2.0f * kGeluK * (x + kGeluC * x2 * x));
    const float s = 1.0f / (1.0f + e);
    return s + 2.0f * x * kGeluK * (1.0f + 3.0f * kGeluC * x2) * (e * s) * s;
}

inline float silu(float x) {
    return x / (1.0f + exp_fast(-x));
}

// d silu / dx = s (1 + x (1 - s)), s = sigmoid(x).
inline float silu_derivative(float x) {
    const float e = exp_fast(-x);
    const float s = 1.0f / (1.0f + e);
    return s * (1.0f + x * (e * s));
}

inline float relu(float x) {
    return x > 0.0f ? x : 0.0f;
}
inline float relu_derivative(float x) {
    return x > 0.0f ? 1.0f : 0.0f;
}
inline float relu2(float x) {
    return x > 0.0f ? x * x : 0.0f;
}
inline float relu2_derivative(float x) {
    return x > 0.0f ? 2.0f * x : 0.0f;
}

// Calls f(act_fn, act_derivative) with the two functions of `act`, as function objects, so that
// loops written once over them are instantiated (and vectorised) per activation instead of
// switching per element.
template <class F>
void with_activation(Activation act, F&& f) {
    switch (act) {
        case Activation::Gelu:
            return f([](float x) { return gelu_tanh(x); },
                     [](float x) { return gelu_tanh_derivative(x); });
        case Activation::Silu:
            return f([](float x) { return silu(x); }, [](float x) { return silu_derivative(x); });
        case Activation::Relu:
            return f([](float x) { return relu(x); }, [](float x) { return relu_derivative(x); });
        case Activation::Relu2:
            return f([](float x) { return relu2(x); }, [](float x) { return relu2_derivative(x); });
    }
}

}  // namespace tmx::cpu

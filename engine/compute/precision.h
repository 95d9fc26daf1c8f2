// The precision of the matmuls (docs/design.md#12-precision): fp32, or bf16 operands with fp32
// accumulation, the mixed precision GPU training uses (tensor cores take bf16). Only the
// matmuls and attention's products change (engine/compute/backend.h says exactly how): every
// other op computes in fp32, and the master weights, their gradients and the optimizer stay
// fp32. (A model in BF16 stores a bf16 copy of its weights and the activations only matmuls
// read as BF16 tensors, which are the values the matmuls round to anyway:
// engine/model/model.h.)
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace tmx {

enum class Precision : uint8_t { F32, BF16 };

const char* to_string(Precision p);
// "fp32" or "bf16"; anything else throws tmx::Error naming `what` (a flag or field).
Precision parse_precision(const std::string& text, const std::string& what);

// x rounded to the nearest bfloat16 (ties to even), returned as the fp32 it widens to: the
// upper 16 bits of x's representation after rounding. Infinities stay, overflow rounds to
// infinity, subnormals round like any other value, NaN stays NaN (made quiet, sign kept).
// The same rounding as CUDA's __float2bfloat16_rn, so the CPU and the GPU see the same operands.
inline float round_to_bf16(float x) {
    uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        u = (u | 0x00400000u) & 0xffff0000u;  // quiet NaN: the payload's top bit set survives
    } else {
        u += 0x7fffu + ((u >> 16) & 1u);  // half an ulp of bf16, +1 when that ulp is odd
        u &= 0xffff0000u;
    }
    float r;
    std::memcpy(&r, &u, sizeof r);
    return r;
}

// The 16-bit pattern a BF16 tensor holds for x (round_to_bf16(x)'s upper half), and the value
// a pattern holds.
inline uint16_t to_bf16_bits(float x) {
    const float r = round_to_bf16(x);
    uint32_t u;
    std::memcpy(&u, &r, sizeof u);
    return static_cast<uint16_t>(u >> 16);
}
inline float from_bf16_bits(uint16_t bits) {
    const uint32_t u = static_cast<uint32_t>(bits) << 16;
    float x;
    std::memcpy(&x, &u, sizeof x);
    return x;
}

// The longest head whose attention runs in bf16 under BF16 precision (the CUDA tensor-core
// kernels hold a row of head dims in registers); longer heads keep fp32 attention.
constexpr int64_t kBf16AttentionMaxHeadDim = 128;
inline bool attention_in_bf16(Precision p, int64_t head_dim) {
    return p == Precision::BF16 && head_dim <= kBf16AttentionMaxHeadDim;
}

}  // namespace tmx

// The number formats weights can be stored in for inference (docs/design.md#12-precision):
// f32, bf16, f16 and Q8_0, GGUF's 8-bit block format. A model kept in one of them holds its
// matmul weights and its embedding table in that format in memory, and the backends that read
// the format multiply with it directly (Backend::supports_weight_format). Here: the formats'
// bytes and the host-side conversions every reader and writer shares.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/compute/tensor.h"

namespace tmx {

// Q8_0 (ggml's block_q8_0): blocks of 32 values, each an f16 scale d followed by 32 int8 q;
// value = d * q. A Q8_0 tensor's rows (last dimension) are whole blocks.
inline constexpr int64_t kQ8_0BlockValues = 32;
inline constexpr int64_t kQ8_0BlockBytes = 34;

// Whether t is a format weights may be stored in (F32, BF16, F16, Q8_0).
bool is_weight_format(DType t);
// "f32", "bf16", "f16" or "q8_0" (any case; "fp32", "fp16" too); anything else throws
// tmx::UsageError naming `what` (a flag or field) and the formats.
DType parse_weight_format(const std::string& text, const std::string& what);

// IEEE half: round to nearest even, subnormals kept, beyond 65504 to infinity, NaN stays NaN.
uint16_t f32_to_f16(float f);
float f16_to_f32(uint16_t h);

// Q8_0 as ggml's quantize_row_q8_0_ref: per block of 32 values, d = max|x| / 127 stored as
// f16, then q = roundf(x / d) (computed as x * (1/d), ties away from zero; all zero when d is
// 0). n must be a multiple of 32 (else tmx::Error); `out` receives n / 32 * 34 bytes.
// Non-finite inputs give no undefined behaviour (q is clamped to [-127, 127], a NaN gives 0).
void quantize_q8_0(const float* x, size_t n, uint8_t* out);
// x = f16_to_f32(d) * q for n values (a multiple of 32) from n / 32 * 34 bytes.
void dequantize_q8_0(const uint8_t* in, size_t n, float* out);

// n values (for Q8_0 a multiple of 32) from fp32 into format t's bytes (dtype_bytes(t, n) of
// them; bf16 and f16 round to nearest even), and back to fp32 (exact for every format but
// Q8_0's quantisation, whose values are d * q).
void encode_weights(DType t, const float* x, int64_t n, void* out);
void decode_weights(DType t, const void* in, int64_t n, float* out);

}  // namespace tmx

// The fp16 copy of a weight range (backends/vulkan/vulkan_fp16.h) that the *_f16w matmul
// shaders read: dst word i packs src[2i] (low half) and src[2i + 1] (high half; 0 past the
// end). Rounded to nearest even in integer arithmetic, so the copy is the same on every
// driver (a float16_t conversion's rounding mode is the implementation's choice); finite
// values beyond fp16's range are clamped to +-65504 instead of becoming infinite, infinities
// and NaNs stay what they are.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;

layout(std430, binding = 0) readonly buffer Src { uint src[]; };  // fp32 bit patterns
layout(std430, binding = 1) writeonly buffer Dst { uint dst[]; };

layout(push_constant) uniform Push {
    uint off_src, off_dst;
    uint n;  // elements of src
} pc;

// fp32 bits -> fp16 bits.
uint to_half(uint f) {
    const uint sign = (f >> 16) & 0x8000u, a = f & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u;    // NaN (quiet)
    if (a == 0x7f800000u) return sign | 0x7c00u;   // infinity
    if (a >= 0x477ff000u) return sign | 0x7bffu;   // would round to infinity: 65504
    uint h, rem, half_ulp;
    if (a >= 0x38800000u) {  // normal in fp16: rebias the exponent, drop 13 mantissa bits
        h = (a - 0x38000000u) >> 13;
        rem = a & 0x1fffu;
        half_ulp = 0x1000u;
    } else {  // subnormal in fp16 (units of 2^-24), or zero below 2^-25
        if (a < 0x33000000u) return sign;
        const uint shift = 126u - (a >> 23);  // 14..24
        const uint m = (a & 0x7fffffu) | 0x800000u;
        h = m >> shift;
        rem = m & ((1u << shift) - 1u);
        half_ulp = 1u << (shift - 1u);
    }
    // A carry out of the mantissa moves to the next exponent (or to the smallest normal).
    if (rem > half_ulp || (rem == half_ulp && (h & 1u) != 0u)) ++h;
    return sign | h;
}

void main() {
    const uint i = group_index() * WG + gl_LocalInvocationID.x;
    if (2u * i >= pc.n) return;
    const uint lo = to_half(src[pc.off_src + 2u * i]);
    const uint hi = 2u * i + 1u < pc.n ? to_half(src[pc.off_src + 2u * i + 1u]) : 0u;
    dst[pc.off_dst + i] = lo | (hi << 16);
}

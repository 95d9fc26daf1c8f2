// Rotary position embedding in place, rotate-half pairs (i, i + half) of x [N, H, 2*half].
//
// The angle pos * inv_freq is reduced exactly, without fp64: the table holds each frequency
// in turns per position as a 64-bit fixed-point fraction F (host-computed in double), so
// pos * F mod 2^64 (32x64-bit integer product) is the angle's fraction of a turn. Its top 3
// bits are the octant, the rest a point in the octant, whose sine and cosine come from short
// Taylor polynomials on [0, pi/4] (accurate to an ulp, whatever the driver's sin/cos).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;

layout(std430, binding = 0) buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer Pos { int pos[]; };
layout(std430, binding = 2) readonly buffer Table { uint table[]; };  // (lo, hi) per frequency

layout(push_constant) uniform Push {
    uint off_x, off_pos, off_table;
    uint N, H, half_dim;
    uint inverse;
} pc;

void main() {
    const uint idx = group_index() * WG + gl_LocalInvocationID.x;
    if (idx >= pc.N * pc.H * pc.half_dim) return;
    const uint i = idx % pc.half_dim;
    const uint nh = idx / pc.half_dim;  // n * H + h
    const uint n = nh / pc.H;

    // turns = pos * F mod 2^64, pos sign-extended to 64 bits.
    const int p = pos[pc.off_pos + n];
    const uint f_lo = table[pc.off_table + 2 * i], f_hi = table[pc.off_table + 2 * i + 1];
    uint hi, lo;
    umulExtended(uint(p), f_lo, hi, lo);
    hi += uint(p) * f_hi + (p < 0 ? 0xFFFFFFFFu : 0u) * f_lo;

    const uint octant = hi >> 29;
    uint r_hi = hi & 0x1FFFFFFFu, r_lo = lo;
    if ((octant & 1u) != 0u) {  // odd octants measure from the octant's far end: 2^61 - r
        r_hi = 0x20000000u - r_hi - (r_lo != 0u ? 1u : 0u);
        r_lo = 0u - r_lo;
    }
    const float a = (float(r_hi) * exp2(-29.0) + float(r_lo) * exp2(-61.0)) * 0.78539816339744831;
    const float a2 = a * a;
    const float s = a * (1.0 + a2 * (-1.0 / 6.0 + a2 * (1.0 / 120.0 + a2 * (-1.0 / 5040.0 + a2 * (1.0 / 362880.0)))));
    const float c = 1.0 + a2 * (-0.5 + a2 * (1.0 / 24.0 + a2 * (-1.0 / 720.0 + a2 * (1.0 / 40320.0 + a2 * (-1.0 / 3628800.0)))));
    // angle = octant * pi/4 + (odd ? pi/4 - a : a)
    float sn, cs;
    switch (octant) {
        case 0u: sn = s; cs = c; break;
        case 1u: sn = c; cs = s; break;
        case 2u: sn = c; cs = -s; break;
        case 3u: sn = s; cs = -c; break;
        case 4u: sn = -s; cs = -c; break;
        case 5u: sn = -c; cs = -s; break;
        case 6u: sn = -c; cs = s; break;
        default: sn = -s; cs = c; break;
    }
    if (pc.inverse != 0) sn = -sn;

    const uint base = pc.off_x + nh * 2 * pc.half_dim + i;
    const float x1 = x[base], x2 = x[base + pc.half_dim];
    x[base] = x1 * cs - x2 * sn;
    x[base + pc.half_dim] = x2 * cs + x1 * sn;
}

// Rotary position embedding in place, rotate-half pairs (i, i + half) of x [N, H, 2*half]
// (rope.glsl computes the angle's sine and cosine).
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

#include "rope.glsl"

void main() {
    const uint idx = group_index() * WG + gl_LocalInvocationID.x;
    if (idx >= pc.N * pc.H * pc.half_dim) return;
    const uint i = idx % pc.half_dim;
    const uint nh = idx / pc.half_dim;  // n * H + h
    const uint n = nh / pc.H;

    float sn, cs;
    rope_token_sin_cos(n, i, sn, cs);
    if (pc.inverse != 0) sn = -sn;

    const uint base = pc.off_x + nh * 2 * pc.half_dim + i;
    const float x1 = x[base], x2 = x[base + pc.half_dim];
    x[base] = rope_rotated(x1, x2, true, sn, cs);
    x[base + pc.half_dim] = rope_rotated(x2, x1, false, sn, cs);
}

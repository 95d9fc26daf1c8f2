// d_bias of grouped_matmul's backward: d_bias[e, n] += sum of d_out[s, n] over expert e's slots
// s (from offsets on the device). One invocation per (e, n) (workgroup row y = e) adds its
// column in slot order: a fixed order, so the same bits on every run; neighbouring invocations
// read neighbouring columns. An expert without slots leaves its d_bias untouched.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;

layout(std430, binding = 0) readonly buffer Dy { float dy[]; };  // d_out [S, Nout]
layout(std430, binding = 1) readonly buffer Offsets { int offsets[]; };
layout(std430, binding = 2) buffer Db { float db[]; };  // d_bias [E, Nout], accumulated

layout(push_constant) uniform Push {
    uint off_dy, off_offsets, off_db;
    uint Nout;
} pc;

void main() {
    const uint n = gl_WorkGroupID.x * WG + gl_LocalInvocationID.x, e = gl_WorkGroupID.y;
    if (n >= pc.Nout) return;
    const uint begin = uint(offsets[pc.off_offsets + e]);
    const uint end = uint(offsets[pc.off_offsets + e + 1]);
    if (end <= begin) return;
    float sum = 0.0;
    for (uint s = begin; s < end; ++s) sum += dy[pc.off_dy + s * pc.Nout + n];
    const uint at = pc.off_db + e * pc.Nout + n;
    db[at] = db[at] + sum;
}

// moe_combine's backward: for each (token n, choice j) with slot s = slot_of[n*k + j],
//   d_expert_out[s, :] += gates[n, j] * d_out[n, :]   and   d_gates[n, j] += <d_out[n], y[s]>.
// One workgroup per (n, j) (2-D grid, group_index()): its invocations stride over the d
// columns, doing the elementwise update and partial dot products, which a fixed shared-memory
// tree (reduce.glsl) sums; invocation 0 adds the total. Every slot belongs to one (n, j), so no
// two workgroups write the same element: no atomics, the same bits on every run.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 128;  // a power of two (reduce.glsl)

layout(std430, binding = 0) readonly buffer Y { float y[]; };             // [N*k, d]
layout(std430, binding = 1) readonly buffer SlotOf { int slot_of[]; };    // [N*k]
layout(std430, binding = 2) readonly buffer Gates { float gates[]; };     // [N, k]
layout(std430, binding = 3) readonly buffer DOut { float d_out[]; };      // [N, d]
layout(std430, binding = 4) buffer DY { float d_y[]; };                   // [N*k, d], accumulated
layout(std430, binding = 5) buffer DGates { float d_gates[]; };           // [N, k], accumulated
layout(std430, binding = 6) buffer Status { uint status[]; };

layout(push_constant) uniform Push {
    uint off_y, off_of, off_g, off_do, off_dy, off_dg, off_status;
    uint N, k, d;
} pc;

shared float red[WG];
#include "reduce.glsl"

void main() {
    const uint choice = group_index();  // n * k + j
    const uint slots = pc.N * pc.k;
    if (choice >= slots) return;  // uniform across the workgroup
    const uint t = gl_LocalInvocationID.x;
    const int s = slot_of[pc.off_of + choice];
    if (s < 0 || uint(s) >= slots) {
        if (t == 0) REPORT_ERROR(ERR_SLOT, s, slots);
        return;  // uniform: every invocation read the same s
    }
    const uint n = choice / pc.k;
    const float gate = gates[pc.off_g + choice];
    const uint src = pc.off_do + n * pc.d, row = uint(s) * pc.d;
    float dot = 0.0;
    for (uint c = t; c < pc.d; c += WG) {
        const float g = d_out[src + c];
        d_y[pc.off_dy + row + c] += gate * g;
        dot += g * y[pc.off_y + row + c];
    }
    dot = reduce_sum(dot);
    if (t == 0) d_gates[pc.off_dg + choice] += dot;
}

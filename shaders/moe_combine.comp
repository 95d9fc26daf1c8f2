// out[n, c] += sum_j gates[n, j] * expert_out[slot_of[n*k + j], c], j ascending.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;

layout(std430, binding = 0) readonly buffer Y { float y[]; };
layout(std430, binding = 1) readonly buffer SlotOf { int slot_of[]; };
layout(std430, binding = 2) readonly buffer Gates { float gates[]; };
layout(std430, binding = 3) buffer Out { float o[]; };
layout(std430, binding = 4) buffer Status { uint status[]; };

layout(push_constant) uniform Push {
    uint off_y, off_of, off_g, off_o, off_status;
    uint N, k, d;
} pc;

void main() {
    const uint idx = group_index() * WG + gl_LocalInvocationID.x;
    if (idx >= pc.N * pc.d) return;
    const uint n = idx / pc.d, c = idx % pc.d;
    const uint slots = pc.N * pc.k;
    float acc = o[pc.off_o + idx];
    for (uint j = 0; j < pc.k; ++j) {
        const int s = slot_of[pc.off_of + n * pc.k + j];
        if (s < 0 || uint(s) >= slots) {
            if (c == 0) REPORT_ERROR(ERR_SLOT, s, slots);
            continue;
        }
        acc += gates[pc.off_g + n * pc.k + j] * y[pc.off_y + uint(s) * pc.d + c];
    }
    o[pc.off_o + idx] = acc;
}

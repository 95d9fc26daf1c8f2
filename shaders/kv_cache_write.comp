// Stores a chunk's keys and values in the rolling cache: position start[b] + t goes to slot
// (start[b] + t) mod S. Only the chunk's last min(T, S) positions are written, so no two
// invocations write one slot.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;

layout(std430, binding = 0) readonly buffer K { float k[]; };
layout(std430, binding = 1) readonly buffer V { float v[]; };
layout(std430, binding = 2) writeonly buffer KC { float kc[]; };
layout(std430, binding = 3) writeonly buffer VC { float vc[]; };
layout(std430, binding = 4) readonly buffer Start { int start[]; };

layout(push_constant) uniform Push {
    uint off_k, off_v, off_kc, off_vc, off_start;
    uint B, T, S, row;  // row: floats per position (Hkv * head_dim)
} pc;

void main() {
    const uint written = min(pc.T, pc.S);
    const uint idx = group_index() * WG + gl_LocalInvocationID.x;
    if (idx >= pc.B * written * pc.row) return;
    const uint e = idx % pc.row;
    const uint bt = idx / pc.row;
    const uint b = bt / written, t = pc.T - written + bt % written;
    const uint slot = (uint(start[pc.off_start + b]) + t) % pc.S;
    const uint src = (b * pc.T + t) * pc.row + e, dst = (b * pc.S + slot) * pc.row + e;
    kc[pc.off_kc + dst] = k[pc.off_k + src];
    vc[pc.off_vc + dst] = v[pc.off_v + src];
}

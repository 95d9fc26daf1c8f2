// Stores a chunk's keys and values in the rolling cache (kv_cache_write.glsl): one invocation
// per element written.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;

layout(push_constant) uniform Push {
    uint off_k, off_v, off_kc, off_vc, off_start;
    uint B, T, S, row;  // row: floats per position (Hkv * head_dim)
} pc;

#define KV_WRITE_BINDING 0
#include "kv_cache_write.glsl"

void main() {
    const uint idx = group_index() * WG + gl_LocalInvocationID.x;
    if (idx < kv_write_elements()) kv_write(idx);
}

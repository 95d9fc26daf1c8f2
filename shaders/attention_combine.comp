// Attention for a few queries, phase 2 of 2: merges attention_split.comp's slices. One
// invocation per output element (row = (b, i, h), column c):
//   M = max_s m_s,  out = sum_s exp(m_s - M) acc_s[c] / sum_s exp(m_s - M) l_s,
// skipping empty slices (m_s = -inf). Slice 0 is never empty: it starts at the window's first
// key, so M is finite.
// With B > 0 (rope_attention_cached_store), the same dispatch also stores the chunk in the
// cache (kv_cache_write.glsl; its elements are never more than the output's, as Hkv <= H),
// its keys rotated with rope != 0: phase 1 has read the cache before this dispatch's barrier,
// and this phase does not read it. With B = 0 the write's bindings are dummies.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;

layout(std430, binding = 0) readonly buffer Part { float part[]; };
layout(std430, binding = 1) writeonly buffer Out { float o[]; };

layout(push_constant) uniform Push {
    uint off_part, off_o, off_k, off_v, off_kc, off_vc, off_start, off_pos, off_table;
    uint rows, hd, n_split;
    uint B, T, S, row;  // the cache write's (kv_cache_write.glsl); B = 0: none
    uint rope;          // the keys it stores rotated
} pc;

#define KV_WRITE_BINDING 2
#define KV_WRITE_ROPE
#include "kv_cache_write.glsl"

void main() {
    const uint idx = group_index() * WG + gl_LocalInvocationID.x;
    if (idx < kv_write_elements()) kv_write(idx);
    if (idx >= pc.rows * pc.hd) return;
    const uint row = idx / pc.hd, c = idx % pc.hd, rec = pc.hd + 2;
    const uint base = pc.off_part + row * pc.n_split * rec;
    float M = NEG_INF;
    for (uint s = 0; s < pc.n_split; ++s) M = max(M, part[base + s * rec]);
    float num = 0.0, den = 0.0;
    for (uint s = 0; s < pc.n_split; ++s) {
        const float m = part[base + s * rec];
        if (m == NEG_INF) continue;
        const float f = exp(m - M);
        den += f * part[base + s * rec + 1];
        num += f * part[base + s * rec + 2 + c];
    }
    o[pc.off_o + idx] = num / den;
}

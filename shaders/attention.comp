// Causal sliding-window GQA attention, for a whole sequence (attention) or for a chunk of new
// tokens against the rolling KV cache (attention_cached; has_cache = 1): the fallback where
// attention_split.comp (few queries) and attention_tiled.comp (many) do not apply. One
// workgroup per (query, head, sequence); keys are visited oldest first in chunks of CH with an
// online softmax (running max and normaliser), so any window length fits in shared memory.
// Positions, windows and the cache mapping: attention_common.glsl.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;   // a power of two
layout(constant_id = 1) const uint CH = 256;  // keys per chunk, a multiple of WG
const uint MAX_HEAD_DIM = 256;
const uint PER_THREAD = (MAX_HEAD_DIM + WG - 1) / WG;
shared float red[WG];
#include "reduce.glsl"

#include "attention_common.glsl"

shared float qs[MAX_HEAD_DIM];
shared float weight[CH];

void main() {
    const uint i = gl_WorkGroupID.x, h = gl_WorkGroupID.y, b = gl_WorkGroupID.z;
    const uint t = gl_LocalInvocationID.x;
    const uint kvh = h / (pc.H / pc.Hkv);
    const uint p0 = chunk_start(b);
    const uint p = p0 + i;
    const uint first = first_key(p0, p);
    const uint n_keys = p - first + 1;

    const uint q_row = ((b * pc.T + i) * pc.H + h) * pc.hd;
    for (uint c = t; c < pc.hd; c += WG) qs[c] = q[pc.off_q + q_row + c];
    barrier();

    float m_run = -3.0e38, l_run = 0.0;
    float acc[PER_THREAD];
    for (uint r = 0; r < PER_THREAD; ++r) acc[r] = 0.0;

    for (uint c0 = 0; c0 < n_keys; c0 += CH) {
        const uint count = min(CH, n_keys - c0);
        float local_max = -3.0e38;
        for (uint x = t; x < CH; x += WG) {
            float s = -3.0e38;
            if (x < count) {
                bool cached;
                const uint row = kv_row(b, kvh, p0, first + c0 + x, cached);
                float dot = 0.0;
                for (uint c = 0; c < pc.hd; ++c) dot += qs[c] * key_at(row, cached, c);
                s = dot * pc.scale;
            }
            weight[x] = s;
            local_max = max(local_max, s);
        }
        const float m_new = max(m_run, reduce_max(local_max));
        const float alpha = exp(m_run - m_new);
        float local_sum = 0.0;
        for (uint x = t; x < CH; x += WG) {
            const float w = x < count ? exp(weight[x] - m_new) : 0.0;
            weight[x] = w;
            local_sum += w;
        }
        l_run = l_run * alpha + reduce_sum(local_sum);  // the reduction's barrier publishes weight
        for (uint r = 0; r < PER_THREAD; ++r) {
            const uint c = t + r * WG;
            if (c >= pc.hd) break;
            float a = acc[r] * alpha;
            for (uint x = 0; x < count; ++x) {
                bool cached;
                const uint row = kv_row(b, kvh, p0, first + c0 + x, cached);
                a += weight[x] * value_at(row, cached, c);
            }
            acc[r] = a;
        }
        m_run = m_new;
        barrier();  // weight is rewritten by the next chunk
    }
    const uint o_row = pc.off_o + q_row;
    for (uint r = 0; r < PER_THREAD; ++r) {
        const uint c = t + r * WG;
        if (c < pc.hd) o[o_row + c] = acc[r] / l_run;
    }
}

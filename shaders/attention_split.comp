// Attention for a few queries (decode) as a split-K pass, phase 1 of 2: the window of each
// query is cut into pc.n_split slices of pc.slice_len keys, so short batches still fill a GPU.
// One workgroup per (slice, group of pc.heads query heads of one kv head, query) computes, per
// head, the slice's max score m, l = sum exp(s - m) and the unnormalised sum of exp(s - m) v;
// the group shares one read of each key and value row (GQA). attention_combine.comp merges
// the slices. A slice past the end of a short window is empty: m = -inf, l = 0, sum 0.
//
// Partials (binding 6): per (b, i, h, slice), in that order, a record [m, l, acc[hd]].
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(constant_id = 1) const uint SL = 64;  // the most keys per slice (pc.slice_len <= SL)
const uint MAX_GROUP = 16;                   // pc.heads <= MAX_GROUP
const uint MAX_GROUP_DIM = 2048;             // pc.heads * pc.hd <= MAX_GROUP_DIM
#define ATTENTION_ROPE  // rope_attention_cached_store: q and the chunk's keys rotated on reading
#include "attention_common.glsl"

shared float qs[MAX_GROUP_DIM];       // the group's queries, scaled
shared float score[MAX_GROUP * SL];   // per head: scores, then exp(score - m)
shared float slice_max[MAX_GROUP], slice_sum[MAX_GROUP];

void main() {
    const uint s = gl_WorkGroupID.x, h0 = gl_WorkGroupID.y * pc.heads;
    const uint b = gl_WorkGroupID.z / pc.T, i = gl_WorkGroupID.z % pc.T;
    const uint t = gl_LocalInvocationID.x, G = pc.heads;
    const uint kvh = h0 / (pc.H / pc.Hkv);
    const uint p0 = chunk_start(b), p = p0 + i;
    const uint lo = first_key(p0, p) + s * pc.slice_len;
    const uint n = lo > p ? 0u : min(pc.slice_len, p + 1 - lo);

    // The group's heads are adjacent in the query row.
    const uint q_base = ((b * pc.T + i) * pc.H + h0) * pc.hd;
    for (uint e = t; e < G * pc.hd; e += WG) {
        const uint c = e % pc.hd;
        qs[e] = ROTATED(q, pc.off_q, q_base + e - c, b * pc.T + i, c) * pc.scale;
    }
    barrier();

    for (uint x = t; x < n; x += WG) {
        bool cached;
        const uint row = kv_row(b, kvh, p0, lo + x, cached);
        float dot[MAX_GROUP];
        for (uint g = 0; g < MAX_GROUP; ++g) dot[g] = 0.0;
        for (uint c = 0; c < pc.hd; ++c) {
            const float kx = key_at(row, cached, c);
            for (uint g = 0; g < MAX_GROUP; ++g)
                if (g < G) dot[g] += qs[g * pc.hd + c] * kx;
        }
        for (uint g = 0; g < MAX_GROUP; ++g)
            if (g < G) score[g * SL + x] = dot[g];
    }
    barrier();

    // At most SL keys: one invocation per head does its max and sum serially.
    if (t < G) {
        float m = NEG_INF, l = 0.0;
        for (uint x = 0; x < n; ++x) m = max(m, score[t * SL + x]);
        for (uint x = 0; x < n; ++x) {
            const float w = exp(score[t * SL + x] - m);
            score[t * SL + x] = w;
            l += w;
        }
        slice_max[t] = m;
        slice_sum[t] = l;
    }
    barrier();

    const uint rec = pc.hd + 2, head_stride = pc.n_split * rec;
    const uint out_base = pc.off_o + (((b * pc.T + i) * pc.H + h0) * pc.n_split + s) * rec;
    for (uint c = t; c < pc.hd; c += WG) {
        float acc[MAX_GROUP];
        for (uint g = 0; g < MAX_GROUP; ++g) acc[g] = 0.0;
        for (uint x = 0; x < n; ++x) {
            bool cached;
            const uint row = kv_row(b, kvh, p0, lo + x, cached);
            const float vx = value_at(row, cached, c);
            for (uint g = 0; g < MAX_GROUP; ++g)
                if (g < G) acc[g] += score[g * SL + x] * vx;
        }
        for (uint g = 0; g < MAX_GROUP; ++g)
            if (g < G) o[out_base + g * head_stride + 2 + c] = acc[g];
    }
    if (t < G) {
        o[out_base + t * head_stride] = slice_max[t];
        o[out_base + t * head_stride + 1] = slice_sum[t];
    }
}

// Attention for a few queries (decode) as a split-K pass, phase 1 of 2: the window of each
// query is cut into pc.n_split slices of pc.slice_len keys, so short batches still fill a GPU.
// One workgroup per (slice, group of pc.heads query heads of one kv head, query) computes, per
// head, the slice's max score m, l = sum exp(s - m) and the unnormalised sum of exp(s - m) v;
// the group shares one read of each key and value row (GQA). attention_combine.comp merges
// the slices. A slice past the end of a short window is empty: m = -inf, l = 0, sum 0.
//
// Scores: LPK = ceil(WG / SL) invocations per key, each summing every LPK-th element of the
// head's dot products (adjacent invocations read adjacent elements of a key row), then the
// first of them adds the LPK parts in lane order: a fixed summation order for a given WG and
// SL. The chunk's keys (its T positions, rotated when pc.rope != 0: q is rotated likewise) are
// staged in shared memory first, so the key loop reads the cache or shared memory and never
// rotates.
//
// Partials (binding 6): per (b, i, h, slice), in that order, a record [m, l, acc[hd]].
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(constant_id = 1) const uint SL = 64;  // the most keys per slice (pc.slice_len <= SL)
const uint LPK = (WG + SL - 1) / SL;         // invocations per key
const uint KEYS_AT_ONCE = WG / LPK;
const uint MAX_GROUP = 16;        // pc.heads <= MAX_GROUP
const uint MAX_GROUP_DIM = 2048;  // pc.heads * pc.hd <= MAX_GROUP_DIM
const uint MAX_CHUNK_DIM = 1024;  // pc.T * pc.hd <= MAX_CHUNK_DIM
#define ATTENTION_ROPE  // rope_attention_cached_store: q and the chunk's keys rotated on reading
#include "attention_common.glsl"

shared float qs[MAX_GROUP_DIM];       // the group's queries, scaled
shared float ks[MAX_CHUNK_DIM];       // the chunk's keys of the group's kv head
shared float score[MAX_GROUP * SL];   // per head: scores, then exp(score - m)
shared float parts[MAX_GROUP * WG];   // LPK > 1: each invocation's part of each head's dot
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
    for (uint e = t; e < pc.T * pc.hd; e += WG) {
        const uint j = e / pc.hd, c = e % pc.hd;
        ks[e] = ROTATED(k, pc.off_k, ((b * pc.T + j) * pc.Hkv + kvh) * pc.hd, b * pc.T + j, c);
    }
    barrier();

    const uint lane = t % LPK, slot = t / LPK;
    for (uint x0 = 0; x0 < n; x0 += KEYS_AT_ONCE) {  // n is the workgroup's: barriers are safe
        const uint x = x0 + slot;
        const bool mine = slot < KEYS_AT_ONCE && x < n;
        float dot[MAX_GROUP];
        for (uint g = 0; g < MAX_GROUP; ++g) dot[g] = 0.0;
        if (mine) {
            const uint j = lo + x;
            if (pc.has_cache != 0 && j < p0) {
                const uint row = pc.off_kc + ((b * pc.S + j % pc.S) * pc.Hkv + kvh) * pc.hd;
                for (uint c = lane; c < pc.hd; c += LPK) {
                    const float kx = kc[row + c];
                    for (uint g = 0; g < MAX_GROUP; ++g)
                        if (g < G) dot[g] += qs[g * pc.hd + c] * kx;
                }
            } else {
                const uint row = (j - p0) * pc.hd;
                for (uint c = lane; c < pc.hd; c += LPK) {
                    const float kx = ks[row + c];
                    for (uint g = 0; g < MAX_GROUP; ++g)
                        if (g < G) dot[g] += qs[g * pc.hd + c] * kx;
                }
            }
        }
        if (LPK == 1) {
            if (mine)
                for (uint g = 0; g < MAX_GROUP; ++g)
                    if (g < G) score[g * SL + x] = dot[g];
        } else {
            for (uint g = 0; g < MAX_GROUP; ++g)
                if (g < G) parts[g * WG + t] = dot[g];
            barrier();
            if (mine && lane == 0)
                for (uint g = 0; g < MAX_GROUP; ++g)
                    if (g < G) {
                        float sum = 0.0;
                        for (uint l = 0; l < LPK; ++l) sum += parts[g * WG + t + l];
                        score[g * SL + x] = sum;
                    }
            barrier();
        }
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

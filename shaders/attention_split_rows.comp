// Decoding's attention, phase 1 of 2, in short dependency chains (the ".v4" variants of the
// attention_split family): the same slices, workgroups and partial records as
// attention_split.comp, which attention_combine.comp merges, computed so that no invocation
// walks a long chain of dependent reads:
// - scores: one invocation per key, its dot products with the group's G heads over the
//   head's HD channels in vec4 reads, a loop of HD / 4 the compiler unrolls (HD and G are
//   specialization constants), so a key row's reads are all in flight at once;
// - the slice's max and sum per head: pairwise trees over its n scores (padded to a power of
//   two, at most SL), log2 steps, not n serial ones; an empty slice writes its record at once;
// - the weighted sum of values: HD / 4 invocations per key group, each a vec4 of channels over
//   every KG-th key, then the KG parts added in group order through shared memory.
// Every order is fixed for a given WG, SL and HD: the same bits on every run. Needs HD a
// multiple of 4 and at most 4 * WG (the host keeps attention_split.comp for other heads).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(constant_id = 1) const uint SL = 64;  // the most keys per slice, a power of two
layout(constant_id = 2) const uint HD = 64;  // head_dim (pc.hd)
layout(constant_id = 3) const uint G = 1;    // query heads per group (pc.heads)
const uint Q4 = HD / 4;                      // vec4s a row
const uint KG = WG / Q4;                     // key groups of the value pass
const uint MAX_GROUP_DIM = 2048;             // G * HD <= MAX_GROUP_DIM
const uint MAX_CHUNK_DIM = 1024;             // pc.T * HD <= MAX_CHUNK_DIM
// The trees' G rows of SL, later the value pass's KG parts of HD channels (at most 4 * WG).
const uint RED = G * SL > 4 * WG ? G * SL : 4 * WG;
#define ATTENTION_ROPE  // rope_attention_cached_store: q and the chunk's keys rotated on reading
#include "attention_common.glsl"

shared vec4 qs[MAX_GROUP_DIM / 4];   // the group's queries, scaled
shared vec4 ks[MAX_CHUNK_DIM / 4];   // the chunk's keys of the group's kv head
shared float score[G * SL];          // per head: scores, then exp(score - m), 0 past n
shared float red[RED];
shared float slice_max[G], slice_sum[G];

vec4 cached_key(uint row, uint c4) {
    const uint e = pc.off_kc + row + 4 * c4;
    return vec4(kc[e], kc[e + 1], kc[e + 2], kc[e + 3]);
}

vec4 value4(uint row, bool cached, uint c4) {
    const uint e = row + 4 * c4;
    if (cached) {
        const uint f = pc.off_vc + e;
        return vec4(vc[f], vc[f + 1], vc[f + 2], vc[f + 3]);
    }
    const uint f = pc.off_v + e;
    return vec4(v[f], v[f + 1], v[f + 2], v[f + 3]);
}

// The max (sum when `add`) of each head's first `width` values in red (a power of two, at
// most SL), left at red[g * SL]: a pairwise tree. Every invocation calls it, in uniform
// control flow.
void tree(bool add, uint width) {
    for (uint w = width / 2; w > 0; w >>= 1) {
        for (uint e = gl_LocalInvocationID.x; e < G * w; e += WG) {
            const uint at = (e / w) * SL + e % w;
            red[at] = add ? red[at] + red[at + w] : max(red[at], red[at + w]);
        }
        barrier();
    }
}

void main() {
    const uint s = gl_WorkGroupID.x, h0 = gl_WorkGroupID.y * G;
    const uint b = gl_WorkGroupID.z / pc.T, i = gl_WorkGroupID.z % pc.T;
    const uint t = gl_LocalInvocationID.x;
    const uint kvh = h0 / (pc.H / pc.Hkv);
    const uint p0 = chunk_start(b), p = p0 + i;
    const uint lo = first_key(p0, p) + s * pc.slice_len;
    const uint n = lo > p ? 0u : min(pc.slice_len, p + 1 - lo);
    const uint rec = HD + 2, head_stride = pc.n_split * rec;
    const uint out_base = pc.off_o + (((b * pc.T + i) * pc.H + h0) * pc.n_split + s) * rec;
    if (n == 0) {  // a slice past a short window's end (n is the workgroup's: no barrier skipped)
        for (uint e = t; e < G * rec; e += WG) {
            const uint at = e % rec;
            o[out_base + (e / rec) * head_stride + at] = at == 0 ? NEG_INF : 0.0;
        }
        return;
    }
    // The trees' width: the slice's keys rounded up to a power of two.
    const uint width = min(SL, n == 1 ? 1u : 2u << findMSB(n - 1));

    // The group's heads are adjacent in the query row.
    const uint q_base = ((b * pc.T + i) * pc.H + h0) * HD;
    for (uint e = t; e < G * HD; e += WG) {
        const uint c = e % HD;
        qs[e / 4][e % 4] = ROTATED(q, pc.off_q, q_base + e - c, b * pc.T + i, c) * pc.scale;
    }
    for (uint e = t; e < pc.T * HD; e += WG) {
        const uint j = e / HD, c = e % HD;
        ks[e / 4][e % 4] =
            ROTATED(k, pc.off_k, ((b * pc.T + j) * pc.Hkv + kvh) * HD, b * pc.T + j, c);
    }
    barrier();

    // Scores: a key per invocation.
    for (uint x = t; x < n; x += WG) {
        const uint j = lo + x;
        float dot4[G];
        for (uint g = 0; g < G; ++g) dot4[g] = 0.0;
        if (pc.has_cache != 0 && j < p0) {
            const uint row = ((b * pc.S + j % pc.S) * pc.Hkv + kvh) * HD;
            for (uint c4 = 0; c4 < Q4; ++c4) {
                const vec4 kx = cached_key(row, c4);
                for (uint g = 0; g < G; ++g) dot4[g] += dot(qs[g * Q4 + c4], kx);
            }
        } else {
            const uint row = (j - p0) * Q4;
            for (uint c4 = 0; c4 < Q4; ++c4) {
                const vec4 kx = ks[row + c4];
                for (uint g = 0; g < G; ++g) dot4[g] += dot(qs[g * Q4 + c4], kx);
            }
        }
        for (uint g = 0; g < G; ++g) score[g * SL + x] = dot4[g];
    }
    barrier();

    // Each head's max, then its weights exp(score - max) (0 past n) and their sum: over the
    // first `width` places of each head's row.
    for (uint e = t; e < G * width; e += WG) {
        const uint at = (e / width) * SL + e % width;
        red[at] = e % width < n ? score[at] : NEG_INF;
    }
    barrier();
    tree(false, width);
    if (t < G) slice_max[t] = red[t * SL];
    barrier();
    for (uint e = t; e < G * width; e += WG) {
        const uint at = (e / width) * SL + e % width;
        const float w = e % width < n ? exp(score[at] - slice_max[e / width]) : 0.0;
        score[at] = w;
        red[at] = w;
    }
    barrier();
    tree(true, width);
    if (t < G) slice_sum[t] = red[t * SL];

    // The weighted values: channels c4 of every KG-th key from key group kg.
    const uint c4 = t % Q4, kg = t / Q4;
    vec4 acc[G];
    for (uint g = 0; g < G; ++g) acc[g] = vec4(0.0);
    if (kg < KG)
        for (uint x = kg; x < n; x += KG) {
            bool cached;
            const uint row = kv_row(b, kvh, p0, lo + x, cached);
            const vec4 vx = value4(row, cached, c4);
            for (uint g = 0; g < G; ++g) acc[g] += score[g * SL + x] * vx;
        }

    for (uint g = 0; g < G; ++g) {
        barrier();  // red is free: the sum tree's (or the last head's) reads are done
        if (kg < KG)
            for (uint l = 0; l < 4; ++l) red[kg * HD + 4 * c4 + l] = acc[g][l];
        barrier();
        for (uint c = t; c < HD; c += WG) {
            float sum = 0.0;
            for (uint part = 0; part < KG; ++part) sum += red[part * HD + c];
            o[out_base + g * head_stride + 2 + c] = sum;
        }
    }
    if (t < G) {
        o[out_base + t * head_stride] = slice_max[t];
        o[out_base + t * head_stride + 1] = slice_sum[t];
    }
}

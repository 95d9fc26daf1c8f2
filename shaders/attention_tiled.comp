// Attention for many queries (prefill): one workgroup per (tile of BQ consecutive queries,
// head, sequence) walks the keys the tile needs, from the first query's first key to the last
// query's position, in tiles of BK keys staged in shared memory (the key tile, then the value
// tile in the same array), with an online softmax per query. The sliding-window and causal
// mask is applied per (query, key); masked scores are -inf and weigh exactly 0. head_dim is at
// most MAX_HEAD_DIM (the host falls back to attention.comp above it).
//
// WG / BQ invocations share a query: each scores every (WG / BQ)-th key of the tile and owns
// every (WG / BQ)-th output column.
//
// Shared-memory rows are padded so that the invocations of a subgroup, which read one column
// of several rows at once, hit different banks (32 banks of 4 bytes on NVIDIA and AMD): query
// and key/value rows have an odd stride (pc.hd, or pc.hd + 1), score and weight rows a stride
// of BK + LANES, which puts the LANES invocations of the 32 / LANES queries on banks
// 0..31. Unpadded, head_dim 64 and BK 32 had 4 to 8 invocations on one bank.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;  // a multiple of BQ
layout(constant_id = 1) const uint BQ = 16;  // queries per tile
layout(constant_id = 2) const uint BK = 32;  // keys per tile
const uint MAX_HEAD_DIM = 128;
const uint LANES = WG / BQ;
const uint PER_LANE = (MAX_HEAD_DIM + LANES - 1) / LANES;
#include "attention_common.glsl"

const uint ROW_MAX = MAX_HEAD_DIM + 1;  // the longest padded query or key row
const uint SROW = BK + LANES;            // a padded row of scores or weights
shared float qs[BQ * ROW_MAX];  // the query tile, scaled
shared float kv[BK * ROW_MAX];  // the key tile, then the value tile
shared float score[BQ * SROW];
shared float weight[BQ * SROW];

// Stages rows [j0, j0 + nk) of the keys or values in kv, `row` floats apart; rows past nk are
// zero.
void stage(uint b, uint kvh, uint p0, uint j0, uint nk, bool values, uint row) {
    for (uint e = gl_LocalInvocationID.x; e < BK * pc.hd; e += WG) {
        const uint x = e / pc.hd, c = e % pc.hd;
        float val = 0.0;
        if (x < nk) {
            bool cached;
            const uint at = kv_row(b, kvh, p0, j0 + x, cached);
            val = values ? value_at(at, cached, c) : key_at(at, cached, c);
        }
        kv[x * row + c] = val;
    }
}

void main() {
    const uint i0 = gl_WorkGroupID.x * BQ, h = gl_WorkGroupID.y, b = gl_WorkGroupID.z;
    const uint t = gl_LocalInvocationID.x, qi = t / LANES, lane = t % LANES;
    const uint kvh = h / (pc.H / pc.Hkv);
    const uint p0 = chunk_start(b);
    const uint nq = min(BQ, pc.T - i0);
    // The union of the tile's windows: first_key grows with the position.
    const uint lo = first_key(p0, p0 + i0), hi = p0 + i0 + nq - 1;
    const uint row = pc.hd | 1u;  // odd

    for (uint e = t; e < BQ * pc.hd; e += WG) {
        const uint r = e / pc.hd, c = e % pc.hd;
        qs[r * row + c] =
            r < nq ? q[pc.off_q + ((b * pc.T + i0 + r) * pc.H + h) * pc.hd + c] * pc.scale : 0.0;
    }
    const bool valid = qi < nq;
    const uint p = p0 + i0 + qi, first = first_key(p0, p);

    float m_run = NEG_INF, l_run = 0.0;
    float acc[PER_LANE];
    for (uint r = 0; r < PER_LANE; ++r) acc[r] = 0.0;

    for (uint j0 = lo; j0 <= hi; j0 += BK) {
        const uint nk = min(BK, hi + 1 - j0);
        barrier();  // the previous value tile (and the query tile's writes) are done
        stage(b, kvh, p0, j0, nk, false, row);
        barrier();
        for (uint x = lane; x < BK; x += LANES) {
            const uint j = j0 + x;
            float s = NEG_INF;
            if (valid && x < nk && j >= first && j <= p) {
                s = 0.0;
                for (uint c = 0; c < pc.hd; ++c) s += qs[qi * row + c] * kv[x * row + c];
            }
            score[qi * SROW + x] = s;
        }
        barrier();  // scores are complete and the key tile is no longer read

        float tile_max = NEG_INF;
        for (uint x = 0; x < BK; ++x) tile_max = max(tile_max, score[qi * SROW + x]);
        const float m_new = max(m_run, tile_max);
        for (uint x = lane; x < BK; x += LANES) {
            const float s = score[qi * SROW + x];
            weight[qi * SROW + x] = s == NEG_INF ? 0.0 : exp(s - m_new);
        }
        stage(b, kvh, p0, j0, nk, true, row);
        barrier();

        // Nothing seen yet (m_run = -inf): acc and l are 0, the factor must not be NaN.
        const float alpha = m_run == NEG_INF ? 0.0 : exp(m_run - m_new);
        float sum = 0.0;
        for (uint x = 0; x < nk; ++x) sum += weight[qi * SROW + x];
        l_run = l_run * alpha + sum;
        for (uint r = 0; r < PER_LANE; ++r) {
            const uint c = lane + r * LANES;
            if (c >= pc.hd) break;
            float a = acc[r] * alpha;
            for (uint x = 0; x < nk; ++x) a += weight[qi * SROW + x] * kv[x * row + c];
            acc[r] = a;
        }
        m_run = m_new;
    }
    if (!valid) return;
    const uint o_row = pc.off_o + ((b * pc.T + i0 + qi) * pc.H + h) * pc.hd;
    for (uint r = 0; r < PER_LANE; ++r) {
        const uint c = lane + r * LANES;
        if (c < pc.hd) o[o_row + c] = acc[r] / l_run;
    }
}

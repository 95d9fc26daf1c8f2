// Backward of causal sliding-window GQA attention, pass 1 of 2, tiled: the query side of
// attention_backward.comp (same outputs) for head_dim <= MAX_HEAD_DIM. One workgroup per (tile
// of BQ consecutive queries, head h, sequence b) stages the tile's q and dO rows in shared
// memory, then walks the keys the tile needs (the first query's first key to the last query)
// in tiles of BK keys, each staged with its values in shared memory, twice:
//   1. softmax statistics: m_i = max_j s_ij, l_i = sum_j exp(s_ij - m_i) and
//      D_i = sum_j P_ij dP_ij, with s_ij = scale q_i . k_j and dP_ij = dO_i . v_j;
//   2. dS_ij = P_ij (dP_ij - D_i) scale with P_ij = exp(s_ij - m_i) / l_i, and
//      d_q_i += sum_j dS_ij k_j.
// m_i, l_i, D_i go to stats [B, H, T, 3] for pass 2 (attention_backward_kv_tiled.comp, or
// attention_backward_kv.comp: the layout is the same). The causal and sliding-window mask is
// applied per (query, key); no T x T matrix exists anywhere.
//
// LANES = WG / BQ invocations share a query. Lane `lane` scores keys lane, lane + LANES, ... of
// every key tile (its scores stay in its registers) and owns d_q columns lane, lane + LANES, ...
// In sweep 1 each lane keeps online statistics over its own keys, merged in lane order at the
// end. Every sum runs in a fixed order and every output has one writer (no atomics), so results
// are bitwise reproducible.
//
// Shared rows are padded as in attention_tiled.comp: q, dO, key and value rows have an odd
// stride (pc.hd | 1), dS rows a stride of BK + LANES, so that a subgroup's invocations, reading
// one column of several rows at once, hit different banks.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;            // a multiple of BQ
layout(constant_id = 1) const uint BQ = 16;            // queries per tile
layout(constant_id = 2) const uint BK = 16;            // keys per tile, a multiple of WG / BQ
layout(constant_id = 3) const uint MAX_HEAD_DIM = 64;  // sizes the tiles; pc.hd is at most this
const uint LANES = WG / BQ;
const uint KEYS_PER_LANE = BK / LANES;
const uint PER_LANE = (MAX_HEAD_DIM + LANES - 1) / LANES;
const uint ROW_MAX = MAX_HEAD_DIM + 1;  // the longest padded row
const uint SROW = BK + LANES;           // a padded row of dS

layout(std430, binding = 0) readonly buffer Q { float q[]; };
layout(std430, binding = 1) readonly buffer K { float k[]; };
layout(std430, binding = 2) readonly buffer V { float v[]; };
layout(std430, binding = 3) readonly buffer DO { float d_out[]; };
layout(std430, binding = 4) buffer DQ { float d_q[]; };
layout(std430, binding = 5) writeonly buffer Stats { float stats[]; };

layout(push_constant) uniform Push {
    uint off_q, off_k, off_v, off_do, off_dq, off_stats;
    uint T, H, Hkv, hd;
    uint window;  // 0: unlimited
    float scale;
} pc;

// The host's shared-memory need (attention.cpp, backward_tiled_shared_bytes) counts these.
shared float qs[BQ * ROW_MAX];   // the query tile
shared float dos[BQ * ROW_MAX];  // its d_out rows
shared float ks[BK * ROW_MAX];   // the key tile
shared float vs[BK * ROW_MAX];   // its value rows
shared float ds[BQ * SROW];      // sweep 2: dS of the tiles
shared float lane_stats[BQ * LANES * 3];  // sweep 1's m, l, D numerator per (query, lane)

// The oldest key query i sees.
uint first_key(uint i) { return pc.window > 0 && i + 1 > pc.window ? i + 1 - pc.window : 0u; }

// Stages keys and values [j0, j0 + nk) (element offset of key 0's row: kv0); rows past nk are 0.
void stage_keys(uint kv0, uint j0, uint nk, uint row) {
    const uint kv_stride = pc.Hkv * pc.hd;
    for (uint e = gl_LocalInvocationID.x; e < BK * pc.hd; e += WG) {
        const uint x = e / pc.hd, c = e % pc.hd;
        const uint at = kv0 + (j0 + x) * kv_stride + c;
        ks[x * row + c] = x < nk ? k[pc.off_k + at] : 0.0;
        vs[x * row + c] = x < nk ? v[pc.off_v + at] : 0.0;
    }
}

// s = scale q . k and dP = dO . v of tile query qi and this lane's keys of the tile (x = lane,
// lane + LANES, ...), into lane_s and lane_dp: each q and dO element read serves every key.
float lane_s[KEYS_PER_LANE], lane_dp[KEYS_PER_LANE];
void lane_scores(uint qi, uint lane, uint row) {
    for (uint n = 0; n < KEYS_PER_LANE; ++n) lane_s[n] = lane_dp[n] = 0.0;
    for (uint c = 0; c < pc.hd; ++c) {
        const float qc = qs[qi * row + c], dc = dos[qi * row + c];
        for (uint n = 0; n < KEYS_PER_LANE; ++n) {
            const uint x = lane + n * LANES;
            lane_s[n] += qc * ks[x * row + c];
            lane_dp[n] += dc * vs[x * row + c];
        }
    }
    for (uint n = 0; n < KEYS_PER_LANE; ++n) lane_s[n] *= pc.scale;
}

void main() {
    const uint i0 = gl_WorkGroupID.x * BQ, h = gl_WorkGroupID.y, b = gl_WorkGroupID.z;
    const uint t = gl_LocalInvocationID.x, qi = t / LANES, lane = t % LANES;
    const uint kvh = h / (pc.H / pc.Hkv);
    const uint nq = min(BQ, pc.T - i0);
    // The union of the tile's windows: first_key grows with the query.
    const uint lo = first_key(i0), hi = i0 + nq - 1;
    const uint row = pc.hd | 1u;  // odd
    const uint kv0 = (b * pc.T * pc.Hkv + kvh) * pc.hd;

    for (uint e = t; e < BQ * pc.hd; e += WG) {
        const uint r = e / pc.hd, c = e % pc.hd;
        const uint at = ((b * pc.T + i0 + r) * pc.H + h) * pc.hd + c;
        qs[r * row + c] = r < nq ? q[pc.off_q + at] : 0.0;
        dos[r * row + c] = r < nq ? d_out[pc.off_do + at] : 0.0;
    }
    const bool valid = qi < nq;
    const uint i = i0 + qi, first = first_key(i);

    // Sweep 1: this lane's m, l and D numerator sum exp(s - m) dP over its keys, rescaled as m
    // grows.
    float m = NEG_INF, l = 0.0, dn = 0.0;
    for (uint j0 = lo; j0 <= hi; j0 += BK) {
        const uint nk = min(BK, hi + 1 - j0);
        barrier();  // the previous tiles are no longer read (and the query tile is written)
        stage_keys(kv0, j0, nk, row);
        barrier();
        lane_scores(qi, lane, row);
        float tile_max = NEG_INF;
        for (uint n = 0; n < KEYS_PER_LANE; ++n) {
            const uint x = lane + n * LANES, j = j0 + x;
            if (!valid || x >= nk || j < first || j > i) lane_s[n] = NEG_INF;  // masked
            tile_max = max(tile_max, lane_s[n]);
        }
        if (tile_max != NEG_INF) {  // some of this lane's keys are in this tile
            const float m_new = max(m, tile_max);
            float sum_e = 0.0, sum_edp = 0.0;
            for (uint n = 0; n < KEYS_PER_LANE; ++n) {
                if (lane_s[n] == NEG_INF) continue;
                const float e = exp(lane_s[n] - m_new);
                sum_e += e;
                sum_edp += e * lane_dp[n];
            }
            // Nothing seen yet (m = -inf): l and dn are 0, the factor must not be NaN.
            const float alpha = m == NEG_INF ? 0.0 : exp(m - m_new);
            l = l * alpha + sum_e;
            dn = dn * alpha + sum_edp;
            m = m_new;
        }
    }
    // Merge the lanes' statistics, lane 0 first (a lane may have seen no key: m = -inf).
    lane_stats[t * 3] = m;
    lane_stats[t * 3 + 1] = l;
    lane_stats[t * 3 + 2] = dn;
    barrier();
    const uint q_lanes = qi * LANES * 3;
    float m_all = NEG_INF;
    for (uint r = 0; r < LANES; ++r) m_all = max(m_all, lane_stats[q_lanes + r * 3]);
    float l_all = 0.0, dn_all = 0.0;
    for (uint r = 0; r < LANES; ++r) {
        const float m_r = lane_stats[q_lanes + r * 3];
        if (m_r == NEG_INF) continue;
        const float f = exp(m_r - m_all);
        l_all += lane_stats[q_lanes + r * 3 + 1] * f;
        dn_all += lane_stats[q_lanes + r * 3 + 2] * f;
    }
    // A valid query sees at least itself: l_all >= 1.
    const float inv_l = valid ? 1.0 / l_all : 0.0;
    const float D = dn_all * inv_l;
    if (valid && lane == 0) {
        const uint s_row = pc.off_stats + ((b * pc.H + h) * pc.T + i) * 3;
        stats[s_row] = m_all;
        stats[s_row + 1] = l_all;
        stats[s_row + 2] = D;
    }

    // Sweep 2: dS of the tile's pairs (0 where masked), then d_q_i += sum_j dS_ij k_j, keys in
    // order.
    float acc[PER_LANE];
    for (uint r = 0; r < PER_LANE; ++r) acc[r] = 0.0;
    for (uint j0 = lo; j0 <= hi; j0 += BK) {
        const uint nk = min(BK, hi + 1 - j0);
        barrier();  // the previous tiles and dS are no longer read
        stage_keys(kv0, j0, nk, row);
        barrier();
        lane_scores(qi, lane, row);
        for (uint n = 0; n < KEYS_PER_LANE; ++n) {
            const uint x = lane + n * LANES, j = j0 + x;
            float d = 0.0;
            if (valid && x < nk && j >= first && j <= i) {
                const float p = exp(lane_s[n] - m_all) * inv_l;
                d = p * (lane_dp[n] - D) * pc.scale;
            }
            ds[qi * SROW + x] = d;
        }
        barrier();
        if (valid) {
            // Keys outside, columns inside: each dS read serves all of the lane's columns.
            for (uint x = 0; x < nk; ++x) {
                const float d = ds[qi * SROW + x];
                for (uint r = 0; r < PER_LANE; ++r) {
                    const uint c = lane + r * LANES;
                    if (c >= pc.hd) break;
                    acc[r] += d * ks[x * row + c];
                }
            }
        }
    }
    if (!valid) return;
    const uint q_row = pc.off_dq + ((b * pc.T + i) * pc.H + h) * pc.hd;
    for (uint r = 0; r < PER_LANE; ++r) {
        const uint c = lane + r * LANES;
        if (c < pc.hd) d_q[q_row + c] += acc[r];
    }
}

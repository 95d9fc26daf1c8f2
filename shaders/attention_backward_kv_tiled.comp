// Backward of causal sliding-window GQA attention, pass 2 of 2, tiled: the key side of
// attention_backward_kv.comp (same outputs) for head_dim <= MAX_HEAD_DIM. One workgroup per
// (tile of BK consecutive keys j0.., kv head, sequence b) stages the tile's key and value rows
// in shared memory, then walks every (query i, head h) pair that sees one of its keys: i from
// j0 to the last key's last query (j + window - 1, or T - 1), each of the group's query heads,
// numbered i-major (n = (i - j0) G + h - kvh G: the group's rows of one query are adjacent in
// q and d_out). Tiles of BQ pairs are staged in shared memory (q row, d_out row and pass 1's
// statistics m_i, l_i, D_i from stats [B, H, T, 3]); for each pair and key it recomputes
//   s_ij = scale q_i . k_j,  dP_ij = dO_i . v_j,  P_ij = exp(s_ij - m_i) / l_i,
//   dS_ij = P_ij (dP_ij - D_i) scale  (0 where the causal or sliding-window mask hides j)
// and sums d_k_j += sum dS_ij q_i, d_v_j += sum P_ij dO_i over the pairs in order. No T x T
// matrix exists anywhere.
//
// LANES = WG / BK invocations share a key. Lane `lane` scores pairs lane, lane + LANES, ... of
// every pair tile and owns d_k and d_v columns lane, lane + LANES, ... of its key: each output
// has one writer and every sum a fixed order (no atomics), so results are bitwise reproducible.
// Shared rows are padded as in attention_backward_tiled.comp.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;  // a multiple of BK
layout(constant_id = 1) const uint BQ = 16;  // (query, head) pairs per tile, a multiple of WG / BK
layout(constant_id = 2) const uint BK = 16;  // keys per tile
layout(constant_id = 3) const uint MAX_HEAD_DIM = 64;  // sizes the tiles; pc.hd is at most this
const uint LANES = WG / BK;
const uint PAIRS_PER_LANE = BQ / LANES;
const uint PER_LANE = (MAX_HEAD_DIM + LANES - 1) / LANES;
const uint ROW_MAX = MAX_HEAD_DIM + 1;  // the longest padded row
const uint PROW = BQ + LANES;           // a padded row of P or dS

layout(std430, binding = 0) readonly buffer Q { float q[]; };
layout(std430, binding = 1) readonly buffer K { float k[]; };
layout(std430, binding = 2) readonly buffer V { float v[]; };
layout(std430, binding = 3) readonly buffer DO { float d_out[]; };
layout(std430, binding = 4) readonly buffer Stats { float stats[]; };
layout(std430, binding = 5) buffer DK { float d_k[]; };
layout(std430, binding = 6) buffer DV { float d_v[]; };

layout(push_constant) uniform Push {
    uint off_q, off_k, off_v, off_do, off_stats, off_dk, off_dv;
    uint T, H, Hkv, hd;
    uint window;  // 0: unlimited
    float scale;
} pc;

// The host's shared-memory need (attention.cpp, backward_tiled_shared_bytes) counts these.
shared float ks[BK * ROW_MAX];     // the key tile
shared float vs[BK * ROW_MAX];     // its value rows
shared float qs[BQ * ROW_MAX];     // the pair tile's q rows
shared float dos[BQ * ROW_MAX];    // its d_out rows
shared float prob[BK * PROW];      // P per (key, pair)
shared float dscore[BK * PROW];    // dS per (key, pair)
shared float pair_stats[BQ * 3];   // m, 1 / l, D per pair

// s = scale q . k and dP = dO . v of tile key kx and this lane's pairs of the tile (y = lane,
// lane + LANES, ...), into lane_s and lane_dp: each key and value element read serves every
// pair.
float lane_s[PAIRS_PER_LANE], lane_dp[PAIRS_PER_LANE];
void lane_scores(uint kx, uint lane, uint row) {
    for (uint r = 0; r < PAIRS_PER_LANE; ++r) lane_s[r] = lane_dp[r] = 0.0;
    for (uint c = 0; c < pc.hd; ++c) {
        const float kc = ks[kx * row + c], vc = vs[kx * row + c];
        for (uint r = 0; r < PAIRS_PER_LANE; ++r) {
            const uint y = lane + r * LANES;
            lane_s[r] += qs[y * row + c] * kc;
            lane_dp[r] += dos[y * row + c] * vc;
        }
    }
    for (uint r = 0; r < PAIRS_PER_LANE; ++r) lane_s[r] *= pc.scale;
}

void main() {
    const uint j0 = gl_WorkGroupID.x * BK, kvh = gl_WorkGroupID.y, b = gl_WorkGroupID.z;
    const uint t = gl_LocalInvocationID.x, kx = t / LANES, lane = t % LANES;
    const uint G = pc.H / pc.Hkv;
    const uint nk = min(BK, pc.T - j0);
    // The last query that sees the tile's last key (window > T - key: none past the end).
    const uint last_key = j0 + nk - 1;
    const uint last =
        pc.window > 0 && pc.window < pc.T - last_key ? last_key + pc.window - 1 : pc.T - 1;
    const uint n_pairs = (last - j0 + 1) * G;
    const uint row = pc.hd | 1u;  // odd

    for (uint e = t; e < BK * pc.hd; e += WG) {
        const uint x = e / pc.hd, c = e % pc.hd;
        const uint at = ((b * pc.T + j0 + x) * pc.Hkv + kvh) * pc.hd + c;
        ks[x * row + c] = x < nk ? k[pc.off_k + at] : 0.0;
        vs[x * row + c] = x < nk ? v[pc.off_v + at] : 0.0;
    }
    const bool valid = kx < nk;
    const uint j = j0 + kx;
    // Element offset of pair 0's q / d_out row (query j0, the group's first head); the pairs'
    // rows follow each other.
    const uint pair0 = ((b * pc.T + j0) * pc.H + kvh * G) * pc.hd;

    float acc_k[PER_LANE], acc_v[PER_LANE];
    for (uint r = 0; r < PER_LANE; ++r) acc_k[r] = acc_v[r] = 0.0;
    for (uint n0 = 0; n0 < n_pairs; n0 += BQ) {
        const uint np = min(BQ, n_pairs - n0);
        barrier();  // the previous pair tile, P and dS are no longer read (and keys are staged)
        for (uint e = t; e < BQ * pc.hd; e += WG) {
            const uint y = e / pc.hd, c = e % pc.hd;
            const uint n = n0 + y;
            // Pair n's row: query j0 + n / G, head kvh G + n % G.
            const uint at = pair0 + ((n / G) * pc.H + n % G) * pc.hd + c;
            qs[y * row + c] = y < np ? q[pc.off_q + at] : 0.0;
            dos[y * row + c] = y < np ? d_out[pc.off_do + at] : 0.0;
        }
        for (uint y = t; y < np; y += WG) {
            const uint n = n0 + y, i = j0 + n / G, h = kvh * G + n % G;
            const uint s_row = pc.off_stats + ((b * pc.H + h) * pc.T + i) * 3;
            pair_stats[y * 3] = stats[s_row];
            pair_stats[y * 3 + 1] = 1.0 / stats[s_row + 1];
            pair_stats[y * 3 + 2] = stats[s_row + 2];
        }
        barrier();
        lane_scores(kx, lane, row);
        for (uint r = 0; r < PAIRS_PER_LANE; ++r) {
            const uint y = lane + r * LANES, i = j0 + (n0 + y) / G;
            float p = 0.0, d = 0.0;
            if (valid && y < np && i >= j && (pc.window == 0 || i - j < pc.window)) {
                p = exp(lane_s[r] - pair_stats[y * 3]) * pair_stats[y * 3 + 1];
                d = p * (lane_dp[r] - pair_stats[y * 3 + 2]) * pc.scale;
            }
            prob[kx * PROW + y] = p;
            dscore[kx * PROW + y] = d;
        }
        barrier();
        if (valid) {
            // Pairs outside, columns inside: each P and dS read serves all of the lane's columns.
            for (uint y = 0; y < np; ++y) {
                const float p = prob[kx * PROW + y], d = dscore[kx * PROW + y];
                for (uint r = 0; r < PER_LANE; ++r) {
                    const uint c = lane + r * LANES;
                    if (c >= pc.hd) break;
                    acc_k[r] += d * qs[y * row + c];
                    acc_v[r] += p * dos[y * row + c];
                }
            }
        }
    }
    if (!valid) return;
    const uint kv_row = ((b * pc.T + j) * pc.Hkv + kvh) * pc.hd;
    for (uint r = 0; r < PER_LANE; ++r) {
        const uint c = lane + r * LANES;
        if (c >= pc.hd) break;
        d_k[pc.off_dk + kv_row + c] += acc_k[r];
        d_v[pc.off_dv + kv_row + c] += acc_v[r];
    }
}

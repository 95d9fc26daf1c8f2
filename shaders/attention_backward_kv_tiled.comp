// Backward of causal sliding-window GQA attention, pass 2 of 2, tiled: the key side of
// attention_backward_kv.comp (same outputs) for head_dim <= MAX_HEAD_DIM. One workgroup per
// (tile of BK consecutive keys j0.., kv head, sequence b) walks every (query i, head h) pair
// that sees one of its keys: i from
// j0 to the last key's last query (j + window - 1, or T - 1), each of the group's query heads,
// numbered i-major (n = (i - j0) G + h - kvh G: the group's rows of one query are adjacent in
// q and d_out), BQ pairs a tile (with pass 1's statistics m_i, l_i, D_i from stats [B, H, T,
// 3]); for each pair and key it recomputes
//   s_ij = scale q_i . k_j,  dP_ij = dO_i . v_j,  P_ij = exp(s_ij - m_i) / l_i,
//   dS_ij = P_ij (dP_ij - D_i) scale  (0 where the causal or sliding-window mask hides j)
// and sums d_k_j += sum dS_ij q_i, d_v_j += sum P_ij dO_i over the pairs in order. No T x T
// matrix exists anywhere.
//
// Every product is register-blocked (as attention_backward_tiled.comp's), WG = (BK/4) * (BQ/4):
// invocation (ty, tx) computes s and dP of keys 4ty..4ty+3 and pairs 4tx..4tx+3 from k, v, q
// and dO staged 16 channels at a time, transposed; its P and dS go to shared memory by pair;
// then, with the pairs' q and dO rows staged 8 at a time, it adds dS q to d_k and P dO to d_v
// of its 4 keys at channels 4tx.. (runs of 4, then BQ further on). Each output has one writer
// and every sum a fixed order (no atomics), so results are bitwise reproducible. MAX_HEAD_DIM
// is a multiple of BQ (the host's choice, attention.cpp).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;            // (BK / 4) * (BQ / 4)
layout(constant_id = 1) const uint BQ = 32;            // (query, head) pairs per tile
layout(constant_id = 2) const uint BK = 32;            // keys per tile, a multiple of 4
layout(constant_id = 3) const uint MAX_HEAD_DIM = 64;  // sizes the tiles; pc.hd is at most this

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

const uint CH = 16;    // channels of k, v, q and dO staged at a time
const uint ROWS = 8;   // pair rows staged at a time for d_k and d_v
const uint QP = BQ + 4, KP = BK + 4, RP = MAX_HEAD_DIM + 4;  // padded row pitches
const uint TD = 4 * MAX_HEAD_DIM / BQ;  // d_k and d_v channels per invocation, in runs of 4
// The host's shared-memory need (attention.cpp, blocked_backward_shared_bytes) counts these.
shared vec4 k_t[CH * KP / 4], v_t[CH * KP / 4];    // [c][x]: channel c of key x
shared vec4 q_t[CH * QP / 4], do_t[CH * QP / 4];   // [c][y]: channel c of pair y
shared vec4 q_rows[ROWS * RP / 4], do_rows[ROWS * RP / 4];  // [y][c]: the pairs' rows
shared vec4 p_t[BQ * KP / 4], ds_t[BQ * KP / 4];   // [y][x]: P and dS of pair y and key x
shared vec4 m_p[BQ / 4], il_p[BQ / 4], d_p[BQ / 4];  // per 4 pairs: m, 1 / l, D

void main() {
    const uint j0 = gl_WorkGroupID.x * BK, kvh = gl_WorkGroupID.y, b = gl_WorkGroupID.z;
    const uint t = gl_LocalInvocationID.x, tx = t % (BQ / 4), ty = t / (BQ / 4);
    const uint G = pc.H / pc.Hkv;
    const uint nk = min(BK, pc.T - j0);
    // The last query that sees the tile's last key (window > T - key: none past the end).
    const uint last_key = j0 + nk - 1;
    const uint last =
        pc.window > 0 && pc.window < pc.T - last_key ? last_key + pc.window - 1 : pc.T - 1;
    const uint n_pairs = (last - j0 + 1) * G;
    // Element offset of pair 0's q / d_out row (query j0, the group's first head); pair n's row:
    // query j0 + n / G, head kvh G + n % G.
    const uint pair0 = ((b * pc.T + j0) * pc.H + kvh * G) * pc.hd;

    float acc_k[4 * TD], acc_v[4 * TD];
    for (uint e = 0; e < 4 * TD; ++e) acc_k[e] = acc_v[e] = 0.0;
    for (uint n0 = 0; n0 < n_pairs; n0 += BQ) {
        const uint np = min(BQ, n_pairs - n0);
        // s (scaled) and dP of keys 4ty.. and pairs 4tx.., element 4 key + pair.
        float s[16], dp[16];
        for (uint e = 0; e < 16; ++e) s[e] = dp[e] = 0.0;
        for (uint c0 = 0; c0 < MAX_HEAD_DIM; c0 += CH) {
            barrier();  // the previous chunk, rows, P and dS are no longer read
            if (c0 == 0 && t < BQ / 4) {
                vec4 m = vec4(0.0), il = vec4(0.0), d = vec4(0.0);
                for (uint e = 0; e < 4; ++e) {
                    const uint y = 4 * t + e, n = n0 + y;
                    if (y >= np) break;
                    const uint i = j0 + n / G, h = kvh * G + n % G;
                    const uint s_row = pc.off_stats + ((b * pc.H + h) * pc.T + i) * 3;
                    m[e] = stats[s_row];
                    il[e] = 1.0 / stats[s_row + 1];
                    d[e] = stats[s_row + 2];
                }
                m_p[t] = m;
                il_p[t] = il;
                d_p[t] = d;
            }
            // A unit: 4 keys (pairs) at one channel; consecutive invocations, consecutive
            // channels.
            for (uint u = t; u < CH * BK / 4; u += WG) {
                const uint c = u % CH, r = u / CH, gc = c0 + c;
                vec4 kv = vec4(0.0), vv = vec4(0.0);
                for (uint e = 0; e < 4; ++e) {
                    const uint x = 4 * r + e;
                    if (x < nk && gc < pc.hd) {
                        const uint at = ((b * pc.T + j0 + x) * pc.Hkv + kvh) * pc.hd + gc;
                        kv[e] = k[pc.off_k + at];
                        vv[e] = v[pc.off_v + at];
                    }
                }
                k_t[c * (KP / 4) + r] = kv;
                v_t[c * (KP / 4) + r] = vv;
            }
            for (uint u = t; u < CH * BQ / 4; u += WG) {
                const uint c = u % CH, r = u / CH, gc = c0 + c;
                vec4 qv = vec4(0.0), dv = vec4(0.0);
                for (uint e = 0; e < 4; ++e) {
                    const uint y = 4 * r + e, n = n0 + y;
                    if (y < np && gc < pc.hd) {
                        const uint at = pair0 + ((n / G) * pc.H + n % G) * pc.hd + gc;
                        qv[e] = q[pc.off_q + at];
                        dv[e] = d_out[pc.off_do + at];
                    }
                }
                q_t[c * (QP / 4) + r] = qv;
                do_t[c * (QP / 4) + r] = dv;
            }
            barrier();
            for (uint c = 0; c < CH; ++c) {
                const vec4 kb = k_t[c * (KP / 4) + ty], vb = v_t[c * (KP / 4) + ty];
                const vec4 qa = q_t[c * (QP / 4) + tx], da = do_t[c * (QP / 4) + tx];
                for (uint x = 0; x < 4; ++x)
                    for (uint y = 0; y < 4; ++y) {
                        s[x * 4 + y] += kb[x] * qa[y];
                        dp[x * 4 + y] += vb[x] * da[y];
                    }
            }
        }
        // P and dS (0 where the mask hides the key from the pair's query), stored by pair.
        const vec4 m = m_p[tx], il = il_p[tx], dd = d_p[tx];
        for (uint y = 0; y < 4; ++y) {
            const uint py = 4 * tx + y, i = j0 + (n0 + py) / G;
            vec4 pv, dv;
            for (uint x = 0; x < 4; ++x) {
                const uint kx = 4 * ty + x, j = j0 + kx;
                const bool seen =
                    kx < nk && py < np && i >= j && (pc.window == 0 || i - j < pc.window);
                const float p = exp(s[x * 4 + y] * pc.scale - m[y]) * il[y];
                pv[x] = seen ? p : 0.0;
                dv[x] = seen ? p * (dp[x * 4 + y] - dd[y]) * pc.scale : 0.0;
            }
            p_t[py * (KP / 4) + ty] = pv;
            ds_t[py * (KP / 4) + ty] = dv;
        }
        for (uint y0 = 0; y0 < BQ; y0 += ROWS) {
            barrier();  // P and dS are written, the previous rows are no longer read
            for (uint u = t; u < ROWS * MAX_HEAD_DIM / 4; u += WG) {
                const uint r = u % (MAX_HEAD_DIM / 4), y = u / (MAX_HEAD_DIM / 4);
                const uint n = n0 + y0 + y;
                vec4 qv = vec4(0.0), dv = vec4(0.0);
                if (y0 + y < np) {
                    const uint at = pair0 + ((n / G) * pc.H + n % G) * pc.hd;
                    for (uint e = 0; e < 4; ++e)
                        if (4 * r + e < pc.hd) {
                            qv[e] = q[pc.off_q + at + 4 * r + e];
                            dv[e] = d_out[pc.off_do + at + 4 * r + e];
                        }
                }
                q_rows[y * (RP / 4) + r] = qv;
                do_rows[y * (RP / 4) + r] = dv;
            }
            barrier();
            for (uint y = 0; y < ROWS; ++y) {
                const vec4 pv = p_t[(y0 + y) * (KP / 4) + ty], dv = ds_t[(y0 + y) * (KP / 4) + ty];
                for (uint rr = 0; rr < TD / 4; ++rr) {
                    const vec4 qr = q_rows[y * (RP / 4) + rr * (BQ / 4) + tx];
                    const vec4 dr = do_rows[y * (RP / 4) + rr * (BQ / 4) + tx];
                    for (uint x = 0; x < 4; ++x)
                        for (uint e = 0; e < 4; ++e) {
                            acc_k[x * TD + rr * 4 + e] += dv[x] * qr[e];
                            acc_v[x * TD + rr * 4 + e] += pv[x] * dr[e];
                        }
                }
            }
        }
    }
    for (uint x = 0; x < 4; ++x) {
        const uint kx = 4 * ty + x;
        if (kx >= nk) break;
        const uint kv_row = ((b * pc.T + j0 + kx) * pc.Hkv + kvh) * pc.hd;
        for (uint rr = 0; rr < TD / 4; ++rr)
            for (uint e = 0; e < 4; ++e) {
                const uint c = rr * BQ + 4 * tx + e;
                if (c < pc.hd) {
                    d_k[pc.off_dk + kv_row + c] += acc_k[x * TD + rr * 4 + e];
                    d_v[pc.off_dv + kv_row + c] += acc_v[x * TD + rr * 4 + e];
                }
            }
    }
}


// Backward of causal sliding-window GQA attention, pass 1 of 2, tiled: the query side of
// attention_backward.comp (same outputs) for head_dim <= MAX_HEAD_DIM. One workgroup per (tile
// of BQ consecutive queries, head h, sequence b) walks the keys the tile needs (the first
// query's first key to the last query) in tiles of BK keys, twice:
//   1. softmax statistics: m_i = max_j s_ij, l_i = sum_j exp(s_ij - m_i) and
//      D_i = sum_j P_ij dP_ij, with s_ij = scale q_i . k_j and dP_ij = dO_i . v_j;
//   2. dS_ij = P_ij (dP_ij - D_i) scale with P_ij = exp(s_ij - m_i) / l_i, and
//      d_q_i += sum_j dS_ij k_j.
// m_i, l_i, D_i go to stats [B, H, T, 3] for pass 2 (attention_backward_kv_tiled.comp, or
// attention_backward_kv.comp: the layout is the same). The causal and sliding-window mask is
// applied per (query, key); no T x T matrix exists anywhere.
//
// Every product is register-blocked (as attention_tiled.comp's blocked form), WG = (BQ/4) *
// (BK/4): invocation (ty, tx) computes s and dP of queries 4ty..4ty+3 and keys 4tx..4tx+3 from
// q, dO, k and v staged 16 channels at a time, transposed (a channel's queries, or keys, side by
// side: two vec4 reads per channel and product, for 16 products each). In sweep 1 the tile's s
// and dP go to shared memory by key, where BK/4 invocations per 4 queries fold them into the
// statistics. In sweep 2 the invocation forms its dS in registers and, with the key rows staged
// 8 at a time, adds dS k to d_q of its 4 queries at channels 4tx.. (runs of 4, then BK further
// on). Every sum runs in a fixed order and every output has one writer (no atomics), so results
// are bitwise reproducible. MAX_HEAD_DIM is a multiple of BK (the host's choice, attention.cpp).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;            // (BQ / 4) * (BK / 4)
layout(constant_id = 1) const uint BQ = 32;            // queries per tile, a multiple of 4
layout(constant_id = 2) const uint BK = 32;            // keys per tile, a multiple of 4
layout(constant_id = 3) const uint MAX_HEAD_DIM = 64;  // sizes the tiles; pc.hd is at most this

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

// The oldest key query i sees.
uint first_key(uint i) { return pc.window > 0 && i + 1 > pc.window ? i + 1 - pc.window : 0u; }

const uint CH = 16;    // channels of q, dO, k and v staged at a time
const uint ROWS = 8;   // key rows staged at a time for d_q
const uint QP = BQ + 4, KP = BK + 4, RP = MAX_HEAD_DIM + 4;  // padded row pitches
const uint TD = 4 * MAX_HEAD_DIM / BK;  // d_q channels per invocation, in runs of 4
const uint PARTS = BK / 4;              // invocations per 4 queries for their statistics
// The host's shared-memory need (attention.cpp, blocked_backward_shared_bytes) counts these.
shared vec4 q_t[CH * QP / 4], do_t[CH * QP / 4];  // [c][i]: channel c of query i
shared vec4 k_t[CH * KP / 4], v_t[CH * KP / 4];   // [c][x]: channel c of key x
shared vec4 k_rows[ROWS * RP / 4];                // [x][c]: key rows, for d_q
shared vec4 s_t[BK * QP / 4], dp_t[BK * QP / 4];  // [x][i]: s (sweep 2: dS) and dP
shared vec4 part_m[PARTS * BQ / 4], part_l[PARTS * BQ / 4], part_dn[PARTS * BQ / 4];
shared vec4 m_q[BQ / 4], l_q[BQ / 4], dn_q[BQ / 4];  // per 4 queries; after sweep 1 D in dn_q

// s (scaled) and dP of queries 4ty.. and keys 4tx.. of the tile at key j0 (nk keys; the
// others 0), element 4 query + key.
void block_scores(uint b, uint h, uint kvh, uint i0, uint nq, uint j0, uint nk, uint t, uint tx,
                  uint ty, out float s[16], out float dp[16]) {
    for (uint e = 0; e < 16; ++e) s[e] = dp[e] = 0.0;
    const uint kv_stride = pc.Hkv * pc.hd;
    for (uint c0 = 0; c0 < MAX_HEAD_DIM; c0 += CH) {
        barrier();  // the previous chunk is no longer read
        // A unit: 4 queries (keys) at one channel; consecutive invocations, consecutive
        // channels.
        for (uint u = t; u < CH * BQ / 4; u += WG) {
            const uint c = u % CH, r = u / CH, gc = c0 + c;
            vec4 qv = vec4(0.0), dv = vec4(0.0);
            for (uint e = 0; e < 4; ++e) {
                const uint i = 4 * r + e;
                if (i < nq && gc < pc.hd) {
                    const uint at = ((b * pc.T + i0 + i) * pc.H + h) * pc.hd + gc;
                    qv[e] = q[pc.off_q + at];
                    dv[e] = d_out[pc.off_do + at];
                }
            }
            q_t[c * (QP / 4) + r] = qv;
            do_t[c * (QP / 4) + r] = dv;
        }
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
        barrier();
        for (uint c = 0; c < CH; ++c) {
            const vec4 qa = q_t[c * (QP / 4) + ty], da = do_t[c * (QP / 4) + ty];
            const vec4 kb = k_t[c * (KP / 4) + tx], vb = v_t[c * (KP / 4) + tx];
            for (uint i = 0; i < 4; ++i)
                for (uint x = 0; x < 4; ++x) {
                    s[i * 4 + x] += qa[i] * kb[x];
                    dp[i * 4 + x] += da[i] * vb[x];
                }
        }
    }
    for (uint e = 0; e < 16; ++e) s[e] *= pc.scale;
}

// Whether query i0 + qi (of nq) sees key j0 + x (of nk).
bool pair_seen(uint i0, uint qi, uint nq, uint j0, uint x, uint nk) {
    const uint i = i0 + qi, j = j0 + x;
    return qi < nq && x < nk && j >= first_key(i) && j <= i;
}

void main() {
    const uint i0 = gl_WorkGroupID.x * BQ, h = gl_WorkGroupID.y, b = gl_WorkGroupID.z;
    const uint t = gl_LocalInvocationID.x, tx = t % (BK / 4), ty = t / (BK / 4);
    const uint kvh = h / (pc.H / pc.Hkv);
    const uint nq = min(BQ, pc.T - i0);
    // The union of the tile's windows: first_key grows with the query.
    const uint lo = first_key(i0), hi = i0 + nq - 1;
    // For the statistics: queries 4 quad .. 4 quad + 3, keys part, part + PARTS, ... of a tile.
    const uint quad = t % (BQ / 4), part = t / (BQ / 4);
    if (t < BQ / 4) {
        m_q[t] = vec4(NEG_INF);
        l_q[t] = dn_q[t] = vec4(0.0);
    }
    float s[16], dp[16];

    // Sweep 1: m, l and the D numerator sum exp(s - m) dP per query, rescaled as m grows.
    for (uint j0 = lo; j0 <= hi; j0 += BK) {
        const uint nk = min(BK, hi + 1 - j0);
        block_scores(b, h, kvh, i0, nq, j0, nk, t, tx, ty, s, dp);
        for (uint x = 0; x < 4; ++x) {
            vec4 sc, d;
            for (uint i = 0; i < 4; ++i) {
                const bool seen = pair_seen(i0, 4 * ty + i, nq, j0, 4 * tx + x, nk);
                sc[i] = seen ? s[i * 4 + x] : NEG_INF;
                d[i] = dp[i * 4 + x];
            }
            s_t[(4 * tx + x) * (QP / 4) + ty] = sc;
            dp_t[(4 * tx + x) * (QP / 4) + ty] = d;
        }
        barrier();
        vec4 mx = vec4(NEG_INF);
        for (uint x = part; x < BK; x += PARTS) mx = max(mx, s_t[x * (QP / 4) + quad]);
        part_m[part * (BQ / 4) + quad] = mx;
        barrier();
        vec4 m_new = m_q[quad];
        for (uint r = 0; r < PARTS; ++r) m_new = max(m_new, part_m[r * (BQ / 4) + quad]);
        vec4 sum_e = vec4(0.0), sum_edp = vec4(0.0);
        for (uint x = part; x < BK; x += PARTS) {
            const vec4 sc = s_t[x * (QP / 4) + quad], d = dp_t[x * (QP / 4) + quad];
            for (uint i = 0; i < 4; ++i) {
                const float e = sc[i] == NEG_INF ? 0.0 : exp(sc[i] - m_new[i]);
                sum_e[i] += e;
                sum_edp[i] += e * d[i];
            }
        }
        part_l[part * (BQ / 4) + quad] = sum_e;
        part_dn[part * (BQ / 4) + quad] = sum_edp;
        barrier();
        if (part == 0) {
            // Nothing seen yet (m = -inf): l and dn are 0, the factor must not be NaN.
            const vec4 m_old = m_q[quad];
            vec4 alpha, l = vec4(0.0), dn = vec4(0.0);
            for (uint i = 0; i < 4; ++i)
                alpha[i] = m_old[i] == NEG_INF ? 0.0 : exp(m_old[i] - m_new[i]);
            for (uint r = 0; r < PARTS; ++r) {
                l += part_l[r * (BQ / 4) + quad];
                dn += part_dn[r * (BQ / 4) + quad];
            }
            l_q[quad] = l_q[quad] * alpha + l;
            dn_q[quad] = dn_q[quad] * alpha + dn;
            m_q[quad] = m_new;
        }
    }
    barrier();
    if (part == 0) {
        // A valid query sees at least itself: l >= 1. Its statistics for pass 2; dn_q becomes D.
        const vec4 m = m_q[quad], l = l_q[quad], D = dn_q[quad] / l;
        for (uint i = 0; i < 4; ++i) {
            const uint qi = 4 * quad + i;
            if (qi >= nq) break;
            const uint s_row = pc.off_stats + ((b * pc.H + h) * pc.T + i0 + qi) * 3;
            stats[s_row] = m[i];
            stats[s_row + 1] = l[i];
            stats[s_row + 2] = D[i];
        }
        dn_q[quad] = D;
    }
    barrier();
    const vec4 m_all = m_q[ty], inv_l = 1.0 / l_q[ty], D = dn_q[ty];

    // Sweep 2: dS of the tile's pairs (0 where masked), then d_q_i += sum_j dS_ij k_j, keys in
    // order.
    float acc[4 * TD];
    for (uint e = 0; e < 4 * TD; ++e) acc[e] = 0.0;
    for (uint j0 = lo; j0 <= hi; j0 += BK) {
        const uint nk = min(BK, hi + 1 - j0);
        block_scores(b, h, kvh, i0, nq, j0, nk, t, tx, ty, s, dp);
        for (uint x = 0; x < 4; ++x) {
            vec4 d;
            for (uint i = 0; i < 4; ++i) {
                const bool seen = pair_seen(i0, 4 * ty + i, nq, j0, 4 * tx + x, nk);
                const float p = exp(s[i * 4 + x] - m_all[i]) * inv_l[i];
                d[i] = seen ? p * (dp[i * 4 + x] - D[i]) * pc.scale : 0.0;
            }
            s_t[(4 * tx + x) * (QP / 4) + ty] = d;
        }
        for (uint x0 = 0; x0 < BK; x0 += ROWS) {
            barrier();  // dS is written, the previous rows are no longer read
            for (uint u = t; u < ROWS * MAX_HEAD_DIM / 4; u += WG) {
                const uint r = u % (MAX_HEAD_DIM / 4), x = u / (MAX_HEAD_DIM / 4);
                vec4 kv = vec4(0.0);
                if (x0 + x < nk) {
                    const uint at = ((b * pc.T + j0 + x0 + x) * pc.Hkv + kvh) * pc.hd;
                    for (uint e = 0; e < 4; ++e)
                        if (4 * r + e < pc.hd) kv[e] = k[pc.off_k + at + 4 * r + e];
                }
                k_rows[x * (RP / 4) + r] = kv;
            }
            barrier();
            for (uint x = 0; x < ROWS; ++x) {
                const vec4 d = s_t[(x0 + x) * (QP / 4) + ty];
                for (uint rr = 0; rr < TD / 4; ++rr) {
                    const vec4 kr = k_rows[x * (RP / 4) + rr * (BK / 4) + tx];
                    for (uint i = 0; i < 4; ++i)
                        for (uint e = 0; e < 4; ++e) acc[i * TD + rr * 4 + e] += d[i] * kr[e];
                }
            }
        }
    }
    for (uint i = 0; i < 4; ++i) {
        const uint qi = 4 * ty + i;
        if (qi >= nq) break;
        const uint q_row = pc.off_dq + ((b * pc.T + i0 + qi) * pc.H + h) * pc.hd;
        for (uint rr = 0; rr < TD / 4; ++rr)
            for (uint e = 0; e < 4; ++e) {
                const uint c = rr * BK + 4 * tx + e;
                if (c < pc.hd) d_q[q_row + c] += acc[i * TD + rr * 4 + e];
            }
    }
}


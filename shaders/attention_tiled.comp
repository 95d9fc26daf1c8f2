// Attention for many queries (prefill): one workgroup per (tile of BQ consecutive queries,
// head, sequence) walks the keys the tile needs, from the first query's first key to the last
// query's position, in tiles of BK keys staged in shared memory, with an online softmax per
// query. The sliding-window and causal mask is applied per (query, key); masked scores are -inf
// and weigh exactly 0. head_dim is at most MAX_HEAD_DIM (the host falls back to attention.comp
// above it). LANES = WG / BQ invocations share a query. Two forms, one source:
//
//   (default) the query tile in shared memory, the key tile then the value tile in one shared
//   array. A query's invocations each score every LANES-th key of the tile and own every
//   LANES-th output column; each re-reads the query's scores from shared memory for the max and
//   the sum.
//
//   TMX_ATTENTION_SUBGROUP (the module attention_tiled_sg, variants ".sg1"): a query's row in
//   registers, PER_LANE channels per invocation. A score is the LANES partial dot products
//   summed through a butterfly of subgroup shuffles; the invocation `lane` keeps the scores of
//   keys lane, lane + LANES, ..., whose max and sum go through the same butterfly, and hands
//   them to the query's other invocations (shuffles) for the weighted sum of values. The key
//   and value tiles lie side by side (SEPARATE_V, where the device's shared memory holds both:
//   one staging step and two barriers per tile fewer), or the value tile replaces the key
//   tile. No score or query leaves registers. The host runs it only where a query's LANES
//   invocations are consecutive in one subgroup: LANES a power of two dividing the subgroup
//   size, the workgroup whole subgroups (vulkan_tuning.cpp).
//
//   TMX_ATTENTION_BLOCKED (the module attention_tiled_rb, variants ".rb4"): both products as
//   register-blocked matrix products (matmul_tile.glsl's way), WG = (BQ/4) * (BK/4). Invocation
//   (ty, tx) computes the scores of queries 4ty..4ty+3 against keys 4tx..4tx+3, the query and
//   key tiles staged 16 channels at a time, transposed (a channel's queries, or keys, side by
//   side), so that each channel is two vec4 reads for 16 products. The scores go to shared
//   memory by key; BK/16 invocations per query take its max and sum; then the invocation owns
//   output channels of the same 4 queries (runs of 4, 4tx then BK further on, ...) and adds
//   the values, staged 16 keys at a time, weighted: again two vec4 reads (and more for heads
//   longer than BK) for 16 products. The shared-memory form reads two floats per product.
//
// All forms sum in an order fixed by the code, so results are the same bits run to run.
//
// Shared-memory rows of the default form are padded so that the invocations of a subgroup,
// which read one column of several rows at once, hit different banks (32 banks of 4 bytes on
// NVIDIA and AMD): query and key/value rows have an odd stride (pc.hd, or pc.hd + 1), score and
// weight rows a stride of BK + LANES, which puts the LANES invocations of the 32 / LANES queries
// on banks 0..31. Unpadded, head_dim 64 and BK 32 had 4 to 8 invocations on one bank. The
// subgroup form reads one key or value row at a time, across consecutive columns: no padding.
#version 450
#extension GL_GOOGLE_include_directive : require
#ifdef TMX_ATTENTION_SUBGROUP
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#endif
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;  // a multiple of BQ
layout(constant_id = 1) const uint BQ = 16;  // queries per tile
layout(constant_id = 2) const uint BK = 32;  // keys per tile
const uint MAX_HEAD_DIM = 128;
const uint LANES = WG / BQ;
const uint PER_LANE = (MAX_HEAD_DIM + LANES - 1) / LANES;
#include "attention_common.glsl"

#if defined(TMX_ATTENTION_BLOCKED)

// The head_dim the tiles are sized for: 32, 64 or 128, at least pc.hd and BK (the host's
// choice); the channels past pc.hd are staged as zeros.
layout(constant_id = 3) const uint HD = 64;
const uint CH = 16;            // channels of the query and key tiles staged at a time
const uint VKEYS = 16;            // keys of the value tile staged at a time
const uint QP = BQ + 4;        // the pitch of the query-major rows (a channel's, a key's)
const uint KP = BK + 4;        // of a channel's keys
const uint VP = HD + 4;        // of a key's values
const uint TD = 4 * HD / BK;   // output channels per invocation, in runs of 4
const uint PARTS = BK / 4;     // invocations per 4 queries for their max and sum
// The host's shared-memory need (vulkan_tuning.cpp, blocked_attention_shared_floats) counts
// these.
shared vec4 q_t[CH * QP / 4];     // q_t[c][i]: channel c of query i, scaled
shared vec4 k_t[CH * KP / 4];     // k_t[c][x]: channel c of key x
shared vec4 v_s[VKEYS * VP / 4];     // v_s[x][c]: value channel c of key x
shared vec4 p_t[BK * QP / 4];     // p_t[x][i]: score, then weight, of query i and key x
shared vec4 part_stat[PARTS * BQ / 4];
shared vec4 m_run[BQ / 4], l_run[BQ / 4], alpha_s[BQ / 4];  // per 4 queries

void main() {
    const uint i0 = gl_WorkGroupID.x * BQ, h = gl_WorkGroupID.y, b = gl_WorkGroupID.z;
    const uint t = gl_LocalInvocationID.x, tx = t % (BK / 4), ty = t / (BK / 4);
    const uint kvh = h / (pc.H / pc.Hkv);
    const uint p0 = chunk_start(b);
    const uint nq = min(BQ, pc.T - i0);
    // The union of the tile's windows: first_key grows with the position.
    const uint lo = first_key(p0, p0 + i0), hi = p0 + i0 + nq - 1;
    // For the statistics: queries 4 quad .. 4 quad + 3, keys part, part + PARTS, ... of a tile.
    const uint quad = t % (BQ / 4), part = t / (BQ / 4);
    if (t < BQ / 4) {
        m_run[t] = vec4(NEG_INF);
        l_run[t] = vec4(0.0);
    }
    float acc[4 * TD];
    for (uint e = 0; e < 4 * TD; ++e) acc[e] = 0.0;

    for (uint j0 = lo; j0 <= hi; j0 += BK) {
        const uint nk = min(BK, hi + 1 - j0);
        float s[16];
        for (uint e = 0; e < 16; ++e) s[e] = 0.0;
        for (uint c0 = 0; c0 < HD; c0 += CH) {
            barrier();  // the previous chunk (and tile) is no longer read
            // A unit: 4 queries (keys) at one channel; consecutive invocations, consecutive
            // channels.
            for (uint u = t; u < CH * BQ / 4; u += WG) {
                const uint c = u % CH, r = u / CH, gc = c0 + c;
                vec4 val = vec4(0.0);
                for (uint e = 0; e < 4; ++e) {
                    const uint i = 4 * r + e;
                    if (i < nq && gc < pc.hd)
                        val[e] = q[pc.off_q + ((b * pc.T + i0 + i) * pc.H + h) * pc.hd + gc] *
                                 pc.scale;
                }
                q_t[c * (QP / 4) + r] = val;
            }
            for (uint u = t; u < CH * BK / 4; u += WG) {
                const uint c = u % CH, r = u / CH, gc = c0 + c;
                vec4 val = vec4(0.0);
                for (uint e = 0; e < 4; ++e) {
                    const uint x = 4 * r + e;
                    if (x < nk && gc < pc.hd) {
                        bool cached;
                        val[e] = key_at(kv_row(b, kvh, p0, j0 + x, cached), cached, gc);
                    }
                }
                k_t[c * (KP / 4) + r] = val;
            }
            barrier();
            for (uint c = 0; c < CH; ++c) {
                const vec4 qa = q_t[c * (QP / 4) + ty], kb = k_t[c * (KP / 4) + tx];
                for (uint i = 0; i < 4; ++i)
                    for (uint x = 0; x < 4; ++x) s[i * 4 + x] += qa[i] * kb[x];
            }
        }
        // Masked scores are -inf; stored by key, a key's 4 queries as one vec4.
        for (uint x = 0; x < 4; ++x) {
            const uint kx = 4 * tx + x, j = j0 + kx;
            vec4 col;
            for (uint i = 0; i < 4; ++i) {
                const uint qi = 4 * ty + i, p = p0 + i0 + qi;
                const bool seen = qi < nq && kx < nk && j >= first_key(p0, p) && j <= p;
                col[i] = seen ? s[i * 4 + x] : NEG_INF;
            }
            p_t[kx * (QP / 4) + ty] = col;
        }
        barrier();
        // Each query's max over the tile, then the weights and their sum: PARTS invocations
        // per 4 queries (a vec4 of p_t), each over keys part, part + PARTS, ...
        vec4 mx = vec4(NEG_INF);
        for (uint x = part; x < BK; x += PARTS) mx = max(mx, p_t[x * (QP / 4) + quad]);
        part_stat[part * (BQ / 4) + quad] = mx;
        barrier();
        vec4 m_new = m_run[quad];
        for (uint r = 0; r < PARTS; ++r) m_new = max(m_new, part_stat[r * (BQ / 4) + quad]);
        barrier();  // every part has read the maxima
        vec4 sum = vec4(0.0);
        for (uint x = part; x < BK; x += PARTS) {
            const vec4 sc = p_t[x * (QP / 4) + quad];
            vec4 w;
            for (uint i = 0; i < 4; ++i) w[i] = sc[i] == NEG_INF ? 0.0 : exp(sc[i] - m_new[i]);
            p_t[x * (QP / 4) + quad] = w;
            sum += w;
        }
        part_stat[part * (BQ / 4) + quad] = sum;
        barrier();
        if (part == 0) {
            // Nothing seen yet (m_run = -inf): acc and l are 0, the factor must not be NaN.
            const vec4 m_old = m_run[quad];
            vec4 alpha;
            for (uint i = 0; i < 4; ++i)
                alpha[i] = m_old[i] == NEG_INF ? 0.0 : exp(m_old[i] - m_new[i]);
            vec4 l = vec4(0.0);
            for (uint r = 0; r < PARTS; ++r) l += part_stat[r * (BQ / 4) + quad];
            l_run[quad] = l_run[quad] * alpha + l;
            m_run[quad] = m_new;
            alpha_s[quad] = alpha;
        }
        // The weighted values, VKEYS keys at a time (the barrier at the top of the loop also
        // publishes alpha_s and the weights).
        for (uint x0 = 0; x0 < BK; x0 += VKEYS) {
            barrier();
            if (x0 == 0)
                for (uint i = 0; i < 4; ++i)
                    for (uint d = 0; d < TD; ++d) acc[i * TD + d] *= alpha_s[ty][i];
            for (uint u = t; u < VKEYS * HD / 4; u += WG) {
                const uint r = u % (HD / 4), x = u / (HD / 4);
                vec4 val = vec4(0.0);
                if (x0 + x < nk) {
                    bool cached;
                    const uint at = kv_row(b, kvh, p0, j0 + x0 + x, cached);
                    for (uint e = 0; e < 4; ++e)
                        if (4 * r + e < pc.hd) val[e] = value_at(at, cached, 4 * r + e);
                }
                v_s[x * (VP / 4) + r] = val;
            }
            barrier();
            for (uint x = 0; x < VKEYS; ++x) {
                const vec4 w = p_t[(x0 + x) * (QP / 4) + ty];
                for (uint rr = 0; rr < TD / 4; ++rr) {
                    const vec4 val = v_s[x * (VP / 4) + rr * (BK / 4) + tx];
                    for (uint i = 0; i < 4; ++i)
                        for (uint e = 0; e < 4; ++e) acc[i * TD + rr * 4 + e] += w[i] * val[e];
                }
            }
        }
    }
    barrier();  // l_run is final
    for (uint i = 0; i < 4; ++i) {
        const uint qi = 4 * ty + i;
        if (qi >= nq) break;
        const float l = l_run[ty][i];
        const uint o_row = pc.off_o + ((b * pc.T + i0 + qi) * pc.H + h) * pc.hd;
        for (uint rr = 0; rr < TD / 4; ++rr)
            for (uint e = 0; e < 4; ++e) {
                const uint c = rr * BK + 4 * tx + e;
                if (c < pc.hd) o[o_row + c] = acc[i * TD + rr * 4 + e] / l;
            }
    }
}

#elif defined(TMX_ATTENTION_SUBGROUP)

layout(constant_id = 3) const uint SEPARATE_V = 1;  // 0 or 1, as the host has room
const uint KEYS_PER_LANE = (BK + LANES - 1) / LANES;
// The key tile at 0, the value tile after it (SEPARATE_V) or in its place; pc.hd floats a row.
const uint V_AT = SEPARATE_V * BK * MAX_HEAD_DIM;
shared float kv[V_AT + BK * MAX_HEAD_DIM];

// The sum and the max over a query's LANES invocations: a butterfly, fixed order. Partners
// combine the same two values (a + b, b + a), so each of the LANES ends with the same bits.
float lanes_sum(float x) {
    for (uint m = 1; m < LANES; m <<= 1) x += subgroupShuffleXor(x, m);
    return x;
}
float lanes_max(float x) {
    for (uint m = 1; m < LANES; m <<= 1) x = max(x, subgroupShuffleXor(x, m));
    return x;
}

// Stages rows [j0, j0 + nk) of the keys and/or the values; rows past nk are zero.
void stage_rows(uint b, uint kvh, uint p0, uint j0, uint nk, bool keys, bool values) {
    for (uint e = gl_LocalInvocationID.x; e < BK * pc.hd; e += WG) {
        const uint x = e / pc.hd, c = e % pc.hd;
        bool cached = false;
        const uint at = x < nk ? kv_row(b, kvh, p0, j0 + x, cached) : 0u;
        if (keys) kv[e] = x < nk ? key_at(at, cached, c) : 0.0;
        if (values) kv[V_AT + e] = x < nk ? value_at(at, cached, c) : 0.0;
    }
}

void main() {
    const uint i0 = gl_WorkGroupID.x * BQ, h = gl_WorkGroupID.y, b = gl_WorkGroupID.z;
    // Query and lane by subgroup, so that a query's lanes are one subgroup's, consecutive.
    const uint t = gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID;
    const uint qi = t / LANES, lane = t % LANES;
    const uint first_lane = gl_SubgroupInvocationID - lane;  // the query's lane 0
    const uint kvh = h / (pc.H / pc.Hkv);
    const uint p0 = chunk_start(b);
    const uint nq = min(BQ, pc.T - i0);
    // The union of the tile's windows: first_key grows with the position.
    const uint lo = first_key(p0, p0 + i0), hi = p0 + i0 + nq - 1;
    const bool valid = qi < nq;
    const uint p = p0 + i0 + qi, first = first_key(p0, p);

    // This lane's channels lane, lane + LANES, ... of the query (scaled) and of the output.
    float qr[PER_LANE], acc[PER_LANE];
    const uint q_row = pc.off_q + ((b * pc.T + i0 + min(qi, nq - 1)) * pc.H + h) * pc.hd;
    for (uint r = 0; r < PER_LANE; ++r) {
        const uint c = lane + r * LANES;
        qr[r] = valid && c < pc.hd ? q[q_row + c] * pc.scale : 0.0;
        acc[r] = 0.0;
    }

    float m_run = NEG_INF, l_run = 0.0;
    for (uint j0 = lo; j0 <= hi; j0 += BK) {
        const uint nk = min(BK, hi + 1 - j0);
        barrier();  // the previous tiles are no longer read
        stage_rows(b, kvh, p0, j0, nk, true, SEPARATE_V != 0);
        barrier();

        // Scores: the partial dot products over this lane's channels, summed over the lanes.
        // Key x = u * LANES + l is lane l's mine[u].
        float mine[KEYS_PER_LANE];
        for (uint u = 0; u < KEYS_PER_LANE; ++u) {
            mine[u] = NEG_INF;
            for (uint l = 0; l < LANES; ++l) {
                const uint x = u * LANES + l, j = j0 + x;
                if (x >= BK) break;  // LANES > BK: the last lanes keep no key
                float part = 0.0;
                for (uint r = 0; r < PER_LANE; ++r) {
                    const uint c = lane + r * LANES;
                    if (c >= pc.hd) break;
                    part += qr[r] * kv[x * pc.hd + c];
                }
                const float s = lanes_sum(part);
                if (l == lane && valid && x < nk && j >= first && j <= p) mine[u] = s;
            }
        }

        float tile_max = NEG_INF;
        for (uint u = 0; u < KEYS_PER_LANE; ++u) tile_max = max(tile_max, mine[u]);
        const float m_new = max(m_run, lanes_max(tile_max));
        float sum = 0.0;
        for (uint u = 0; u < KEYS_PER_LANE; ++u) {
            mine[u] = mine[u] == NEG_INF ? 0.0 : exp(mine[u] - m_new);  // now a weight
            sum += mine[u];
        }
        // Nothing seen yet (m_run = -inf): acc and l are 0, the factor must not be NaN.
        const float alpha = m_run == NEG_INF ? 0.0 : exp(m_run - m_new);
        l_run = l_run * alpha + lanes_sum(sum);
        m_run = m_new;

        if (SEPARATE_V == 0) {
            barrier();  // the key tile is no longer read
            stage_rows(b, kvh, p0, j0, nk, false, true);
            barrier();
        }
        for (uint r = 0; r < PER_LANE; ++r) acc[r] *= alpha;
        for (uint u = 0; u < KEYS_PER_LANE; ++u)
            for (uint l = 0; l < LANES; ++l) {
                const uint x = u * LANES + l;
                if (x >= nk) break;
                const float w = subgroupShuffle(mine[u], first_lane + l);
                for (uint r = 0; r < PER_LANE; ++r) {
                    const uint c = lane + r * LANES;
                    if (c >= pc.hd) break;
                    acc[r] += w * kv[V_AT + x * pc.hd + c];
                }
            }
    }
    if (!valid) return;
    const uint o_row = pc.off_o + ((b * pc.T + i0 + qi) * pc.H + h) * pc.hd;
    for (uint r = 0; r < PER_LANE; ++r) {
        const uint c = lane + r * LANES;
        if (c < pc.hd) o[o_row + c] = acc[r] / l_run;
    }
}

#else

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

#endif

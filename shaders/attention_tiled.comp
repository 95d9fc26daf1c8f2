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
// Both sum in an order fixed by the code, so results are the same bits run to run.
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

#ifdef TMX_ATTENTION_SUBGROUP

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

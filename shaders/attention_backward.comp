// Backward of causal sliding-window GQA attention, pass 1 of 2: the query side. One workgroup
// per (query i, head h, sequence b) recomputes the scores s_ij = scale q_i . k_j and
// dP_ij = dO_i . v_j over the query's keys (no T x T matrix anywhere) in two sweeps, keys oldest
// first in chunks of CH:
//   1. online softmax statistics: the max m_i, l_i = sum_j exp(s_ij - m_i) and
//      D_i = sum_j P_ij dP_ij (its numerator rescaled with l_i's);
//   2. dS_ij = P_ij (dP_ij - D_i) scale with P_ij = exp(s_ij - m_i) / l_i, and
//      d_q_i += sum_j dS_ij k_j (invocations own channels of d_q_i).
// m_i, l_i, D_i go to stats [B, H, T, 3] for pass 2 (attention_backward_kv.comp). Every sum
// runs in a fixed order (tree reductions, keys in order), so results are bitwise reproducible.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;   // a power of two
layout(constant_id = 1) const uint CH = 128;  // keys per chunk, a multiple of WG
const uint MAX_HEAD_DIM = 256;
const uint PER_THREAD = (MAX_HEAD_DIM + WG - 1) / WG;
shared float red[WG];
#include "reduce.glsl"

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

shared float qs[MAX_HEAD_DIM];
shared float dos[MAX_HEAD_DIM];
shared float score[CH];  // s, then P (sweep 1) or dS (sweep 2)
shared float dprob[CH];

// s and dP of key j (kv row element offset `row`) into score[x], dprob[x].
void scores(uint row, uint x) {
    float s = 0.0, dp = 0.0;
    for (uint c = 0; c < pc.hd; ++c) {
        s += qs[c] * k[pc.off_k + row + c];
        dp += dos[c] * v[pc.off_v + row + c];
    }
    score[x] = s * pc.scale;
    dprob[x] = dp;
}

void main() {
    const uint i = gl_WorkGroupID.x, h = gl_WorkGroupID.y, b = gl_WorkGroupID.z;
    const uint t = gl_LocalInvocationID.x;
    const uint kvh = h / (pc.H / pc.Hkv);
    const uint first = pc.window > 0 && i + 1 > pc.window ? i + 1 - pc.window : 0u;
    const uint n_keys = i - first + 1;
    // Element offset of key `first`'s row for this kv head; rows are Hkv * hd apart.
    const uint kv0 = ((b * pc.T + first) * pc.Hkv + kvh) * pc.hd, kv_stride = pc.Hkv * pc.hd;

    const uint q_row = ((b * pc.T + i) * pc.H + h) * pc.hd;
    for (uint c = t; c < pc.hd; c += WG) {
        qs[c] = q[pc.off_q + q_row + c];
        dos[c] = d_out[pc.off_do + q_row + c];
    }
    barrier();

    // Sweep 1: m, l and D's numerator sum_j exp(s_ij - m) dP_ij, rescaled as m grows.
    float m = NEG_INF, l = 0.0, dn = 0.0;
    for (uint c0 = 0; c0 < n_keys; c0 += CH) {
        const uint count = min(CH, n_keys - c0);
        float local_max = NEG_INF;
        for (uint x = t; x < count; x += WG) {
            scores(kv0 + (c0 + x) * kv_stride, x);
            local_max = max(local_max, score[x]);
        }
        const float m_new = max(m, reduce_max(local_max));
        float local_l = 0.0, local_d = 0.0;
        for (uint x = t; x < count; x += WG) {
            const float e = exp(score[x] - m_new);
            local_l += e;
            local_d += e * dprob[x];
        }
        const float alpha = c0 == 0 ? 0.0 : exp(m - m_new);
        l = l * alpha + reduce_sum(local_l);
        dn = dn * alpha + reduce_sum(local_d);
        m = m_new;
    }
    const float inv_l = 1.0 / l;
    const float D = dn * inv_l;
    if (t == 0) {
        const uint s_row = pc.off_stats + ((b * pc.H + h) * pc.T + i) * 3;
        stats[s_row] = m;
        stats[s_row + 1] = l;
        stats[s_row + 2] = D;
    }

    // Sweep 2: dS, and d_q_i = sum_j dS_ij k_j per channel.
    float acc[PER_THREAD];
    for (uint r = 0; r < PER_THREAD; ++r) acc[r] = 0.0;
    for (uint c0 = 0; c0 < n_keys; c0 += CH) {
        const uint count = min(CH, n_keys - c0);
        for (uint x = t; x < count; x += WG) {
            scores(kv0 + (c0 + x) * kv_stride, x);
            const float p = exp(score[x] - m) * inv_l;
            score[x] = p * (dprob[x] - D) * pc.scale;
        }
        barrier();
        for (uint r = 0; r < PER_THREAD; ++r) {
            const uint c = t + r * WG;
            if (c >= pc.hd) break;
            float a = acc[r];
            for (uint x = 0; x < count; ++x)
                a += score[x] * k[pc.off_k + kv0 + (c0 + x) * kv_stride + c];
            acc[r] = a;
        }
        barrier();  // score is rewritten by the next chunk
    }
    for (uint r = 0; r < PER_THREAD; ++r) {
        const uint c = t + r * WG;
        if (c < pc.hd) d_q[pc.off_dq + q_row + c] += acc[r];
    }
}

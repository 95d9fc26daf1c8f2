// Backward of causal sliding-window GQA attention, pass 2 of 2: the key side. One workgroup per
// (key j, kv head, sequence b) visits every (query i, head h) that sees key j: i from j to
// j + window - 1 (to T - 1 when unlimited), each of the group's query heads, in that order and
// in chunks of CH. It recomputes s_ij = scale q_i . k_j and dP_ij = dO_i . v_j, then from pass
// 1's statistics (attention_backward.comp: m_i, l_i, D_i in stats [B, H, T, 3])
//   P_ij = exp(s_ij - m_i) / l_i,  dS_ij = P_ij (dP_ij - D_i) scale,
//   d_k_j += sum dS_ij q_i,  d_v_j += sum P_ij dO_i
// with invocations owning channels of d_k_j and d_v_j: each is summed by one invocation in a
// fixed order (no atomics), so results are bitwise reproducible.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;   // a power of two
layout(constant_id = 1) const uint CH = 128;  // (query, head) pairs per chunk, a multiple of WG
const uint MAX_HEAD_DIM = 256;
const uint PER_THREAD = (MAX_HEAD_DIM + WG - 1) / WG;

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

shared float ks[MAX_HEAD_DIM];
shared float vs[MAX_HEAD_DIM];
shared float prob[CH];
shared float dscore[CH];
shared uint rows[CH];  // element offset of the pair's q / d_out row

void main() {
    const uint j = gl_WorkGroupID.x, kvh = gl_WorkGroupID.y, b = gl_WorkGroupID.z;
    const uint t = gl_LocalInvocationID.x;
    const uint G = pc.H / pc.Hkv;
    // The last query that sees key j (window > T - j: none past the sequence's end).
    const uint last = pc.window > 0 && pc.window < pc.T - j ? j + pc.window - 1 : pc.T - 1;
    const uint n_pairs = (last - j + 1) * G;

    const uint kv_row = ((b * pc.T + j) * pc.Hkv + kvh) * pc.hd;
    for (uint c = t; c < pc.hd; c += WG) {
        ks[c] = k[pc.off_k + kv_row + c];
        vs[c] = v[pc.off_v + kv_row + c];
    }
    barrier();

    float acc_k[PER_THREAD], acc_v[PER_THREAD];
    for (uint r = 0; r < PER_THREAD; ++r) acc_k[r] = acc_v[r] = 0.0;
    for (uint n0 = 0; n0 < n_pairs; n0 += CH) {
        const uint count = min(CH, n_pairs - n0);
        for (uint x = t; x < count; x += WG) {
            const uint n = n0 + x;
            const uint i = j + n / G, h = kvh * G + n % G;
            const uint row = ((b * pc.T + i) * pc.H + h) * pc.hd;
            float s = 0.0, dp = 0.0;
            for (uint c = 0; c < pc.hd; ++c) {
                s += q[pc.off_q + row + c] * ks[c];
                dp += d_out[pc.off_do + row + c] * vs[c];
            }
            const uint s_row = pc.off_stats + ((b * pc.H + h) * pc.T + i) * 3;
            const float p = exp(s * pc.scale - stats[s_row]) * (1.0 / stats[s_row + 1]);
            prob[x] = p;
            dscore[x] = p * (dp - stats[s_row + 2]) * pc.scale;
            rows[x] = row;
        }
        barrier();
        for (uint r = 0; r < PER_THREAD; ++r) {
            const uint c = t + r * WG;
            if (c >= pc.hd) break;
            float ak = acc_k[r], av = acc_v[r];
            for (uint x = 0; x < count; ++x) {
                ak += dscore[x] * q[pc.off_q + rows[x] + c];
                av += prob[x] * d_out[pc.off_do + rows[x] + c];
            }
            acc_k[r] = ak;
            acc_v[r] = av;
        }
        barrier();  // prob, dscore and rows are rewritten by the next chunk
    }
    for (uint r = 0; r < PER_THREAD; ++r) {
        const uint c = t + r * WG;
        if (c >= pc.hd) break;
        d_k[pc.off_dk + kv_row + c] += acc_k[r];
        d_v[pc.off_dv + kv_row + c] += acc_v[r];
    }
}

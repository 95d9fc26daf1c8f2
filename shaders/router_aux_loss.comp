// Load-balancing loss E * sum_e f_e * P_e of one MoE layer, in one workgroup: rows are taken
// WG at a time (each invocation finds its row's max and softmax normaliser), then each
// invocation adds the probabilities of its experts over those rows; the counts f come from
// shared atomics.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;
const uint MAX_EXPERTS = 1024;

layout(std430, binding = 0) readonly buffer Logits { float logits[]; };
layout(std430, binding = 1) readonly buffer Indices { int indices[]; };
layout(std430, binding = 2) writeonly buffer Out { float o[]; };
layout(std430, binding = 3) buffer Status { uint status[]; };

layout(push_constant) uniform Push {
    uint off_l, off_i, off_o, off_status;
    uint N, E, k;
} pc;

shared float prob_sum[MAX_EXPERTS];
shared uint counts[MAX_EXPERTS];
shared float row_max[WG], row_inv_z[WG];

void main() {
    const uint t = gl_LocalInvocationID.x;
    for (uint e = t; e < pc.E; e += WG) {
        prob_sum[e] = 0.0;
        counts[e] = 0;
    }
    barrier();
    for (uint base = 0; base < pc.N; base += WG) {
        const uint n = base + t;
        if (n < pc.N) {
            const uint row = pc.off_l + n * pc.E;
            float m = logits[row];
            for (uint e = 1; e < pc.E; ++e) m = max(m, logits[row + e]);
            float z = 0.0;
            for (uint e = 0; e < pc.E; ++e) z += exp(logits[row + e] - m);
            row_max[t] = m;
            row_inv_z[t] = 1.0 / z;
        }
        barrier();
        const uint rows = min(WG, pc.N - base);
        for (uint e = t; e < pc.E; e += WG) {
            float acc = 0.0;
            for (uint r = 0; r < rows; ++r)
                acc += exp(logits[pc.off_l + (base + r) * pc.E + e] - row_max[r]) * row_inv_z[r];
            prob_sum[e] += acc;
        }
        barrier();
    }
    for (uint s = t; s < pc.N * pc.k; s += WG) {
        const int e = indices[pc.off_i + s];
        if (e < 0 || uint(e) >= pc.E) {
            REPORT_ERROR(ERR_EXPERT_INDEX, e, pc.E);
        } else {
            atomicAdd(counts[e], 1u);
        }
    }
    barrier();
    if (t == 0) {
        float total = 0.0;
        for (uint e = 0; e < pc.E; ++e) total += float(counts[e]) * prob_sum[e];
        const float n = float(pc.N);
        o[pc.off_o] = float(pc.E) * total / (n * n);
    }
}

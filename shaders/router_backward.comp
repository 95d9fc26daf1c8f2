// router_backward in two passes (phase, a push constant; the same bindings in both).
//   phase 0 (only when aux_weight > 0; one workgroup): counts of each expert over all N*k
//     choices (integer shared atomics: exact, order-free), then the load-balancing loss's
//     gradient per mean probability, dprob[e] = aux_weight * E * (count_e / N) / N (the counts
//     are constants: the loss reaches the logits only through the mean probabilities P).
//   phase 1 (one invocation per row): the gate softmax's gradient,
//     d r[idx_j] += g_j (dg_j - sum_l g_l dg_l), then, with aux, the full softmax p's,
//     d r[e] += p_e (dprob_e - <p, dprob>): each row's sums in a fixed order by one invocation,
//     so the result is the same on every run. The CPU's formulas (backends/cpu/moe.cpp), in fp32.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
const uint MAX_EXPERTS = 1024;

layout(std430, binding = 0) readonly buffer Logits { float logits[]; };  // [N, E]
layout(std430, binding = 1) readonly buffer Indices { int indices[]; };  // [N, k]
layout(std430, binding = 2) readonly buffer Gates { float gates[]; };    // [N, k]
layout(std430, binding = 3) readonly buffer DGates { float d_gates[]; }; // [N, k]
layout(std430, binding = 4) buffer DProb { float dprob[]; };             // [E], phase 0 writes
layout(std430, binding = 5) buffer DLogits { float d_logits[]; };        // [N, E], accumulated
layout(std430, binding = 6) buffer Status { uint status[]; };

layout(push_constant) uniform Push {
    uint off_l, off_i, off_g, off_dg, off_dp, off_dl, off_status;
    uint N, E, k;
    uint has_aux;
    float aux_weight;
    uint phase;
} pc;

shared uint counts[MAX_EXPERTS];

void count_experts() {
    const uint t = gl_LocalInvocationID.x;
    for (uint e = t; e < pc.E; e += WG) counts[e] = 0;
    barrier();
    for (uint s = t; s < pc.N * pc.k; s += WG) {
        const int e = indices[pc.off_i + s];
        if (e < 0 || uint(e) >= pc.E) {
            REPORT_ERROR(ERR_EXPERT_INDEX, e, pc.E);
        } else {
            atomicAdd(counts[e], 1u);
        }
    }
    barrier();
    const float n = float(pc.N);
    for (uint e = t; e < pc.E; e += WG)
        dprob[pc.off_dp + e] = pc.aux_weight * float(pc.E) * (float(counts[e]) / n) / n;
}

void row(uint n) {
    const uint drow = pc.off_dl + n * pc.E, choices = n * pc.k;
    float s = 0.0;
    for (uint j = 0; j < pc.k; ++j)
        s += gates[pc.off_g + choices + j] * d_gates[pc.off_dg + choices + j];
    for (uint j = 0; j < pc.k; ++j) {
        const int e = indices[pc.off_i + choices + j];
        if (e < 0 || uint(e) >= pc.E) {
            REPORT_ERROR(ERR_EXPERT_INDEX, e, pc.E);
            continue;
        }
        const float g = gates[pc.off_g + choices + j];
        d_logits[drow + uint(e)] += g * (d_gates[pc.off_dg + choices + j] - s);
    }
    if (pc.has_aux == 0) return;
    const uint lrow = pc.off_l + n * pc.E;
    float m = logits[lrow];
    for (uint e = 1; e < pc.E; ++e) m = max(m, logits[lrow + e]);
    float z = 0.0;
    for (uint e = 0; e < pc.E; ++e) z += exp(logits[lrow + e] - m);
    const float inv_z = 1.0 / z;
    float dot = 0.0;
    for (uint e = 0; e < pc.E; ++e)
        dot += exp(logits[lrow + e] - m) * inv_z * dprob[pc.off_dp + e];
    for (uint e = 0; e < pc.E; ++e) {
        const float p = exp(logits[lrow + e] - m) * inv_z;
        d_logits[drow + e] += p * (dprob[pc.off_dp + e] - dot);
    }
}

void main() {
    if (pc.phase == 0) {
        count_experts();
        return;
    }
    const uint n = group_index() * WG + gl_LocalInvocationID.x;
    if (n < pc.N) row(n);
}

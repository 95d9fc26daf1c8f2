// Per row of logits [N, E]: the k largest (descending, ties to the lower index) and the softmax
// of those k. One invocation per row: E and k are small, and the selection is the contract's
// own rule (scan in index order with a strict comparison).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;

layout(std430, binding = 0) readonly buffer Logits { float logits[]; };
layout(std430, binding = 1) buffer Indices { int indices[]; };
layout(std430, binding = 2) writeonly buffer Gates { float gates[]; };

layout(push_constant) uniform Push {
    uint off_l, off_i, off_g;
    uint N, E, k;
} pc;

void main() {
    const uint n = group_index() * WG + gl_LocalInvocationID.x;
    if (n >= pc.N) return;
    const uint row = pc.off_l + n * pc.E, top = pc.off_i + n * pc.k;
    for (uint j = 0; j < pc.k; ++j) {
        int best = -1;
        float best_v = 0.0;
        for (uint e = 0; e < pc.E; ++e) {
            bool taken = false;
            for (uint t = 0; t < j; ++t) taken = taken || indices[top + t] == int(e);
            if (taken) continue;
            const float v = logits[row + e];
            if (best < 0 || v > best_v) {
                best = int(e);
                best_v = v;
            }
        }
        indices[top + j] = best;
    }
    const float m = logits[row + uint(indices[top])];
    float sum = 0.0;
    for (uint j = 0; j < pc.k; ++j) sum += exp(logits[row + uint(indices[top + j])] - m);
    for (uint j = 0; j < pc.k; ++j)
        gates[pc.off_g + n * pc.k + j] = exp(logits[row + uint(indices[top + j])] - m) / sum;
}

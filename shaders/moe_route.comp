// MoE routing in one workgroup (Backend::moe_route, for decoding's few rows): router_topk,
// moe_group and gather_rows as one dispatch, with the same results.
//  1. Per row (an invocation each): the k largest logits (descending, ties to the lower index;
//     router_topk.comp's scan) and the softmax of those k, kept in shared memory too.
//  2. Per slot s = n*k + j of expert e: its sorted place = (slots of experts < e) + (earlier
//     slots of e): a stable grouping; per expert: offsets[e] = slots of experts < e. Counted
//     by scanning the (few) slots: no atomics, the same integers on every run.
//  3. xs[place(s), :] = x[s / k, :].
// The host keeps N <= WG rows and N*k <= MAX_SLOTS slots (moe.cpp); the chosen experts are
// always in [0, E), so nothing needs reporting.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;
const uint MAX_SLOTS = 512;  // moe.cpp's kRouteMaxSlots

layout(std430, binding = 0) readonly buffer Logits { float logits[]; };
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 2) writeonly buffer Indices { int indices[]; };
layout(std430, binding = 3) writeonly buffer Gates { float gates[]; };
layout(std430, binding = 4) writeonly buffer Offsets { int offsets[]; };
layout(std430, binding = 5) writeonly buffer SlotRows { int slot_rows[]; };
layout(std430, binding = 6) writeonly buffer SlotOf { int slot_of[]; };
layout(std430, binding = 7) writeonly buffer Xs { float xs[]; };

layout(push_constant) uniform Push {
    uint off_l, off_x, off_i, off_g, off_off, off_rows, off_of, off_xs;
    uint N, E, k, d;
} pc;

shared int expert_of[MAX_SLOTS];  // per slot n*k + j: token n's j-th choice
shared uint place_of[MAX_SLOTS];  // per slot: its place in expert order

void main() {
    const uint t = gl_LocalInvocationID.x, S = pc.N * pc.k;
    for (uint n = t; n < pc.N; n += WG) {
        const uint row = pc.off_l + n * pc.E, top = n * pc.k;
        for (uint j = 0; j < pc.k; ++j) {
            int best = -1;
            float best_v = 0.0;
            for (uint e = 0; e < pc.E; ++e) {
                bool taken = false;
                for (uint u = 0; u < j; ++u) taken = taken || expert_of[top + u] == int(e);
                if (taken) continue;
                const float v = logits[row + e];
                if (best < 0 || v > best_v) {
                    best = int(e);
                    best_v = v;
                }
            }
            expert_of[top + j] = best;
            indices[pc.off_i + top + j] = best;
        }
        const float m = logits[row + uint(expert_of[top])];
        float sum = 0.0;
        for (uint j = 0; j < pc.k; ++j) sum += exp(logits[row + uint(expert_of[top + j])] - m);
        for (uint j = 0; j < pc.k; ++j)
            gates[pc.off_g + top + j] = exp(logits[row + uint(expert_of[top + j])] - m) / sum;
    }
    barrier();

    for (uint s = t; s < S; s += WG) {
        const int e = expert_of[s];
        uint place = 0;
        for (uint u = 0; u < S; ++u) {
            const int f = expert_of[u];
            place += (f < e || (f == e && u < s)) ? 1u : 0u;
        }
        place_of[s] = place;
        slot_of[pc.off_of + s] = int(place);
        slot_rows[pc.off_rows + place] = int(s / pc.k);
    }
    for (uint e = t; e <= pc.E; e += WG) {
        uint before = 0;
        for (uint u = 0; u < S; ++u) before += expert_of[u] < int(e) ? 1u : 0u;
        offsets[pc.off_off + e] = int(before);
    }
    barrier();

    for (uint idx = t; idx < S * pc.d; idx += WG) {
        const uint s = idx / pc.d, c = idx % pc.d;
        xs[pc.off_xs + place_of[s] * pc.d + c] = x[pc.off_x + (s / pc.k) * pc.d + c];
    }
}

// Greedy decoding's token per row (Backend::argmax_rows): tokens[n] = the first index of the
// largest value of logits[n, :], or -1 where the row holds a NaN or an infinity. One workgroup
// per row: each invocation walks every WG-th value keeping its first largest, then a tree keeps
// the larger of two, or the lower index of two equal ones: the first largest of the row, the
// same whatever the workgroup size or the order the values were read in.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;  // a power of two

layout(std430, binding = 0) readonly buffer Logits { float logits[]; };
layout(std430, binding = 1) writeonly buffer Tokens { int tokens[]; };

layout(push_constant) uniform Push {
    uint off_l, off_t;
    uint N, V;
} pc;

shared float best_value[WG];
shared uint best_index[WG];
shared uint not_finite[WG];

void main() {
    const uint n = group_index();
    if (n >= pc.N) return;
    const uint t = gl_LocalInvocationID.x;
    const uint row = pc.off_l + n * pc.V;
    float best = NEG_INF;
    uint at = 0xffffffffu, bad = 0u;
    for (uint v = t; v < pc.V; v += WG) {
        const float x = logits[row + v];
        // An all-ones exponent is an infinity or a NaN (by the bits: no driver may fold it away
        // as it might isnan() under fast math).
        bad |= (floatBitsToUint(x) & 0x7f800000u) == 0x7f800000u ? 1u : 0u;
        if (x > best || at == 0xffffffffu) {
            best = x;
            at = v;
        }
    }
    best_value[t] = best;
    best_index[t] = at;
    not_finite[t] = bad;
    barrier();
    for (uint s = WG / 2; s > 0; s >>= 1) {
        if (t < s) {
            const float other = best_value[t + s];
            const uint other_at = best_index[t + s];
            if (other_at != 0xffffffffu &&
                (best_index[t] == 0xffffffffu || other > best_value[t] ||
                 (other == best_value[t] && other_at < best_index[t]))) {
                best_value[t] = other;
                best_index[t] = other_at;
            }
            not_finite[t] |= not_finite[t + s];
        }
        barrier();
    }
    if (t == 0) tokens[pc.off_t + n] = not_finite[0] != 0u ? -1 : int(best_index[0]);
}

// out[0] = sum of x[i]^2, for the gradient's global norm. Summed in compensated fp32 (a
// float pair hi + lo, each addition an exact two-sum; `precise` keeps the compiler from
// reassociating or fusing it), which carries about twice fp32's digits without needing fp64
// (many GPUs lack it). Two passes, in a fixed order (the same bits on every run):
//   PASS 0: workgroup g sums x[i] for i = g*WG + t + k*(G*WG), into partials[2g], [2g+1];
//   PASS 1: one workgroup sums the G partial pairs and writes out[0] = hi + lo.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;  // a power of two
layout(constant_id = 1) const uint PASS = 0;
shared float red_hi[WG];
shared float red_lo[WG];

layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) buffer Partials { float partials[]; };
layout(std430, binding = 2) writeonly buffer Out { float o[]; };

layout(push_constant) uniform Push {
    uint off_x, off_p, off_o;
    uint n;
    uint groups;  // G
} pc;

// (hi, lo) += (bh, bl), with the rounding error of hi + bh kept in lo (Knuth's two-sum).
void add_pair(inout float hi, inout float lo, float bh, float bl) {
    precise float s = hi + bh;
    precise float bb = s - hi;
    precise float err = (hi - (s - bb)) + (bh - bb);
    hi = s;
    lo = lo + bl + err;
}

// The workgroup's pairs summed along a fixed tree; the total in red_hi[0], red_lo[0].
void reduce_pairs(float hi, float lo) {
    const uint t = gl_LocalInvocationID.x;
    red_hi[t] = hi;
    red_lo[t] = lo;
    barrier();
    for (uint s = WG / 2; s > 0; s >>= 1) {
        if (t < s) {
            float h = red_hi[t], l = red_lo[t];
            add_pair(h, l, red_hi[t + s], red_lo[t + s]);
            red_hi[t] = h;
            red_lo[t] = l;
        }
        barrier();
    }
}

void main() {
    const uint t = gl_LocalInvocationID.x;
    float hi = 0.0, lo = 0.0;
    if (PASS == 0) {
        const uint g = gl_WorkGroupID.x;
        for (uint i = g * WG + t; i < pc.n; i += pc.groups * WG) {
            const float v = x[pc.off_x + i];
            precise float sq = v * v;
            precise float sq_err = fma(v, v, -sq);  // v*v = sq + sq_err exactly
            add_pair(hi, lo, sq, sq_err);
        }
        reduce_pairs(hi, lo);
        if (t == 0) {
            partials[pc.off_p + 2 * g] = red_hi[0];
            partials[pc.off_p + 2 * g + 1] = red_lo[0];
        }
    } else {
        for (uint g = t; g < pc.groups; g += WG)
            add_pair(hi, lo, partials[pc.off_p + 2 * g], partials[pc.off_p + 2 * g + 1]);
        reduce_pairs(hi, lo);
        if (t == 0) o[pc.off_o] = red_hi[0] + red_lo[0];
    }
}

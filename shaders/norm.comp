// LayerNorm (mean and biased variance) or RMSNorm over each row of x [N, d]; one workgroup per
// row; the formulas in norm_stats.glsl.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;
shared float red[WG];
#include "reduce.glsl"
#include "norm_stats.glsl"

layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer W { float w[]; };
layout(std430, binding = 2) readonly buffer B { float b[]; };
layout(std430, binding = 3) writeonly buffer Out { float o[]; };

layout(push_constant) uniform Push {
    uint off_x, off_w, off_b, off_o;
    uint N, d;
    float eps;
    uint layernorm;  // 0: rmsnorm (no mean, no bias)
} pc;

void main() {
    const uint row = group_index();
    if (row >= pc.N) return;
    const uint t = gl_LocalInvocationID.x;
    const uint base = pc.off_x + row * pc.d;
    float mean = 0.0;
    if (pc.layernorm != 0) {
        const float shift = x[base];
        float s = 0.0;
        for (uint i = t; i < pc.d; i += WG) s += x[base + i] - shift;
        mean = norm_mean(shift, reduce_sum(s), pc.d);
    }
    float sq = 0.0;
    for (uint i = t; i < pc.d; i += WG) {
        const float c = x[base + i] - mean;
        sq += c * c;
    }
    const float rstd = norm_rstd(reduce_sum(sq), pc.d, pc.eps);
    for (uint i = t; i < pc.d; i += WG) {
        float v = norm_scale(x[base + i], mean, rstd, w[pc.off_w + i]);
        if (pc.layernorm != 0) v += b[pc.off_b + i];
        o[pc.off_o + row * pc.d + i] = v;
    }
}

// The second pass of a matmul split along k (matmul.comp): out[m, n] (+)= the splits' partials
// [splits, M, N] added in split order (+ bias[n]), as the unsplit product would add its sum.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;

layout(std430, binding = 0) readonly buffer Partials { float partials[]; };
layout(std430, binding = 1) readonly buffer Bias { float bias[]; };
layout(std430, binding = 2) buffer Out { float o[]; };

layout(push_constant) uniform Push {
    uint off_p, off_bias, off_o;
    uint M, N, splits;
    uint has_bias, accumulate;
} pc;

void main() {
    const uint i = group_index() * WG + gl_LocalInvocationID.x, size = pc.M * pc.N;
    if (i >= size) return;
    float r = 0.0;
    for (uint z = 0; z < pc.splits; ++z) r += partials[pc.off_p + z * size + i];
    if (pc.has_bias != 0) r += bias[pc.off_bias + i % pc.N];
    const uint at = pc.off_o + i;
    o[at] = pc.accumulate != 0 ? o[at] + r : r;
}

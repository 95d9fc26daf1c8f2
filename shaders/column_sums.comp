// out[c] += sum over rows m of x[m, c] (bias_backward): one invocation per column, adding the
// rows in order, so the sum is the same on every run.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;

layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) buffer Out { float o[]; };

layout(push_constant) uniform Push {
    uint off_x, off_o;
    uint M, N;
} pc;

void main() {
    const uint c = group_index() * WG + gl_LocalInvocationID.x;
    if (c >= pc.N) return;
    float s = 0.0;
    for (uint m = 0; m < pc.M; ++m) s += x[pc.off_x + m * pc.N + c];
    o[pc.off_o + c] += s;
}

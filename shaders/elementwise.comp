// Elementwise ops, one per specialization: out = op(x, y), the activations of activations.glsl
// or an add. out may alias x or y (each invocation reads its own element before writing it).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "activations.glsl"
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;
layout(constant_id = 1) const uint OP = 0;  // 0 add, 1 swiglu, 2 gelu, 3 silu, 4 relu, 5 relu2

layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer Y { float y[]; };
layout(std430, binding = 2) buffer Out { float o[]; };

layout(push_constant) uniform Push {
    uint off_x, off_y, off_o;
    uint n;
} pc;

void main() {
    const uint i = group_index() * WG + gl_LocalInvocationID.x;
    if (i >= pc.n) return;
    const float a = x[pc.off_x + i];
    float r;
    if (OP == OP_ADD) r = a + y[pc.off_y + i];
    else if (OP == OP_SWIGLU) r = activation(OP, a, y[pc.off_y + i]);
    else r = activation(OP, a, 0.0);
    o[pc.off_o + i] = r;
}

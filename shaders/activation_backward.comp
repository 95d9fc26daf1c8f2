// Backward of the activations and of SwiGLU, accumulating (backend.h): one invocation per
// element, by specialization:
//   OP 0..3 (gelu, silu, relu, relu2): d_x += act'(x) * d_out        (y, d_y unused)
//   OP 4 (swiglu, x = gate, y = up):   d_x += silu'(gate) * up * d_out, d_y += silu(gate) * d_out
// The derivatives are written with sigmoid(z) and sigmoid(-z), each 1 / (1 + exp(.)), so an
// exponent that overflows gives 0 or 1, never inf * 0 (the forward's gelu_tanh and silu).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;
layout(constant_id = 1) const uint OP = 0;

layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer Y { float y[]; };
layout(std430, binding = 2) readonly buffer DOut { float d_out[]; };
layout(std430, binding = 3) buffer DX { float d_x[]; };
layout(std430, binding = 4) buffer DY { float d_y[]; };

layout(push_constant) uniform Push {
    uint off_x, off_y, off_dout, off_dx, off_dy;
    uint n;
} pc;

float sigmoid(float z) { return 1.0 / (1.0 + exp(-z)); }

// d/dx [x sigmoid(2u)], u = k (x + c x^3): sigmoid(2u) + x 2u' sigmoid(2u) sigmoid(-2u).
float gelu_tanh_derivative(float v) {
    const float k = 0.7978845608028654, c = 0.044715;
    const float u2 = 2.0 * k * (v + c * v * v * v);
    const float s = sigmoid(u2), sn = sigmoid(-u2);
    return s + 2.0 * v * k * (1.0 + 3.0 * c * v * v) * sn * s;
}

// d/dx [x sigmoid(x)] = sigmoid(x) (1 + x sigmoid(-x)).
float silu_derivative(float v) { return sigmoid(v) * (1.0 + v * sigmoid(-v)); }

void main() {
    const uint i = group_index() * WG + gl_LocalInvocationID.x;
    if (i >= pc.n) return;
    const float a = x[pc.off_x + i], g = d_out[pc.off_dout + i];
    if (OP == 4) {
        const float u = y[pc.off_y + i];
        d_x[pc.off_dx + i] += silu_derivative(a) * u * g;
        d_y[pc.off_dy + i] += a * sigmoid(a) * g;
        return;
    }
    float dv;
    if (OP == 0) dv = gelu_tanh_derivative(a);
    else if (OP == 1) dv = silu_derivative(a);
    else if (OP == 2) dv = a > 0.0 ? 1.0 : 0.0;
    else dv = a > 0.0 ? 2.0 * a : 0.0;
    d_x[pc.off_dx + i] += dv * g;
}

// The optimizer's elementwise ops over flat tensors, one invocation per element, by
// specialization (backend.h):
//   OP 0 (scale): x *= s.
//   OP 1 (AdamW, PyTorch's formulation): with gi = g * grad_scale,
//     p *= keep (decoupled decay, keep = 1 - lr * weight_decay); m = b1 m + (1 - b1) gi;
//     v = b2 v + (1 - b2) gi^2; p -= step_size * m / (sqrt(v) / bc2_sqrt + eps),
//     step_size = lr / (1 - b1^step), bc2_sqrt = sqrt(1 - b2^step), computed on the host in
//     double as the CPU backend does.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;
layout(constant_id = 1) const uint OP = 0;

layout(std430, binding = 0) buffer P { float p[]; };
layout(std430, binding = 1) readonly buffer G { float g[]; };
layout(std430, binding = 2) buffer M { float m[]; };
layout(std430, binding = 3) buffer V { float v[]; };

layout(push_constant) uniform Push {
    uint off_p, off_g, off_m, off_v;
    uint n;
    float s;  // scale's factor
    float keep, beta1, one_minus_beta1, beta2, one_minus_beta2, step_size, bc2_sqrt, eps;
    float grad_scale;
} pc;

void main() {
    const uint i = group_index() * WG + gl_LocalInvocationID.x;
    if (i >= pc.n) return;
    if (OP == 0) {
        p[pc.off_p + i] *= pc.s;
        return;
    }
    const float gi = g[pc.off_g + i] * pc.grad_scale;
    const float mi = pc.beta1 * m[pc.off_m + i] + pc.one_minus_beta1 * gi;
    const float vi = pc.beta2 * v[pc.off_v + i] + pc.one_minus_beta2 * gi * gi;
    m[pc.off_m + i] = mi;
    v[pc.off_v + i] = vi;
    const float pi = p[pc.off_p + i] * pc.keep;
    p[pc.off_p + i] = pi - pc.step_size * mi / (sqrt(vi) / pc.bc2_sqrt + pc.eps);
}

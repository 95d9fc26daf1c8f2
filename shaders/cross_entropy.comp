// losses[n] = logsumexp(logits[n, :]) - logits[n, target]; target -1 gives 0. One workgroup
// per row; the maximum is subtracted before exponentiating.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;
shared float red[WG];
#include "reduce.glsl"

layout(std430, binding = 0) readonly buffer Logits { float logits[]; };
layout(std430, binding = 1) readonly buffer Targets { int targets[]; };
layout(std430, binding = 2) writeonly buffer Losses { float losses[]; };
layout(std430, binding = 3) buffer Status { uint status[]; };

layout(push_constant) uniform Push {
    uint off_l, off_t, off_o, off_status;
    uint N, V;
} pc;

void main() {
    const uint n = group_index();
    if (n >= pc.N) return;
    const uint t = gl_LocalInvocationID.x;
    const uint row = pc.off_l + n * pc.V;
    float m = -3.0e38;
    for (uint v = t; v < pc.V; v += WG) m = max(m, logits[row + v]);
    m = reduce_max(m);
    float s = 0.0;
    for (uint v = t; v < pc.V; v += WG) s += exp(logits[row + v] - m);
    s = reduce_sum(s);
    if (t != 0) return;
    const int target = targets[pc.off_t + n];
    float loss = 0.0;
    if (target >= int(pc.V)) {
        REPORT_ERROR(ERR_TARGET, target, pc.V);
    } else if (target >= 0) {
        loss = log(s) + m - logits[row + uint(target)];
    }
    losses[pc.off_o + n] = loss;
}

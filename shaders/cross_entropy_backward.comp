// d_logits = scale * (softmax(logits) - onehot(target)) per row, written (not accumulated);
// a row whose target is -1 gets 0, a target >= V is reported. One workgroup per row; the
// maximum is subtracted before exponentiating (shaders/cross_entropy.comp's forward).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;
shared float red[WG];
#include "reduce.glsl"

layout(std430, binding = 0) readonly buffer Logits { float logits[]; };
layout(std430, binding = 1) readonly buffer Targets { int targets[]; };
layout(std430, binding = 2) writeonly buffer DLogits { float d_logits[]; };
layout(std430, binding = 3) buffer Status { uint status[]; };

layout(push_constant) uniform Push {
    uint off_l, off_t, off_d, off_status;
    uint N, V;
    float scale;
} pc;

void main() {
    const uint n = group_index();
    if (n >= pc.N) return;
    const uint t = gl_LocalInvocationID.x;
    const uint row = pc.off_l + n * pc.V, drow = pc.off_d + n * pc.V;
    const int target = targets[pc.off_t + n];  // uniform across the workgroup
    if (target < 0 || target >= int(pc.V)) {
        if (target >= int(pc.V) && t == 0) REPORT_ERROR(ERR_TARGET, target, pc.V);
        for (uint v = t; v < pc.V; v += WG) d_logits[drow + v] = 0.0;
        return;
    }
    float m = -3.0e38;
    for (uint v = t; v < pc.V; v += WG) m = max(m, logits[row + v]);
    m = reduce_max(m);
    float s = 0.0;
    for (uint v = t; v < pc.V; v += WG) s += exp(logits[row + v] - m);
    const float inv = pc.scale / reduce_sum(s);
    for (uint v = t; v < pc.V; v += WG) {
        float r = exp(logits[row + v] - m) * inv;
        if (v == uint(target)) r -= pc.scale;
        d_logits[drow + v] = r;
    }
}

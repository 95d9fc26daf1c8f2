// Backward of norm() (LayerNorm or RMSNorm over rows of x [N, d]), in two passes, both
// accumulating (backend.h):
//   PASS 0, one workgroup per row: the row's mean and rstd as the forward computes them, then
//     d_x += rstd * (g*w - mean(g*w) - xhat * mean(g*w*xhat)) (the first mean only for
//     LayerNorm, whose output ignores a shift of x); mean and rstd go to stats[2n], stats[2n+1].
//   PASS 1, one invocation per (column i, chunk of pc.chunk_rows rows): sum_n g * xhat and
//     sum_n g over the chunk's rows in order, from the stats; with one chunk added to
//     d_weight[i] and d_bias[i], else written to the chunk's partials (after the stats in the
//     stats buffer: chunk c's 2d floats at 2N + 2dc, the weight's then the bias's);
//   PASS 2, one invocation per column (only with several chunks): the chunks' partials added to
//     d_weight[i] and d_bias[i] in chunk order.
// Many rows (a training step's 16,384) thus spread over chunks x columns / WG workgroups rather
// than columns / WG. Every sum has a fixed order (a fixed reduction tree, or one invocation's
// loop): the same bits on every run.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 128;
layout(constant_id = 1) const uint PASS = 0;
shared float red[WG];
#include "reduce.glsl"

layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer W { float w[]; };
layout(std430, binding = 2) readonly buffer DOut { float g[]; };
layout(std430, binding = 3) buffer DX { float dx[]; };
layout(std430, binding = 4) buffer DW { float dw[]; };
layout(std430, binding = 5) buffer DB { float db[]; };
layout(std430, binding = 6) buffer Stats { float stats[]; };

layout(push_constant) uniform Push {
    uint off_x, off_w, off_g, off_dx, off_dw, off_db, off_stats;
    uint N, d;
    float eps;
    uint layernorm;  // 0: rmsnorm (no mean, no bias)
    uint chunk_rows, chunks;  // PASS 1 and 2
} pc;

void rows_pass() {
    const uint row = group_index();
    if (row >= pc.N) return;
    const uint t = gl_LocalInvocationID.x;
    const uint base = pc.off_x + row * pc.d, gbase = pc.off_g + row * pc.d;
    // The statistics exactly as shaders/norm.comp computes them.
    float mean = 0.0;
    if (pc.layernorm != 0) {
        const float shift = x[base];
        float s = 0.0;
        for (uint i = t; i < pc.d; i += WG) s += x[base + i] - shift;
        mean = shift + reduce_sum(s) / float(pc.d);
    }
    float sq = 0.0;
    for (uint i = t; i < pc.d; i += WG) {
        const float c = x[base + i] - mean;
        sq += c * c;
    }
    const float rstd = 1.0 / sqrt(reduce_sum(sq) / float(pc.d) + pc.eps);
    float sum_gw = 0.0, sum_gwx = 0.0;
    for (uint i = t; i < pc.d; i += WG) {
        const float gw = g[gbase + i] * w[pc.off_w + i];
        sum_gw += gw;
        sum_gwx += gw * (x[base + i] - mean) * rstd;
    }
    const float mean_gw = pc.layernorm != 0 ? reduce_sum(sum_gw) / float(pc.d) : 0.0;
    const float mean_gwx = reduce_sum(sum_gwx) / float(pc.d);
    for (uint i = t; i < pc.d; i += WG) {
        const float xhat = (x[base + i] - mean) * rstd;
        dx[pc.off_dx + row * pc.d + i] +=
            rstd * (g[gbase + i] * w[pc.off_w + i] - mean_gw - xhat * mean_gwx);
    }
    if (t == 0) {
        stats[pc.off_stats + 2 * row] = mean;
        stats[pc.off_stats + 2 * row + 1] = rstd;
    }
}

void columns_pass() {
    const uint i = gl_WorkGroupID.x * WG + gl_LocalInvocationID.x, chunk = gl_WorkGroupID.y;
    if (i >= pc.d) return;
    const uint first = chunk * pc.chunk_rows, end = min(pc.N, first + pc.chunk_rows);
    float sw = 0.0, sb = 0.0;
    for (uint n = first; n < end; ++n) {
        const float gv = g[pc.off_g + n * pc.d + i];
        const float mean = stats[pc.off_stats + 2 * n], rstd = stats[pc.off_stats + 2 * n + 1];
        sw += gv * (x[pc.off_x + n * pc.d + i] - mean) * rstd;
        sb += gv;
    }
    if (pc.chunks == 1) {
        dw[pc.off_dw + i] += sw;
        if (pc.layernorm != 0) db[pc.off_db + i] += sb;
        return;
    }
    const uint partial = pc.off_stats + 2 * pc.N + 2 * pc.d * chunk + i;
    stats[partial] = sw;
    stats[partial + pc.d] = sb;
}

void fold_pass() {
    const uint i = group_index() * WG + gl_LocalInvocationID.x;
    if (i >= pc.d) return;
    float sw = 0.0, sb = 0.0;
    for (uint c = 0; c < pc.chunks; ++c) {
        const uint partial = pc.off_stats + 2 * pc.N + 2 * pc.d * c + i;
        sw += stats[partial];
        sb += stats[partial + pc.d];
    }
    dw[pc.off_dw + i] += sw;
    if (pc.layernorm != 0) db[pc.off_db + i] += sb;
}

void main() {
    if (PASS == 0) rows_pass();
    else if (PASS == 1) columns_pass();
    else fold_pass();
}

// d_w of grouped_matmul's backward, tiled (matmul_tile.glsl): d_w[e] [Nout, K] +=
// d_out[slots of e]^T . x[slots of e], the contraction running over expert e's slots (its range
// read from offsets on the device). Workgroup (x, y, z) computes the BM x BN tile (rows of Nout
// y, columns of K x) of expert z; an expert without slots leaves its d_w untouched. Each d_w
// element is summed by one invocation, slots in ascending order: no atomics, the same bits on
// every run. fp32 only.
#version 450
#extension GL_GOOGLE_include_directive : require
#define WEIGHT_BINDING 1
#include "weights.glsl"
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;
layout(constant_id = 1) const uint BM = 64;
layout(constant_id = 2) const uint BN = 64;
layout(constant_id = 3) const uint BK = 16;
layout(constant_id = 4) const uint TM = 4;
layout(constant_id = 5) const uint TN = 4;

layout(std430, binding = 0) readonly buffer A { float a[]; };  // d_out [S, Nout]
// binding 1: x [S, K], fp32 (weights.glsl: matmul_tile.glsl reads its b operand there)
layout(std430, binding = 2) readonly buffer Offsets { int offsets[]; };
layout(std430, binding = 3) buffer Out { float o[]; };  // d_w [E, Nout, K], accumulated

layout(push_constant) uniform Push {
    uint off_dy, off_x, off_offsets, off_dw;
    uint E, Nout, K;
} pc;

#include "matmul_tile.glsl"

void main() {
    const uint e = gl_WorkGroupID.z;
    const uint begin = uint(offsets[pc.off_offsets + e]);
    const uint end = uint(offsets[pc.off_offsets + e + 1]);
    if (end <= begin) return;  // no slot: uniform across the workgroup
    const uint row0 = gl_WorkGroupID.y * BM, col0 = gl_WorkGroupID.x * BN;
    // a(n, s) = d_out[begin + s, n]; b(s, c) = x[begin + s, c].
    tile_gemm(row0, min(BM, pc.Nout - row0), col0, min(BN, pc.K - col0), end - begin,
              pc.off_dy + begin * pc.Nout, 1, pc.Nout, weight_origin(pc.off_x, 0), begin * pc.K,
              pc.K, 1);
    for (uint i = 0; i < TM; ++i) {
        const uint n = row0 + tile_row(i);
        if (n >= pc.Nout) break;
        for (uint j = 0; j < TN; ++j) {
            const uint c = col0 + tile_col(j);
            if (c >= pc.K) break;
            const uint at = pc.off_dw + (e * pc.Nout + n) * pc.K + c;
            o[at] = o[at] + acc[i * TN + j];
        }
    }
}

// d_x of grouped_matmul's backward, tiled (matmul_tile.glsl): d_x[s, :] += d_out[s, :] . w[e]
// (w not transposed: the contraction runs over Nout) for the sorted slots s of expert e. As in
// grouped_matmul.comp, workgroup row y is the y-th row tile when each expert's slots are cut
// into tiles of BM in expert order, read from offsets on the device (the grid has
// ceil(S/BM) + E rows; spare ones exit). Each d_x element is summed by one invocation in a
// fixed order, so the result does not depend on scheduling. fp32 only.
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
// binding 1: w [E, Nout, K], fp32 (weights.glsl)
layout(std430, binding = 2) readonly buffer Offsets { int offsets[]; };
layout(std430, binding = 3) buffer Out { float o[]; };  // d_x [S, K], accumulated

layout(push_constant) uniform Push {
    uint off_dy, off_w, off_offsets, off_dx;
    uint E, Nout, K;
} pc;

#include "matmul_tile.glsl"

void main() {
    uint tile = gl_WorkGroupID.y, e = 0, begin = 0, end = 0;
    for (; e < pc.E; ++e) {
        begin = uint(offsets[pc.off_offsets + e]);
        end = uint(offsets[pc.off_offsets + e + 1]);
        const uint tiles = (end - begin + BM - 1) / BM;
        if (tile < tiles) break;
        tile -= tiles;
    }
    if (e == pc.E) return;  // uniform across the workgroup
    const uint row0 = begin + tile * BM, col0 = gl_WorkGroupID.x * BN;
    // a(m, n) = d_out[m, n]; b(n, c) = w[e, n, c].
    tile_gemm(row0, min(BM, end - row0), col0, min(BN, pc.K - col0), pc.Nout, pc.off_dy, pc.Nout,
              1, weight_origin(pc.off_w, 0), e * pc.Nout * pc.K, pc.K, 1);
    for (uint i = 0; i < TM; ++i) {
        const uint m = row0 + tile_row(i);
        if (m >= end) break;
        for (uint j = 0; j < TN; ++j) {
            const uint c = col0 + tile_col(j);
            if (c >= pc.K) break;
            const uint at = pc.off_dx + m * pc.K + c;
            o[at] = o[at] + acc[i * TN + j];
        }
    }
}

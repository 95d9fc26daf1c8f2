// One matmul over all experts, tiled (matmul_tile.glsl): out[s, :] = x[s, :] . w[e]^T
// (+ bias[e]) for the sorted slots s of expert e. The expert ranges come from offsets on the
// device: workgroup row y is the y-th row tile when each expert's slots are cut into tiles
// of BM in expert order (the grid has ceil(S/BM) + E rows, enough for any split; spare ones
// exit). Also built reading w in 16- and 8-bit formats (weights.glsl).
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

layout(std430, binding = 0) readonly buffer A { float a[]; };  // x [S, K]
// binding 1: w [E, Nout, K] (weights.glsl)
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };
layout(std430, binding = 3) readonly buffer Offsets { int offsets[]; };
layout(std430, binding = 4) writeonly buffer Out { float o[]; };

layout(push_constant) uniform Push {
    uint off_x, off_w, off_bias, off_offsets, off_o;
    uint E, Nout, K;
    uint has_bias;
    uint w_adjust;  // weights.glsl
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
    tile_gemm(row0, min(BM, end - row0), col0, min(BN, pc.Nout - col0), pc.K, pc.off_x, pc.K, 1,
              weight_origin(pc.off_w, pc.w_adjust), e * pc.Nout * pc.K, 1, pc.K);
    for (uint i = 0; i < TM; ++i) {
        const uint m = row0 + tile_row(i);
        if (m >= end) break;
        for (uint j = 0; j < TN; ++j) {
            const uint n = col0 + tile_col(j);
            if (n >= pc.Nout) break;
            float r = acc[i * TN + j];
            if (pc.has_bias != 0) r += bias[pc.off_bias + e * pc.Nout + n];
            o[pc.off_o + m * pc.Nout + n] = r;
        }
    }
}

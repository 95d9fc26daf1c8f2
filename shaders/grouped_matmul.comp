// One matmul over all experts, tiled (matmul_tile.glsl): out[s, :] = x[s, :] . w[e]^T
// (+ bias[e]) for the sorted slots s of expert e. The expert ranges come from offsets on the
// device: workgroup row y is the y-th row tile when each expert's slots are cut into tiles
// of BM in expert order (the grid has ceil(S/BM) + E rows, enough for any split; spare ones
// exit). Also built reading w in 16- and 8-bit formats (weights.glsl).
//
// Built with TMX_MATMUL_COOPMAT (and fp16 weights), the tile's product runs on cooperative
// matrices (matmul_tile_coopmat.glsl, the ".cm" variants).
#version 450
#extension GL_GOOGLE_include_directive : require
#ifdef TMX_MATMUL_COOPMAT
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
#endif
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

// The tile's first row (slot) and column, its expert and the expert's end, for emit().
uint tile_row0, tile_col0, tile_expert, tile_end;

// Product r of tile row i, column j, with the expert's bias.
void emit(uint i, uint j, float r) {
    const uint m = tile_row0 + i, n = tile_col0 + j;
    if (m >= tile_end || n >= pc.Nout) return;
    if (pc.has_bias != 0) r += bias[pc.off_bias + tile_expert * pc.Nout + n];
    o[pc.off_o + m * pc.Nout + n] = r;
}

#ifdef TMX_MATMUL_COOPMAT
#include "matmul_tile_coopmat.glsl"
#else
#include "matmul_tile.glsl"
#endif

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
    tile_row0 = begin + tile * BM;
    tile_col0 = gl_WorkGroupID.x * BN;
    tile_expert = e;
    tile_end = end;
    tile_gemm(tile_row0, min(BM, end - tile_row0), tile_col0, min(BN, pc.Nout - tile_col0), pc.K,
              pc.off_x, pc.K, 1, weight_origin(pc.off_w, pc.w_adjust), e * pc.Nout * pc.K, 1,
              pc.K);
    tile_store();
}

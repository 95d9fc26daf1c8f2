// out[M, N] (+)= op(a) . op(b) (+ bias), tiled (matmul_tile.glsl). Transposes are strides:
// op(a)(m, k) = a[m * a_sm + k * a_sk], op(b)(k, n) = b[k * b_sk + n * b_sn]. Also built
// reading b in 16- and 8-bit formats (weights.glsl).
//
// Split along k (pc.k_split > 0; the host's choice for few tiles and a long k, such as a weight's
// gradient over a training step's tokens): workgroup z multiplies k in [z k_split, (z + 1)
// k_split) and writes its tile, without bias, to partial z of `o` (z M N onwards);
// matmul_split_sum.comp then adds the partials in z order.
//
// Built with TMX_MATMUL_COOPMAT (and fp16 weights), the tile's product runs on cooperative
// matrices (matmul_tile_coopmat.glsl, the ".cm" variants) instead of matmul_tile.glsl's fp32
// register blocks.
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

layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };
layout(std430, binding = 3) buffer Out { float o[]; };

layout(push_constant) uniform Push {
    uint off_a, off_b, off_bias, off_o;
    uint M, N, K;
    uint a_sm, a_sk, b_sk, b_sn;
    uint has_bias, accumulate;
    uint b_adjust;  // weights.glsl
    uint k_split;   // 0: the whole of k
} pc;

// The tile's first row and column, and its partial of k (split along k), for emit().
uint tile_row0, tile_col0, tile_split;

// Product r of tile row i, column j: with bias and accumulated, or as a partial.
void emit(uint i, uint j, float r) {
    const uint m = tile_row0 + i, n = tile_col0 + j;
    if (m >= pc.M || n >= pc.N) return;
    if (pc.k_split != 0) {
        o[pc.off_o + tile_split * pc.M * pc.N + m * pc.N + n] = r;
        return;
    }
    if (pc.has_bias != 0) r += bias[pc.off_bias + n];
    const uint at = pc.off_o + m * pc.N + n;
    o[at] = pc.accumulate != 0 ? o[at] + r : r;
}

#ifdef TMX_MATMUL_COOPMAT
#include "matmul_tile_coopmat.glsl"
#else
#include "matmul_tile.glsl"
#endif

void main() {
    tile_row0 = gl_WorkGroupID.y * BM;
    tile_col0 = gl_WorkGroupID.x * BN;
    tile_split = gl_WorkGroupID.z;
    const uint k0 = tile_split * pc.k_split;
    const uint depth = pc.k_split == 0 ? pc.K : min(pc.k_split, pc.K - k0);
    tile_gemm(tile_row0, min(BM, pc.M - tile_row0), tile_col0, min(BN, pc.N - tile_col0), depth,
              pc.off_a + k0 * pc.a_sk, pc.a_sm, pc.a_sk, weight_origin(pc.off_b, pc.b_adjust),
              k0 * pc.b_sk, pc.b_sk, pc.b_sn);
    tile_store();
}

// Attention in bf16 precision on tensor cores (mma.sync m16n8k16, bf16 x bf16 -> fp32, sm_80
// and newer): the forward and the backward of attention() when the backend's matmul precision
// is BF16 and head_dim <= 128 (engine/compute/backend.h states the contract;
// backends/cpu/attention.cpp is its twin). Private to attention.cu, which rounds q, k, v and d_out
// into bf16 rows padded with zeros to HD = 32, 64 or 128 dims (pad_to_bf16_rows) and launches these
// kernels. The forward's out is fp32 or bf16 (a BF16 tensor: the fp32 result, rounded as it is
// stored).
//
// The layout is the fp32 kernels' (attention.cu): a block serves one (sequence b, kv head) and
// the G query heads that read it as rows r = t * G + g (attention_tiles.h).
//   * Forward: a block owns 64 rows (16 per warp) and walks the key tiles of 64 keys its rows
//     see, flash-style: S = Q K^T into registers, an online softmax in fp32, the weights
//     rounded to bf16 (as the accumulator fragment of S is laid out exactly as the A operand
//     of the next product wants it) and O += P V.
//   * Backward, first kernel (per 64 rows): a first walk over the key tiles gives each row's
//     log-sum-exp and D = sum_j P_j dP_j (dP = dO V^T); they go to global memory for the second
//     kernel; a second walk gives dS = P (dP - D) and d_q += scale dS K.
//   * Backward, second kernel (per 64 keys, 16 per warp): walks the rows that see its keys, 32
//     at a time, with the keys as the MMA rows: S^T = K Q^T, dP^T = V dO^T, then
//     d_v += P^T dO and d_k += scale dS^T Q.
// Key and row tiles are double-buffered in shared memory with cp.async (single-buffered where a
// second buffer would not fit an L4's shared memory: dq_key_buffers). Every sum has a fixed
// order and every output element one writer: deterministic, no atomics. Exponentials are
// base 2 with log2(e) folded into the scale.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "backends/cuda/async_copy.cuh"
#include "backends/cuda/attention_tiles.h"
#include "backends/cuda/cuda_common.cuh"

namespace tmx::cuda::attention_bf16 {

namespace tiles = cuda::attention_tiles;
using tiles::Range;
using bf16 = __nv_bfloat16;

constexpr int kThreads = 128;  // 4 warps
constexpr int kWarpRows = 16;  // MMA rows per warp
constexpr int kRows = 64;      // rows per block of the forward and dq kernels
constexpr int kKeys = 64;      // keys per tile of the forward and dq kernels, per dkdv block
constexpr int kDkdvRows = 32;  // rows per step of the dkdv kernel
constexpr int kPad = 8;        // bf16 past each shared row: ldmatrix's 8 rows hit 8 bank groups
constexpr float kLog2e = 1.4426950408889634f;

// The padded head dims a head_dim is run with; 0 when the kernels cannot take it.
inline int padded_head_dim(int hd) {
    return hd <= 32 ? 32 : hd <= 64 ? 64 : hd <= 128 ? 128 : 0;
}

struct Args {
    // bf16 rows padded to HD: q and d_out [B, T, H, HD], k and v [B, T, Hkv, HD].
    const bf16 *q, *k, *v, *d_out;
    float *lse2, *delta;     // backward scratch [B, T, H]: log2-sum-exp2 of the scaled scores, D
    float *d_q, *d_k, *d_v;  // backward: accumulated, fp32 [.., hd]
    int B, T, H, Hkv, hd, window;
    float scale_log2;  // scale * log2(e)
    float scale;
};

// Shared-memory elements of a tile of n rows.
template <int HD>
__host__ __device__ constexpr int tile_elems(int n) {
    return n * (HD + kPad);
}

// Key tiles in flight while one is used: 2 (the next loads while one is used), except in the
// dq kernel at HD 128, whose second buffer would take it past the 99 KiB of shared memory a
// block may have on sm_89 (the L4).
template <int HD>
__host__ __device__ constexpr int dq_key_buffers() {
    return HD <= 64 ? 2 : 1;
}

template <int HD>
constexpr size_t forward_shared_bytes() {  // Q, then 2 buffers of K and V
    return sizeof(bf16) * tile_elems<HD>(kRows + 4 * kKeys);
}
template <int HD>
constexpr size_t dq_shared_bytes() {  // Q and dO, then dq_key_buffers() of K and V
    return sizeof(bf16) * tile_elems<HD>(2 * kRows + 2 * dq_key_buffers<HD>() * kKeys);
}
template <int HD>
constexpr size_t dkdv_shared_bytes() {  // K and V, then 2 buffers of Q, dO, lse2 and D
    return sizeof(bf16) * tile_elems<HD>(2 * kKeys + 4 * kDkdvRows) +
           sizeof(float) * 2 * 2 * kDkdvRows;
}
// sm_89's limit on a block's shared memory (sm_80: 163 KiB, sm_90: 227 KiB).
constexpr size_t kMaxSharedBytes = 99 * 1024;
static_assert(forward_shared_bytes<128>() <= kMaxSharedBytes &&
              dq_shared_bytes<128>() <= kMaxSharedBytes &&
              dkdv_shared_bytes<128>() <= kMaxSharedBytes);

// ------------------------------------------------------------------------ MMA primitives

__device__ __forceinline__ int lane_id() {
    return static_cast<int>(threadIdx.x) % 32;
}
__device__ __forceinline__ int warp_id() {
    return static_cast<int>(threadIdx.x) / 32;
}

__device__ __forceinline__ void load_matrix_x4(uint32_t (&r)[4], const bf16* p) {
    const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
__device__ __forceinline__ void load_matrix_x4_trans(uint32_t (&r)[4], const bf16* p) {
    const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

// c += a b for a 16 x 16 A fragment and a 16 x 8 B fragment (b0, b1), fp32 accumulators.
// Fragment layouts (PTX ISA, mma.m16n8k16), with g = lane / 4 and i = lane % 4: A holds
// (g, 2i..2i+1), (g+8, 2i..), (g, 2i+8..), (g+8, 2i+8..); B holds (k 2i..2i+1, n g) and
// (k 2i+8.., n g); C holds (g, 2i..2i+1) then (g+8, 2i..2i+1).
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats rounded to bf16 (nearest even) in one register, the first in the low half.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
}

// The address this lane gives ldmatrix.x4 for the 16 x 16 block at (r0, c0) of a shared tile
// with rows of ld elements. kDownFirst: the four 8 x 8 matrices are the block's top-left,
// bottom-left, top-right, bottom-right (an A fragment; a B fragment of two n-tiles, transposed,
// from a [k][n] tile); else top-left, top-right, bottom-left, bottom-right (a B fragment of two
// n-tiles from an [n][k] tile).
template <bool kDownFirst>
__device__ __forceinline__ const bf16* block_lane_ptr(const bf16* tile, int ld, int r0, int c0) {
    const int lane = lane_id(), m = lane / 8;
    const int r = r0 + lane % 8 + (kDownFirst ? (m & 1) : (m >> 1)) * 8;
    const int c = c0 + (kDownFirst ? (m >> 1) : (m & 1)) * 8;
    return tile + r * ld + c;
}

// acc[n / 8] = (16 rows of `a` from a_row0) . (N rows of `b` from b_row0)^T over the HD dims:
// both tiles [rows][HD + kPad], the products of rows with rows (S = Q K^T and its kin).
template <int HD, int N>
__device__ __forceinline__ void multiply_rows(float (&acc)[N / 8][4], const bf16* a, int a_row0,
                                              const bf16* b, int b_row0) {
    constexpr int ld = HD + kPad;
#pragma unroll
    for (int n = 0; n < N / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
    for (int d = 0; d < HD; d += 16) {
        uint32_t fa[4];
        load_matrix_x4(fa, block_lane_ptr<true>(a, ld, a_row0, d));
#pragma unroll
        for (int n = 0; n < N; n += 16) {
            uint32_t fb[4];
            load_matrix_x4(fb, block_lane_ptr<false>(b, ld, b_row0 + n, d));
            mma(acc[n / 8], fa, fb[0], fb[1]);
            mma(acc[n / 8 + 1], fa, fb[2], fb[3]);
        }
    }
}

// acc[d / 8] += bf16(w) . (the K rows of `b` from b_row0): w is a 16 x K accumulator (as
// multiply_rows leaves it), rounded to bf16 into A fragments; b a [K rows][HD + kPad] tile
// (O += P V and its kin).
template <int HD, int K>
__device__ __forceinline__ void accumulate_weighted_rows(float (&acc)[HD / 8][4],
                                                         const float (&w)[K / 8][4], const bf16* b,
                                                         int b_row0) {
    constexpr int ld = HD + kPad;
#pragma unroll
    for (int k = 0; k < K; k += 16) {
        const float(&lo)[4] = w[k / 8];
        const float(&hi)[4] = w[k / 8 + 1];
        const uint32_t fa[4] = {pack_bf16(lo[0], lo[1]), pack_bf16(lo[2], lo[3]),
                                pack_bf16(hi[0], hi[1]), pack_bf16(hi[2], hi[3])};
#pragma unroll
        for (int d = 0; d < HD; d += 16) {
            uint32_t fb[4];
            load_matrix_x4_trans(fb, block_lane_ptr<true>(b, ld, b_row0 + k, d));
            mma(acc[d / 8], fa, fb[0], fb[1]);
            mma(acc[d / 8 + 1], fa, fb[2], fb[3]);
        }
    }
}

// Element e (0..3) of a 16 x 8 accumulator fragment: its row (0..15) and column (0..7).
__device__ __forceinline__ int frag_row(int e) {
    return lane_id() / 4 + (e >= 2 ? 8 : 0);
}
__device__ __forceinline__ int frag_col(int e) {
    return 2 * (lane_id() % 4) + (e & 1);
}

// The max and the sum over the 4 lanes that hold one accumulator row.
__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// One key tile of the online softmax for this lane's row `half` (0: frag_row 0..7, 1: 8..15):
// raises row_max to the tile's scores' max and returns the base the tile's exponentials are
// taken against (0 while the row has seen no key: its weights are then all exp2(-inf) = 0) and
// the factor that rescales what the row summed before.
struct TileBase {
    float base, rescale;
};
template <int N>
__device__ __forceinline__ TileBase raise_row_max(const float (&s)[N / 8][4], float& row_max,
                                                  int half) {
    float m = row_max;
#pragma unroll
    for (int n = 0; n < N / 8; ++n) m = fmaxf(m, fmaxf(s[n][2 * half], s[n][2 * half + 1]));
    m = quad_max(m);
    const float base = m == -INFINITY ? 0.0f : m;
    const TileBase r{base, exp2f(row_max - base)};
    row_max = m;
    return r;
}

// ------------------------------------------------------------------------ staging

// Starts copying n rows of HD bf16 into tile[n][HD + kPad]: row i from row_ptr(i), or zeros
// where row_ptr(i) is null.
template <int HD, class RowPtr>
__device__ __forceinline__ void stage_rows_async(bf16* tile, int n, RowPtr row_ptr) {
    constexpr int kChunks = HD / 8;  // 16-byte chunks per row
    for (int c = static_cast<int>(threadIdx.x); c < n * kChunks; c += kThreads) {
        const int i = c / kChunks, col = (c % kChunks) * 8;
        const bf16* src = row_ptr(i);
        copy16_async(tile + i * (HD + kPad) + col, src != nullptr ? src + col : tile,
                     src != nullptr);
    }
}

// Where a block's rows live: row r of (b, kv head) is query t = r / G of head kvh * G + r % G.
struct Heads {
    int b, kvh, G;
    __device__ int64_t query_index(const Args& a, int r) const {
        return (static_cast<int64_t>(b) * a.T + r / G) * a.H + kvh * G + r % G;
    }
    __device__ int64_t key_index(const Args& a, int j) const {
        return (static_cast<int64_t>(b) * a.T + j) * a.Hkv + kvh;
    }
    // Row sources for stage_rows_async: row i of `base` ([.., HD] bf16 rows) is key (query row)
    // rows.begin + i, or nullptr (zeros) past rows.end.
    template <int HD>
    __device__ auto key_rows(const Args& a, const bf16* base, Range rows) const {
        return [=, this, &a](int i) -> const bf16* {
            return rows.begin + i < rows.end ? base + key_index(a, rows.begin + i) * HD : nullptr;
        };
    }
    template <int HD>
    __device__ auto query_rows(const Args& a, const bf16* base, Range rows) const {
        return [=, this, &a](int i) -> const bf16* {
            return rows.begin + i < rows.end ? base + query_index(a, rows.begin + i) * HD : nullptr;
        };
    }
};

// The loop of a block over n tiles staged in shared memory: stage(t) starts tile t's copies
// (and commits them) into buffer t % kBuffers; body(t) uses tile t once every thread's copies
// have landed. With 2 buffers the next tile loads while one is used; with 1, after it. Copies
// the caller started before are complete when body first runs.
template <int kBuffers, class Stage, class Body>
__device__ __forceinline__ void for_each_staged_tile(int n, Stage stage, Body body) {
    static_assert(kBuffers == 1 || kBuffers == 2);
    if (n > 0) stage(0);
    for (int tile = 0; tile < n; ++tile) {
        if (kBuffers == 2 && tile + 1 < n) {
            stage(tile + 1);
            wait_async<1>();
        } else {
            wait_async<0>();
        }
        __syncthreads();
        body(tile);
        __syncthreads();  // every warp is done with the buffer the next stage() refills
        if (kBuffers == 1 && tile + 1 < n) stage(tile + 1);
    }
}

// Calls body(k_tile, v_tile, first_key) for each tile of kKeys keys of `keys`, staged in
// kBuffers buffers (K then V, each [kKeys][HD + kPad]).
template <int HD, int kBuffers, class Body>
__device__ __forceinline__ void for_each_key_tile(bf16* stages, const Args& a, const Heads& h,
                                                  Range keys, Body body) {
    constexpr int kTileElems = tile_elems<HD>(kKeys);
    const auto buffer = [&](int tile) { return stages + (tile % kBuffers) * 2 * kTileElems; };
    const auto stage = [&](int tile) {
        bf16* k_tile = buffer(tile);
        const Range tile_keys{keys.begin + tile * kKeys, keys.end};
        stage_rows_async<HD>(k_tile, kKeys, h.template key_rows<HD>(a, a.k, tile_keys));
        stage_rows_async<HD>(k_tile + kTileElems, kKeys,
                             h.template key_rows<HD>(a, a.v, tile_keys));
        commit_async();
    };
    for_each_staged_tile<kBuffers>(tiles::tile_count(keys.end - keys.begin, kKeys), stage,
                                   [&](int tile) {
                                       const bf16* k_tile = buffer(tile);
                                       body(k_tile, k_tile + kTileElems, keys.begin + tile * kKeys);
                                   });
}

// The block's (b, kv head) and rows, for the row-tiled kernels.
struct RowBlock {
    Heads heads;
    Range rows;
    Range keys;  // every key some row sees
};
__device__ __forceinline__ RowBlock row_block(const Args& a) {
    const int G = a.H / a.Hkv;
    const int n_row_tiles = tiles::tile_count(a.T * G, kRows);
    int block = static_cast<int>(blockIdx.x);
    const int tile = block % n_row_tiles;
    block /= n_row_tiles;
    RowBlock rb;
    rb.heads = {block / a.Hkv, block % a.Hkv, G};
    rb.rows = {tile * kRows, min(tile * kRows + kRows, a.T * G)};
    rb.keys = tiles::keys_of_queries(tiles::queries_of_rows(rb.rows, G), a.window, 0);
    return rb;
}

// The query (-1: none) of each of this lane's two accumulator rows (frag_row 0..7, 8..15) in
// the warp's 16 rows from `first_row`.
__device__ __forceinline__ void lane_queries(int (&t)[2], int first_row, int rows_end, int G) {
    const int r = first_row + lane_id() / 4;
    t[0] = r < rows_end ? r / G : -1;
    t[1] = r + 8 < rows_end ? (r + 8) / G : -1;
}

// Scores times scale * log2(e), -inf where the key is not seen: s[n][e] is row frag_row(e)
// (query t[e / 2]) and key first_key + 8 n + frag_col(e).
template <int N>
__device__ __forceinline__ void mask_scores(float (&s)[N / 8][4], const int (&t)[2], int first_key,
                                            const Args& a) {
#pragma unroll
    for (int n = 0; n < N / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int key = first_key + 8 * n + frag_col(e), q = t[e / 2];
            s[n][e] = q >= 0 && tiles::key_visible(q, key, a.window, 0) ? s[n][e] * a.scale_log2
                                                                        : -INFINITY;
        }
}

// Stores two adjacent outputs (lo at p[0]): fp32 as one float2 where p is 8-byte aligned (an F32
// view may start at any element: then one by one); bf16 one by one, as a BF16 view is only
// 2-byte aligned.
__device__ __forceinline__ void store_pair(float* p, float lo, float hi) {
    if (reinterpret_cast<uintptr_t>(p) % 8 == 0) {
        *reinterpret_cast<float2*>(p) = make_float2(lo, hi);
    } else {
        p[0] = lo;
        p[1] = hi;
    }
}
__device__ __forceinline__ void store_pair(bf16* p, float lo, float hi) {
    store_as(p, lo);
    store_as(p + 1, hi);
}

// ------------------------------------------------------------------------ kernels

// out [B, T, H, hd]: OutT is float, or bf16 for a BF16 out.
template <int HD, typename OutT>
__global__ void __launch_bounds__(kThreads) attention_forward_bf16_kernel(const Args a, OutT* out) {
    extern __shared__ uint4 shared_raw[];
    bf16* q_tile = reinterpret_cast<bf16*>(shared_raw);
    bf16* stages = q_tile + tile_elems<HD>(kRows);
    const RowBlock rb = row_block(a);
    const int first_row = rb.rows.begin + warp_id() * kWarpRows;
    stage_rows_async<HD>(q_tile, kRows, rb.heads.template query_rows<HD>(a, a.q, rb.rows));
    commit_async();  // waited for with the first key tile
    int t[2];
    lane_queries(t, first_row, rb.rows.end, rb.heads.G);

    float o[HD / 8][4] = {};
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};  // sum: this lane's
    const auto key_tile = [&](const bf16* k_tile, const bf16* v_tile, int first_key) {
        float s[kKeys / 8][4];
        multiply_rows<HD, kKeys>(s, q_tile, warp_id() * kWarpRows, k_tile, 0);
        mask_scores<kKeys>(s, t, first_key, a);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const TileBase tb = raise_row_max<kKeys>(s, row_max[half], half);
            float sum = 0.0f;
#pragma unroll
            for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
                for (int e = 2 * half; e < 2 * half + 2; ++e) {
                    s[n][e] = exp2f(s[n][e] - tb.base);
                    sum += s[n][e];
                }
            row_sum[half] = row_sum[half] * tb.rescale + sum;
#pragma unroll
            for (int d = 0; d < HD / 8; ++d) {
                o[d][2 * half] *= tb.rescale;
                o[d][2 * half + 1] *= tb.rescale;
            }
        }
        accumulate_weighted_rows<HD, kKeys>(o, s, v_tile, 0);
    };
    for_each_key_tile<HD, 2>(stages, a, rb.heads, rb.keys, key_tile);

#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const float l = quad_sum(row_sum[half]);
        if (t[half] < 0) continue;
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        const int64_t qi = rb.heads.query_index(a, first_row + lane_id() / 4 + 8 * half);
        OutT* dst = out + qi * a.hd;
#pragma unroll
        for (int d = 0; d < HD / 8; ++d) {
            const int col = 8 * d + frag_col(0);  // even, and hd is even: both or neither
            if (col < a.hd) store_pair(dst + col, o[d][2 * half] * inv, o[d][2 * half + 1] * inv);
        }
    }
}

// Per 64 rows: each row's log2-sum-exp2 and D (to global memory, for the dkdv kernel), then
// d_q += scale * bf16(dS) K.
template <int HD>
__global__ void __launch_bounds__(kThreads) attention_dq_bf16_kernel(const Args a) {
    extern __shared__ uint4 shared_raw[];
    bf16* q_tile = reinterpret_cast<bf16*>(shared_raw);
    bf16* do_tile = q_tile + tile_elems<HD>(kRows);
    bf16* stages = do_tile + tile_elems<HD>(kRows);
    const RowBlock rb = row_block(a);
    const int warp_row0 = warp_id() * kWarpRows, first_row = rb.rows.begin + warp_row0;
    stage_rows_async<HD>(q_tile, kRows, rb.heads.template query_rows<HD>(a, a.q, rb.rows));
    stage_rows_async<HD>(do_tile, kRows, rb.heads.template query_rows<HD>(a, a.d_out, rb.rows));
    commit_async();
    int t[2];
    lane_queries(t, first_row, rb.rows.end, rb.heads.G);

    // Walk 1: online max, sum of exponentials and sum of exp * dP, per row.
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {}, row_dot[2] = {};
    const auto stats_tile = [&](const bf16* k_tile, const bf16* v_tile, int first_key) {
        float s[kKeys / 8][4], dp[kKeys / 8][4];
        multiply_rows<HD, kKeys>(s, q_tile, warp_row0, k_tile, 0);
        multiply_rows<HD, kKeys>(dp, do_tile, warp_row0, v_tile, 0);
        mask_scores<kKeys>(s, t, first_key, a);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const TileBase tb = raise_row_max<kKeys>(s, row_max[half], half);
            float sum = 0.0f, dot = 0.0f;
#pragma unroll
            for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
                for (int e = 2 * half; e < 2 * half + 2; ++e) {
                    const float p = exp2f(s[n][e] - tb.base);
                    sum += p;
                    dot += p * dp[n][e];
                }
            row_sum[half] = row_sum[half] * tb.rescale + sum;
            row_dot[half] = row_dot[half] * tb.rescale + dot;
        }
    };
    for_each_key_tile<HD, dq_key_buffers<HD>()>(stages, a, rb.heads, rb.keys, stats_tile);
    float lse2[2], delta[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const float l = quad_sum(row_sum[half]), dot = quad_sum(row_dot[half]);
        lse2[half] = l > 0.0f ? row_max[half] + log2f(l) : 0.0f;
        delta[half] = l > 0.0f ? dot / l : 0.0f;
        if (t[half] >= 0 && lane_id() % 4 == 0) {
            const int64_t qi = rb.heads.query_index(a, first_row + lane_id() / 4 + 8 * half);
            a.lse2[qi] = lse2[half];
            a.delta[qi] = delta[half];
        }
    }

    // Walk 2: dS and d_q. Q and dO are still in shared memory.
    float dq[HD / 8][4] = {};
    const auto dq_tile = [&](const bf16* k_tile, const bf16* v_tile, int first_key) {
        float s[kKeys / 8][4], ds[kKeys / 8][4];
        multiply_rows<HD, kKeys>(s, q_tile, warp_row0, k_tile, 0);
        multiply_rows<HD, kKeys>(ds, do_tile, warp_row0, v_tile, 0);
        mask_scores<kKeys>(s, t, first_key, a);
#pragma unroll
        for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float p = exp2f(s[n][e] - lse2[e / 2]);
                ds[n][e] = p * (ds[n][e] - delta[e / 2]);
            }
        accumulate_weighted_rows<HD, kKeys>(dq, ds, k_tile, 0);
    };
    for_each_key_tile<HD, dq_key_buffers<HD>()>(stages, a, rb.heads, rb.keys, dq_tile);

#pragma unroll
    for (int half = 0; half < 2; ++half) {
        if (t[half] < 0) continue;
        const int64_t qi = rb.heads.query_index(a, first_row + lane_id() / 4 + 8 * half);
        float* dst = a.d_q + qi * a.hd;
#pragma unroll
        for (int d = 0; d < HD / 8; ++d) {
            const int col = 8 * d + frag_col(0);
            if (col < a.hd) {
                float2 v = *reinterpret_cast<float2*>(dst + col);
                v.x += a.scale * dq[d][2 * half];
                v.y += a.scale * dq[d][2 * half + 1];
                *reinterpret_cast<float2*>(dst + col) = v;
            }
        }
    }
}

// Per 64 keys (16 per warp, as MMA rows): over the rows that see them, 32 at a time,
// d_v += bf16(P)^T dO and d_k += scale * bf16(dS)^T Q.
template <int HD>
__global__ void __launch_bounds__(kThreads) attention_dkdv_bf16_kernel(const Args a) {
    constexpr int kRowTileElems = tile_elems<HD>(kDkdvRows);
    extern __shared__ uint4 shared_raw[];
    bf16* k_tile = reinterpret_cast<bf16*>(shared_raw);
    bf16* v_tile = k_tile + tile_elems<HD>(kKeys);
    bf16* stages = v_tile + tile_elems<HD>(kKeys);                            // 2 x (Q, dO)
    float* row_stats = reinterpret_cast<float*>(stages + 4 * kRowTileElems);  // 2 x (lse2, D)

    const int G = a.H / a.Hkv;
    const int n_key_tiles = tiles::tile_count(a.T, kKeys);
    int block = static_cast<int>(blockIdx.x);
    const int key_tile = block % n_key_tiles;
    block /= n_key_tiles;
    const Heads h{block / a.Hkv, block % a.Hkv, G};
    const Range keys{key_tile * kKeys, min(key_tile * kKeys + kKeys, a.T)};
    const Range rows = tiles::rows_of_queries(tiles::queries_of_keys(keys, a.T, a.window), G);

    stage_rows_async<HD>(k_tile, kKeys, h.template key_rows<HD>(a, a.k, keys));
    stage_rows_async<HD>(v_tile, kKeys, h.template key_rows<HD>(a, a.v, keys));
    const auto stage = [&](int tile) {
        bf16* q_stage = stages + (tile % 2) * 2 * kRowTileElems;
        const int row0 = rows.begin + tile * kDkdvRows;
        const Range tile_rows{row0, rows.end};
        stage_rows_async<HD>(q_stage, kDkdvRows, h.template query_rows<HD>(a, a.q, tile_rows));
        stage_rows_async<HD>(q_stage + kRowTileElems, kDkdvRows,
                             h.template query_rows<HD>(a, a.d_out, tile_rows));
        float* stats = row_stats + (tile % 2) * 2 * kDkdvRows;
        for (int i = static_cast<int>(threadIdx.x); i < kDkdvRows; i += kThreads) {
            const bool in = row0 + i < rows.end;
            const int64_t qi = in ? h.query_index(a, row0 + i) : 0;
            stats[i] = in ? a.lse2[qi] : 0.0f;
            stats[kDkdvRows + i] = in ? a.delta[qi] : 0.0f;
        }
        commit_async();
    };

    // This lane's two keys (MMA rows frag_row 0..7 and 8..15 of the warp's 16).
    const int first_key = keys.begin + warp_id() * kWarpRows;
    const int my_key[2] = {first_key + lane_id() / 4, first_key + lane_id() / 4 + 8};
    float dk[HD / 8][4] = {}, dv[HD / 8][4] = {};
    // The first stage's group carries K and V's copies too.
    const auto row_tile = [&](int tile) {
        const bf16* q_stage = stages + (tile % 2) * 2 * kRowTileElems;
        const bf16* do_stage = q_stage + kRowTileElems;
        const float* lse2 = row_stats + (tile % 2) * 2 * kDkdvRows;
        const float* delta = lse2 + kDkdvRows;
        const int row0 = rows.begin + tile * kDkdvRows;
        float s[kDkdvRows / 8][4], ds[kDkdvRows / 8][4];
        multiply_rows<HD, kDkdvRows>(s, k_tile, warp_id() * kWarpRows, q_stage, 0);
        multiply_rows<HD, kDkdvRows>(ds, v_tile, warp_id() * kWarpRows, do_stage, 0);
#pragma unroll
        for (int c = 0; c < kDkdvRows / 8; ++c)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int i = 8 * c + frag_col(e), r = row0 + i;  // the row: a column here
                const bool seen = r < rows.end && my_key[e / 2] < keys.end &&
                                  tiles::key_visible(r / G, my_key[e / 2], a.window, 0);
                const float p = seen ? exp2f(s[c][e] * a.scale_log2 - lse2[i]) : 0.0f;
                s[c][e] = p;
                ds[c][e] = p * (ds[c][e] - delta[i]);
            }
        accumulate_weighted_rows<HD, kDkdvRows>(dv, s, do_stage, 0);
        accumulate_weighted_rows<HD, kDkdvRows>(dk, ds, q_stage, 0);
    };
    for_each_staged_tile<2>(tiles::tile_count(rows.end - rows.begin, kDkdvRows), stage, row_tile);
    wait_async<0>();  // no row sees these keys: K and V's copies still have to land

#pragma unroll
    for (int half = 0; half < 2; ++half) {
        if (my_key[half] >= keys.end) continue;
        const int64_t off = h.key_index(a, my_key[half]) * a.hd;
#pragma unroll
        for (int d = 0; d < HD / 8; ++d) {
            const int col = 8 * d + frag_col(0);
            if (col < a.hd) {
                float2 k2 = *reinterpret_cast<float2*>(a.d_k + off + col);
                float2 v2 = *reinterpret_cast<float2*>(a.d_v + off + col);
                k2.x += a.scale * dk[d][2 * half];
                k2.y += a.scale * dk[d][2 * half + 1];
                v2.x += dv[d][2 * half];
                v2.y += dv[d][2 * half + 1];
                *reinterpret_cast<float2*>(a.d_k + off + col) = k2;
                *reinterpret_cast<float2*>(a.d_v + off + col) = v2;
            }
        }
    }
}

}  // namespace tmx::cuda::attention_bf16

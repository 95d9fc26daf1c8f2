// CUDA causal sliding-window GQA attention (CPU twin: backends/cpu/attention.cpp): the forward
// over a sequence or over a chunk plus its rolling KV cache, the cache write, and the
// backward. fp32 flash-style kernels: scores live in registers one 32 x 32 tile at a time, no
// T x T matrix is ever in memory. In bf16 precision (attention_in_bf16), attention() and its
// backward run on tensor cores instead (attention_bf16.cuh), and only there may attention()'s
// out be BF16; the cached forward stays fp32.
//
// How the work is laid out (the same in every kernel):
//   * A block (4 warps) works for one (sequence b, kv head). The G = H / Hkv query heads that
//     read the kv head are served together: their queries are flattened into rows,
//     row = t * G + g (attention_tiles.h), so every key tile staged in shared memory serves
//     all of them.
//   * Tiles are 32 rows x 32 keys. For the dot products (q . k, dO . v) each lane owns one
//     element of the 32-wide axis and each warp 8 elements of the other, so every dot product
//     is one lane's loop over the head dims in a fixed order.
//   * For the products with the probabilities (P V, dS K, P^T dO, dS^T Q) each lane owns dims
//     lane + 32 m (m < DPL) of its warp's 8 rows; a row's 32 weights come from the lanes that
//     computed them, through a per-warp slice of shared memory (accumulate_tile).
//   * Any head_dim: tiles hold a chunk of DC = 32 * DPL dims (DPL 1, 2 or 4 by head_dim); the
//     dot products loop over every chunk; an output wider than DC (head_dim > 128) is split
//     over blocks, one per chunk, each recomputing the scores.
// Deterministic: every sum has a fixed order, each output element has one writer, no atomics.
//
// Backward. The seam passes no output or log-sum-exp, so a stats kernel first recomputes, per
// query, lse = log sum_j exp(s_j) and D = sum_j P_j (dO . v_j) (= dO . O) into scratch. Then
// with P_ij = exp(s_ij - lse_i) and dS_ij = P_ij (dO_i . v_j - D_i) scale:
//   dQ: per (b, kv head, row tile), dq_i += sum_j dS_ij k_j over the keys the rows see;
//   dK, dV: per (b, kv head, key tile), dk_j += sum_i dS_ij q_i and dv_j += sum_i P_ij dO_i over
//   the rows (all G heads) that see the tile.
//
// Cached forward. Keys are counted from the chunk's first position (attention_tiles.h): key
// r < 0 is read from cache slot (start + r) mod S. When there are fewer blocks than SMs
// (decode), each block's keys are split into slices over several blocks (flash-decoding); each
// slice writes its unnormalised output, row max and sum, and a merge kernel combines them.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "backends/cuda/attention_bf16.cuh"
#include "backends/cuda/attention_tiles.h"
#include "backends/cuda/cuda_common.cuh"

namespace tmx {
namespace {

namespace tiles = cuda::attention_tiles;
namespace bf16_attention = cuda::attention_bf16;
using tiles::Range;

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / cuda::kWarp;  // 4
constexpr int kTile = 32;                       // rows per row tile, keys per key tile
constexpr int kRowsPerWarp = kTile / kWarps;    // 8
static_assert(kTile == cuda::kWarp, "one lane per element of a tile's 32-wide axis");
// Blocks per SM the kernels are built for: allows ptxas up to 255 registers a thread. With the
// thread count alone it held them to 128 and spilled; they use ~120-170 (so 2-3 blocks an SM).
constexpr int kMinBlocks = 2;

// Shared memory above this needs the kernel's opt-in attribute.
constexpr size_t kDefaultSharedBytes = 48 * 1024;

// Head dims per lane (a chunk is 32 * DPL dims): the smallest that covers head_dim, at most 4.
int dims_per_lane(int hd) {
    return hd <= 32 ? 1 : hd <= 64 ? 2 : 4;
}

// Calls f(std::integral_constant<int, DPL>) for the runtime dpl.
template <class F>
void with_dims_per_lane(int dpl, F&& f) {
    switch (dpl) {
        case 1:
            f(std::integral_constant<int, 1>{});
            break;
        case 2:
            f(std::integral_constant<int, 2>{});
            break;
        default:
            f(std::integral_constant<int, 4>{});
            break;
    }
}

// ------------------------------------------------------------------------ device helpers

__device__ __forceinline__ int lane_id() {
    return static_cast<int>(threadIdx.x) % cuda::kWarp;
}
__device__ __forceinline__ int warp_id() {
    return static_cast<int>(threadIdx.x) / cuda::kWarp;
}

__device__ __forceinline__ const float* shfl_ptr(const float* p, int src_lane) {
    return reinterpret_cast<const float*>(
        __shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(p), src_lane));
}

// Copies dims [d0, d0 + 32 * DPL) of 32 rows into tile[32][ld]. Lane l of every warp holds the
// source of row l (its dim 0; nullptr: a row outside the data). Missing rows and dims past hd
// read as 0, so that no lane ever multiplies garbage. Warp w copies rows w, w + 4, ...: each
// row is one coalesced read, each write a conflict-free run of 32 banks.
template <int DPL>
__device__ __forceinline__ void stage_tile(float* tile, int ld, const float* my_row, int d0,
                                           int hd) {
    const int lane = lane_id();
    for (int r = warp_id(); r < kTile; r += kWarps) {
        const float* src = shfl_ptr(my_row, r);
#pragma unroll
        for (int m = 0; m < DPL; ++m) {
            const int c = lane + cuda::kWarp * m, d = d0 + c;
            tile[r * ld + c] = (src != nullptr && d < hd) ? src[d] : 0.0f;
        }
    }
}

// acc[i] += sum_{d < n} a[(8 w + i) * lda + d] * b[lane * ldb + d]: the dot products of the
// warp's 8 rows of `a` (every lane reads the same address: a broadcast) with the lane's row of
// `b` (ldb odd: the 32 lanes hit 32 different banks). `a` is read 4 dims at a time (lda % 4 == 0
// and the tile 16-byte aligned), so n is rounded up to a multiple of 4: tiles hold 0 past hd.
__device__ __forceinline__ void dot_tile(float (&acc)[kRowsPerWarp], const float* a, int lda,
                                         const float* b, int ldb, int n) {
    const float* a_rows = a + warp_id() * kRowsPerWarp * lda;
    const float* b_row = b + lane_id() * ldb;
    const int n4 = (n + 3) & ~3;
#pragma unroll 1
    for (int d = 0; d < n4; d += 4) {
        const float b0 = b_row[d], b1 = b_row[d + 1], b2 = b_row[d + 2], b3 = b_row[d + 3];
#pragma unroll
        for (int i = 0; i < kRowsPerWarp; ++i) {
            const float4 x = *reinterpret_cast<const float4*>(a_rows + i * lda + d);
            acc[i] += x.x * b0;
            acc[i] += x.y * b1;
            acc[i] += x.z * b2;
            acc[i] += x.w * b3;
        }
    }
}

// Floats of shared memory per warp for accumulate_tile's weights: [32 lanes][8 rows].
constexpr int kWeightFloats = kTile * kRowsPerWarp;
static_assert(kRowsPerWarp == 8, "accumulate_tile reads a lane's weights as two float4");

// acc[i][m] += sum_{j < 32} w_j[i] * tile[j * ld + lane + 32 m], where w_j[i] is lane j's w[i]:
// row i of the warp weighs the 32 rows of `tile` (the tile's rows are the lanes' axis of the
// preceding dot products). The weights go through the warp's slice of shared memory, w_tile
// (16-byte aligned), so that each j reads all 8 of them in two broadcasts.
template <int DPL>
__device__ __forceinline__ void accumulate_tile(float (&acc)[kRowsPerWarp][DPL],
                                                const float (&w)[kRowsPerWarp], float* w_tile,
                                                const float* tile, int ld) {
    const int lane = lane_id();
    __syncwarp();  // the warp's previous accumulate_tile is done reading w_tile
    float4* mine = reinterpret_cast<float4*>(w_tile + lane * kRowsPerWarp);
    mine[0] = make_float4(w[0], w[1], w[2], w[3]);
    mine[1] = make_float4(w[4], w[5], w[6], w[7]);
    __syncwarp();
#pragma unroll 2
    for (int j = 0; j < kTile; ++j) {
        const float4 w0 = *reinterpret_cast<const float4*>(w_tile + j * kRowsPerWarp);
        const float4 w1 = *reinterpret_cast<const float4*>(w_tile + j * kRowsPerWarp + 4);
        const float wj[kRowsPerWarp] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
        float x[DPL];
#pragma unroll
        for (int m = 0; m < DPL; ++m) x[m] = tile[j * ld + lane + cuda::kWarp * m];
#pragma unroll
        for (int i = 0; i < kRowsPerWarp; ++i)
#pragma unroll
            for (int m = 0; m < DPL; ++m) acc[i][m] += wj[i] * x[m];
    }
}

// One online-softmax step for a row: folds this tile's scaled score `score` (-inf where the
// key is not visible; one per lane) into the running max `mx`, and returns the factor that
// rescales what was accumulated under the old max. p = exp(score - new max).
__device__ __forceinline__ float online_softmax_step(float score, float& mx, float& p) {
    const float new_max = fmaxf(mx, cuda::warp_max(score));
    // No key seen yet (new_max = -inf): everything stays 0, without forming inf - inf.
    const float base = new_max == -INFINITY ? 0.0f : new_max;
    const float rescale = expf(mx - base);
    p = expf(score - base);
    mx = new_max;
    return rescale;
}

// A block's rows: tile `row_tile` of the n_rows = T * G rows of (b, kvh).
struct RowTile {
    Range rows;     // [row0, row_end)
    Range queries;  // the queries of those rows
};

__device__ __forceinline__ RowTile row_tile_at(int row_tile, int n_rows, int G) {
    const Range rows{row_tile * kTile, min(row_tile * kTile + kTile, n_rows)};
    return {rows, tiles::queries_of_rows(rows, G)};
}

// Index of query row `row` of (b, kvh) in a per-query [B, T, H] array; times hd, the offset of
// its first element in a [B, T, H, hd] tensor.
__device__ __forceinline__ int64_t query_index(int b, int kvh, int row, int T, int H, int G) {
    return (static_cast<int64_t>(b) * T + row / G) * H + kvh * G + row % G;
}

// ------------------------------------------------------------------------ forward

struct ForwardArgs {
    const float *q, *k, *v;          // q [B, T, H, hd]; k, v [B, T, Hkv, hd]
    const float *k_cache, *v_cache;  // [B, S, Hkv, hd]; nullptr without a cache
    const int32_t* start;            // [B]; nullptr without a cache
    float* out;                      // [B, T, H, hd]
    // With n_slices > 1, slice s writes its unnormalised output, row max and row sum (of
    // exp(score - max)) here instead of `out`: [n_slices, B*T*H, hd] and [n_slices, B*T*H].
    float *part_out, *part_max, *part_sum;
    int* status;
    int B, T, H, Hkv, hd, S;
    int window;  // 0 = unlimited (tiles::effective_window)
    float scale;
    int n_row_tiles, n_slices, n_chunks;
};

// Shared memory of the forward: the rows' queries [32][DC] (read as broadcasts), the key tile
// [32][DC + 1] (one row per lane: padded), the value tile [32][DC], the warps' weights.
template <int DPL>
constexpr size_t forward_shared_bytes() {
    constexpr int DC = cuda::kWarp * DPL;
    return sizeof(float) * (kTile * (DC + (DC + 1) + DC) + kWarps * kWeightFloats);
}

// One block per (b, kvh, row tile, key slice, head-dim chunk).
template <int DPL>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    attention_forward_kernel(const ForwardArgs a) {
    constexpr int DC = cuda::kWarp * DPL;
    extern __shared__ __align__(16) float smem[];
    float* q_tile = smem;
    float* k_tile = q_tile + kTile * DC;
    float* v_tile = k_tile + kTile * (DC + 1);
    float* w_tile = v_tile + kTile * DC + warp_id() * kWeightFloats;

    const int lane = lane_id(), warp = warp_id();
    int64_t block = blockIdx.x;
    const int chunk = static_cast<int>(block % a.n_chunks);
    block /= a.n_chunks;
    const int slice = static_cast<int>(block % a.n_slices);
    block /= a.n_slices;
    const int row_tile = static_cast<int>(block % a.n_row_tiles);
    block /= a.n_row_tiles;
    const int kvh = static_cast<int>(block % a.Hkv);
    const int b = static_cast<int>(block / a.Hkv);

    // Keys before the chunk come from the cache: lo = -(cached positions), slot0 = start mod S.
    int lo = 0, slot0 = 0;
    if (a.start != nullptr) {
        const int start = a.start[b];
        if (start < 0) {  // the whole block leaves: its rows stay unwritten
            if (threadIdx.x == 0) cuda::report_error(a.status, cuda::kBadPosition, start, 0);
            return;
        }
        lo = -min(start, a.S);
        slot0 = start % a.S;
    }

    const int G = a.H / a.Hkv;
    const RowTile rt = row_tile_at(row_tile, a.T * G, G);
    const Range keys = tiles::keys_of_queries(rt.queries, a.window, lo);
    const Range my_tiles =
        tiles::slice_tiles(tiles::tile_count(keys.end - keys.begin, kTile), a.n_slices, slice);

    // Lane l stages row row0 + l of the queries.
    const float* my_q = nullptr;
    if (rt.rows.begin + lane < rt.rows.end)
        my_q = a.q + query_index(b, kvh, rt.rows.begin + lane, a.T, a.H, G) * a.hd;
    // The warp's rows: their query (lo - 1 past the end: sees no key).
    const int first_row = rt.rows.begin + warp * kRowsPerWarp;
    const bool warp_has_rows = first_row < rt.rows.end;
    int t_of[kRowsPerWarp];
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i)
        t_of[i] = first_row + i < rt.rows.end ? (first_row + i) / G : lo - 1;

    float mx[kRowsPerWarp], sum[kRowsPerWarp], acc[kRowsPerWarp][DPL];
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
        mx[i] = -INFINITY;
        sum[i] = 0.0f;  // this lane's share; the row's sum is the warp's total
#pragma unroll
        for (int m = 0; m < DPL; ++m) acc[i][m] = 0.0f;
    }

    for (int tile = my_tiles.begin; tile < my_tiles.end; ++tile) {
        // Lane l stages key r = k0 + l: a token of the chunk (r >= 0) or a cache slot.
        const int r = keys.begin + tile * kTile + lane;
        const float *my_k = nullptr, *my_v = nullptr;
        if (r >= 0 && r < a.T) {
            const int64_t off = ((static_cast<int64_t>(b) * a.T + r) * a.Hkv + kvh) * a.hd;
            my_k = a.k + off;
            my_v = a.v + off;
        } else if (r < 0 && r >= lo) {
            const int slot = tiles::cache_slot(slot0, r, a.S);
            const int64_t off = ((static_cast<int64_t>(b) * a.S + slot) * a.Hkv + kvh) * a.hd;
            my_k = a.k_cache + off;
            my_v = a.v_cache + off;
        }

        float s[kRowsPerWarp] = {};
        for (int step = 0; step < a.n_chunks; ++step) {
            const int cc = tiles::chunk_at_step(step, chunk, a.n_chunks);
            __syncthreads();  // every warp is done with the tiles of the previous step
            // With one chunk the queries stay in shared memory from the first tile on.
            if (a.n_chunks > 1 || tile == my_tiles.begin)
                stage_tile<DPL>(q_tile, DC, my_q, cc * DC, a.hd);
            stage_tile<DPL>(k_tile, DC + 1, my_k, cc * DC, a.hd);
            if (step == 0) stage_tile<DPL>(v_tile, DC, my_v, chunk * DC, a.hd);
            __syncthreads();
            if (warp_has_rows) dot_tile(s, q_tile, DC, k_tile, DC + 1, min(DC, a.hd - cc * DC));
        }
        if (warp_has_rows) {
            float p[kRowsPerWarp];
#pragma unroll
            for (int i = 0; i < kRowsPerWarp; ++i) {
                const float score =
                    tiles::key_visible(t_of[i], r, a.window, lo) ? s[i] * a.scale : -INFINITY;
                const float rescale = online_softmax_step(score, mx[i], p[i]);
                sum[i] = sum[i] * rescale + p[i];
#pragma unroll
                for (int m = 0; m < DPL; ++m) acc[i][m] *= rescale;
            }
            accumulate_tile<DPL>(acc, p, w_tile, v_tile, DC);
        }
    }

    if (!warp_has_rows) return;  // no barrier follows
    const int64_t n_queries = static_cast<int64_t>(a.B) * a.T * a.H;
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
        const float row_sum = cuda::warp_sum(sum[i]);  // every lane: before the row check
        if (first_row + i >= rt.rows.end) continue;
        const int64_t qi = query_index(b, kvh, first_row + i, a.T, a.H, G);
        if (a.n_slices == 1) {
            // Every row sees at least its own key: row_sum >= 1.
            const float inv = 1.0f / row_sum;
#pragma unroll
            for (int m = 0; m < DPL; ++m) {
                const int d = chunk * DC + lane + cuda::kWarp * m;
                if (d < a.hd) a.out[qi * a.hd + d] = acc[i][m] * inv;
            }
        } else {
            // An empty slice writes max -inf, sum 0 and zeros: the merge weighs it 0.
            const int64_t part = slice * n_queries + qi;
#pragma unroll
            for (int m = 0; m < DPL; ++m) {
                const int d = chunk * DC + lane + cuda::kWarp * m;
                if (d < a.hd) a.part_out[part * a.hd + d] = acc[i][m];
            }
            if (lane == 0 && chunk == 0) {  // the same in every chunk's block
                a.part_max[part] = mx[i];
                a.part_sum[part] = row_sum;
            }
        }
    }
}

// out = sum_s exp(max_s - M) part_out_s / sum_s exp(max_s - M) sum_s, M = max_s max_s: the
// slices of attention_forward_kernel combined in slice order. One thread per output element.
__global__ void attention_merge_kernel(const float* part_out, const float* part_max,
                                       const float* part_sum, int n_slices, int64_t n_queries,
                                       int hd, const int32_t* start, int64_t queries_per_seq,
                                       float* out) {
    const int64_t n = n_queries * hd;
    for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
         e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t qi = e / hd, d = e % hd;
        // A negative start was reported by the forward kernel, which wrote nothing.
        if (start != nullptr && start[qi / queries_per_seq] < 0) continue;
        float m = -INFINITY;
        for (int s = 0; s < n_slices; ++s) m = fmaxf(m, part_max[s * n_queries + qi]);
        float total = 0.0f, o = 0.0f;
        for (int s = 0; s < n_slices; ++s) {
            const int64_t part = s * n_queries + qi;
            const float w = expf(part_max[part] - m);  // 0 for an empty slice
            total += part_sum[part] * w;
            o += part_out[part * hd + d] * w;
        }
        out[e] = o / total;
    }
}

// ------------------------------------------------------------------------ backward

struct BackwardArgs {
    const float *q, *k, *v, *d_out;  // q, d_out [B, T, H, hd]; k, v [B, T, Hkv, hd]
    float *d_q, *d_k, *d_v;          // accumulated into
    float *lse, *delta;              // [B, T, H]: written by the stats kernel, read by the others
    int B, T, H, Hkv, hd;
    int window;  // 0 = unlimited
    float scale;
    int n_row_tiles, n_key_tiles, n_chunks;
};

// Shared memory of the backward kernels: two [32][DC] tiles read as broadcasts, two
// [32][DC + 1] tiles read one row per lane, the warps' weights (unused by the stats kernel).
template <int DPL>
constexpr size_t backward_shared_bytes() {
    constexpr int DC = cuda::kWarp * DPL;
    return sizeof(float) * (kTile * (2 * DC + 2 * (DC + 1)) + kWarps * kWeightFloats);
}

// The per-block setup the stats and dQ kernels share: the row tile of (b, kvh), the keys its
// queries see, the sources of the lane's query row.
struct QueryBlock {
    int b, kvh, G;
    RowTile rt;
    Range keys;
    const float *my_q, *my_do;
    int first_row;  // of the warp
    bool warp_has_rows;
};

__device__ __forceinline__ QueryBlock query_block(const BackwardArgs& a, int64_t block) {
    QueryBlock qb;
    const int row_tile = static_cast<int>(block % a.n_row_tiles);
    block /= a.n_row_tiles;
    qb.kvh = static_cast<int>(block % a.Hkv);
    qb.b = static_cast<int>(block / a.Hkv);
    qb.G = a.H / a.Hkv;
    qb.rt = row_tile_at(row_tile, a.T * qb.G, qb.G);
    qb.keys = tiles::keys_of_queries(qb.rt.queries, a.window, 0);
    const int row = qb.rt.rows.begin + lane_id();
    qb.my_q = qb.my_do = nullptr;
    if (row < qb.rt.rows.end) {
        const int64_t off = query_index(qb.b, qb.kvh, row, a.T, a.H, qb.G) * a.hd;
        qb.my_q = a.q + off;
        qb.my_do = a.d_out + off;
    }
    qb.first_row = qb.rt.rows.begin + warp_id() * kRowsPerWarp;
    qb.warp_has_rows = qb.first_row < qb.rt.rows.end;
    return qb;
}

// Element offset of key r of (b, kvh) in a [B, T, Hkv, hd] tensor; -1 past the chunk.
__device__ __forceinline__ int64_t key_offset(const BackwardArgs& a, int b, int kvh, int r) {
    return r < a.T ? ((static_cast<int64_t>(b) * a.T + r) * a.Hkv + kvh) * a.hd : -1;
}

// Scores of the block's rows against key tile `tile` into s (q . k) and dp (dO . v), lane =
// key: stages the query-side tiles (once when there is one chunk) and the key-side tiles
// chunk by chunk, ending with chunk `chunk`, which stays in shared memory. Called by every
// thread. Returns the lane's key.
template <int DPL>
__device__ __forceinline__ int score_key_tile(const BackwardArgs& a, const QueryBlock& qb, int tile,
                                              int chunk, float* q_tile, float* o_tile,
                                              float* k_tile, float* v_tile,
                                              float (&s)[kRowsPerWarp], float (&dp)[kRowsPerWarp]) {
    constexpr int DC = cuda::kWarp * DPL;
    const int r = qb.keys.begin + tile * kTile + lane_id();
    const int64_t off = key_offset(a, qb.b, qb.kvh, r);
    const float* my_k = off >= 0 ? a.k + off : nullptr;
    const float* my_v = off >= 0 ? a.v + off : nullptr;
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) s[i] = dp[i] = 0.0f;
    for (int step = 0; step < a.n_chunks; ++step) {
        const int cc = tiles::chunk_at_step(step, chunk, a.n_chunks);
        __syncthreads();  // every warp is done with the tiles of the previous step
        if (a.n_chunks > 1 || tile == 0) {
            stage_tile<DPL>(q_tile, DC, qb.my_q, cc * DC, a.hd);
            stage_tile<DPL>(o_tile, DC, qb.my_do, cc * DC, a.hd);
        }
        stage_tile<DPL>(k_tile, DC + 1, my_k, cc * DC, a.hd);
        stage_tile<DPL>(v_tile, DC + 1, my_v, cc * DC, a.hd);
        __syncthreads();
        if (qb.warp_has_rows) {
            const int n = min(DC, a.hd - cc * DC);
            dot_tile(s, q_tile, DC, k_tile, DC + 1, n);
            dot_tile(dp, o_tile, DC, v_tile, DC + 1, n);
        }
    }
    return r;
}

// Pass 1 of the backward: per query, lse = max + log(sum exp(score - max)) and
// D = sum_j P_j (dO . v_j), with the online softmax of the forward (D rescaled like the sum).
// One block per (b, kvh, row tile); shared memory: queries and dO [32][DC] (broadcasts), keys
// and values [32][DC + 1] (one row per lane).
template <int DPL>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    attention_stats_kernel(const BackwardArgs a) {
    constexpr int DC = cuda::kWarp * DPL;
    extern __shared__ __align__(16) float smem[];
    float* q_tile = smem;
    float* o_tile = q_tile + kTile * DC;
    float* k_tile = o_tile + kTile * DC;
    float* v_tile = k_tile + kTile * (DC + 1);

    const QueryBlock qb = query_block(a, blockIdx.x);
    int t_of[kRowsPerWarp];
    float mx[kRowsPerWarp], sum[kRowsPerWarp], pdp[kRowsPerWarp];
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
        const int row = qb.first_row + i;
        t_of[i] = row < qb.rt.rows.end ? row / qb.G : -1;
        mx[i] = -INFINITY;
        sum[i] = pdp[i] = 0.0f;  // lane shares
    }

    const int n_tiles = tiles::tile_count(qb.keys.end - qb.keys.begin, kTile);
    for (int tile = 0; tile < n_tiles; ++tile) {
        float s[kRowsPerWarp], dp[kRowsPerWarp];
        const int r = score_key_tile<DPL>(a, qb, tile, 0, q_tile, o_tile, k_tile, v_tile, s, dp);
        if (!qb.warp_has_rows) continue;
#pragma unroll
        for (int i = 0; i < kRowsPerWarp; ++i) {
            const float score =
                tiles::key_visible(t_of[i], r, a.window, 0) ? s[i] * a.scale : -INFINITY;
            float p;
            const float rescale = online_softmax_step(score, mx[i], p);
            sum[i] = sum[i] * rescale + p;
            pdp[i] = pdp[i] * rescale + p * dp[i];
        }
    }

    if (!qb.warp_has_rows) return;  // no barrier follows
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
        const float row_sum = cuda::warp_sum(sum[i]), row_pdp = cuda::warp_sum(pdp[i]);
        if (qb.first_row + i >= qb.rt.rows.end || lane_id() != 0) continue;
        const int64_t qi = query_index(qb.b, qb.kvh, qb.first_row + i, a.T, a.H, qb.G);
        a.lse[qi] = mx[i] + logf(row_sum);
        a.delta[qi] = row_pdp / row_sum;
    }
}

// dQ: one block per (b, kvh, row tile, head-dim chunk), the stats kernel's loop with the
// probabilities from lse: dq_i += sum_j dS_ij k_j (dS from the key tile's lanes, k from the
// chunk of keys left in shared memory).
template <int DPL>
__global__ void __launch_bounds__(kThreads, kMinBlocks) attention_dq_kernel(const BackwardArgs a) {
    constexpr int DC = cuda::kWarp * DPL;
    extern __shared__ __align__(16) float smem[];
    float* q_tile = smem;
    float* o_tile = q_tile + kTile * DC;
    float* k_tile = o_tile + kTile * DC;
    float* v_tile = k_tile + kTile * (DC + 1);
    float* w_tile = v_tile + kTile * (DC + 1) + warp_id() * kWeightFloats;

    const int chunk = static_cast<int>(blockIdx.x % a.n_chunks);
    const QueryBlock qb = query_block(a, blockIdx.x / a.n_chunks);
    const int lane = lane_id();
    int t_of[kRowsPerWarp];
    float lse[kRowsPerWarp], delta[kRowsPerWarp], acc[kRowsPerWarp][DPL];
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
        const int row = qb.first_row + i;
        const bool valid = row < qb.rt.rows.end;
        const int64_t qi = valid ? query_index(qb.b, qb.kvh, row, a.T, a.H, qb.G) : 0;
        t_of[i] = valid ? row / qb.G : -1;
        lse[i] = valid ? a.lse[qi] : 0.0f;
        delta[i] = valid ? a.delta[qi] : 0.0f;
#pragma unroll
        for (int m = 0; m < DPL; ++m) acc[i][m] = 0.0f;
    }

    const int n_tiles = tiles::tile_count(qb.keys.end - qb.keys.begin, kTile);
    for (int tile = 0; tile < n_tiles; ++tile) {
        float s[kRowsPerWarp], dp[kRowsPerWarp];
        const int r =
            score_key_tile<DPL>(a, qb, tile, chunk, q_tile, o_tile, k_tile, v_tile, s, dp);
        if (!qb.warp_has_rows) continue;
        float ds[kRowsPerWarp];
#pragma unroll
        for (int i = 0; i < kRowsPerWarp; ++i) {
            const float p =
                tiles::key_visible(t_of[i], r, a.window, 0) ? expf(s[i] * a.scale - lse[i]) : 0.0f;
            ds[i] = p * (dp[i] - delta[i]) * a.scale;
        }
        accumulate_tile<DPL>(acc, ds, w_tile, k_tile, DC + 1);
    }

    if (!qb.warp_has_rows) return;
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
        if (qb.first_row + i >= qb.rt.rows.end) continue;
        const int64_t qi = query_index(qb.b, qb.kvh, qb.first_row + i, a.T, a.H, qb.G);
#pragma unroll
        for (int m = 0; m < DPL; ++m) {
            const int d = chunk * DC + lane + cuda::kWarp * m;
            if (d < a.hd) a.d_q[qi * a.hd + d] += acc[i][m];
        }
    }
}

// dK, dV: one block per (b, kvh, key tile, head-dim chunk). Each warp owns 8 of the tile's
// keys; the lanes run over tiles of 32 rows (every query head of the group) that see the key
// tile: s and dp with lane = row, then dk_j += sum_i dS_ij q_i and dv_j += sum_i P_ij dO_i.
// Shared memory: keys and values [32][DC] (broadcasts), queries and dO [32][DC + 1] (one row
// per lane).
template <int DPL>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    attention_dkdv_kernel(const BackwardArgs a) {
    constexpr int DC = cuda::kWarp * DPL;
    extern __shared__ __align__(16) float smem[];
    float* k_tile = smem;
    float* v_tile = k_tile + kTile * DC;
    float* q_tile = v_tile + kTile * DC;
    float* o_tile = q_tile + kTile * (DC + 1);
    float* w_tile = o_tile + kTile * (DC + 1) + warp_id() * kWeightFloats;

    const int lane = lane_id(), warp = warp_id();
    int64_t block = blockIdx.x;
    const int chunk = static_cast<int>(block % a.n_chunks);
    block /= a.n_chunks;
    const int key_tile = static_cast<int>(block % a.n_key_tiles);
    block /= a.n_key_tiles;
    const int kvh = static_cast<int>(block % a.Hkv);
    const int b = static_cast<int>(block / a.Hkv);
    const int G = a.H / a.Hkv;

    const Range keys{key_tile * kTile, min(key_tile * kTile + kTile, a.T)};
    const Range rows = tiles::rows_of_queries(tiles::queries_of_keys(keys, a.T, a.window), G);
    // Lane l stages key keys.begin + l; the warp owns keys first_key .. first_key + 7.
    const int64_t my_off =
        keys.begin + lane < keys.end
            ? ((static_cast<int64_t>(b) * a.T + keys.begin + lane) * a.Hkv + kvh) * a.hd
            : -1;
    const float* my_k = my_off >= 0 ? a.k + my_off : nullptr;
    const float* my_v = my_off >= 0 ? a.v + my_off : nullptr;
    const int first_key = keys.begin + warp * kRowsPerWarp;
    const bool warp_has_keys = first_key < keys.end;

    float dk[kRowsPerWarp][DPL], dv[kRowsPerWarp][DPL];
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i)
#pragma unroll
        for (int m = 0; m < DPL; ++m) dk[i][m] = dv[i][m] = 0.0f;

    const int n_tiles = tiles::tile_count(rows.end - rows.begin, kTile);
    for (int tile = 0; tile < n_tiles; ++tile) {
        // Lane l's row: its query t (-1 past the end: sees no key), sources and stats.
        const int row = rows.begin + tile * kTile + lane;
        const bool valid = row < rows.end;
        const int64_t qi = valid ? query_index(b, kvh, row, a.T, a.H, G) : 0;
        const int t = valid ? row / G : -1;
        const float lse = valid ? a.lse[qi] : 0.0f;
        const float delta = valid ? a.delta[qi] : 0.0f;
        const float* my_q = valid ? a.q + qi * a.hd : nullptr;
        const float* my_do = valid ? a.d_out + qi * a.hd : nullptr;

        float s[kRowsPerWarp] = {}, dp[kRowsPerWarp] = {};
        for (int step = 0; step < a.n_chunks; ++step) {
            const int cc = tiles::chunk_at_step(step, chunk, a.n_chunks);
            __syncthreads();  // every warp is done with the tiles of the previous step
            // With one chunk the keys and values stay in shared memory from the first tile on.
            if (a.n_chunks > 1 || tile == 0) {
                stage_tile<DPL>(k_tile, DC, my_k, cc * DC, a.hd);
                stage_tile<DPL>(v_tile, DC, my_v, cc * DC, a.hd);
            }
            stage_tile<DPL>(q_tile, DC + 1, my_q, cc * DC, a.hd);
            stage_tile<DPL>(o_tile, DC + 1, my_do, cc * DC, a.hd);
            __syncthreads();
            if (warp_has_keys) {
                const int n = min(DC, a.hd - cc * DC);
                dot_tile(s, k_tile, DC, q_tile, DC + 1, n);
                dot_tile(dp, v_tile, DC, o_tile, DC + 1, n);
            }
        }
        if (!warp_has_keys) continue;
        float p[kRowsPerWarp], ds[kRowsPerWarp];
#pragma unroll
        for (int i = 0; i < kRowsPerWarp; ++i) {
            p[i] = tiles::key_visible(t, first_key + i, a.window, 0) ? expf(s[i] * a.scale - lse)
                                                                     : 0.0f;
            ds[i] = p[i] * (dp[i] - delta) * a.scale;
        }
        accumulate_tile<DPL>(dv, p, w_tile, o_tile, DC + 1);
        accumulate_tile<DPL>(dk, ds, w_tile, q_tile, DC + 1);
    }

    if (!warp_has_keys) return;
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
        const int j = first_key + i;
        if (j >= keys.end) continue;
        const int64_t off = ((static_cast<int64_t>(b) * a.T + j) * a.Hkv + kvh) * a.hd;
#pragma unroll
        for (int m = 0; m < DPL; ++m) {
            const int d = chunk * DC + lane + cuda::kWarp * m;
            if (d < a.hd) {
                a.d_k[off + d] += dk[i][m];
                a.d_v[off + d] += dv[i][m];
            }
        }
    }
}

// ------------------------------------------------------------------------ cache write

// One block per written (b, t): copies the position's Hkv * hd floats of k and v to its slot.
// Only the last min(T, S) positions are written, so that every slot has one writer and the
// latest position wins, as the contract's in-order writes leave it.
__global__ void kv_cache_write_kernel(const float* k, const float* v, float* k_cache,
                                      float* v_cache, const int32_t* start, int T, int S,
                                      int n_written, int64_t row, int* status) {
    const int b = static_cast<int>(blockIdx.x / n_written);
    const int t = T - n_written + static_cast<int>(blockIdx.x % n_written);
    const int32_t p0 = start[b];
    if (p0 < 0) {
        if (threadIdx.x == 0 && t == T - n_written)
            cuda::report_error(status, cuda::kBadPosition, p0, 0);
        return;
    }
    const int64_t slot = (static_cast<int64_t>(p0) + t) % S;
    const int64_t src = (static_cast<int64_t>(b) * T + t) * row;
    const int64_t dst = (static_cast<int64_t>(b) * S + slot) * row;
    for (int64_t c = threadIdx.x; c < row; c += blockDim.x) {
        k_cache[dst + c] = k[src + c];
        v_cache[dst + c] = v[src + c];
    }
}

// ------------------------------------------------------------------------ host side

template <class Kernel>
void allow_shared_bytes(Kernel kernel, size_t bytes, const char* op) {
    if (bytes > kDefaultSharedBytes)
        TMX_CUDA_CHECK(op, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                static_cast<int>(bytes)));
}

// Positions and windows (attention_tiles.h), and the rows of a (b, kv head) plus a tile of
// any kernel, fit int. S: cache slots (0 without a cache).
void check_index_range(const Tensor& q, int64_t S, const char* op) {
    cuda::to_int(2 * (q.dim(1) + S), op);
    cuda::to_int(q.dim(1) * q.dim(2) + std::max(kTile, bf16_attention::kRows), op);
}

// ---- bf16 precision on tensor cores (attention_bf16.cuh)

// The arguments of the bf16 kernels: q, k, v (and d_out for the backward) rounded into bf16
// rows padded to the kernels' head dims, which `rows` keeps alive.
struct Bf16Launch {
    bf16_attention::Args args{};
    cuda::Bf16Rows rows[4];
    int head_dim = 0;  // padded: 32, 64 or 128
    unsigned row_blocks = 0, key_blocks = 0;
};
Bf16Launch prepare_bf16(CudaBackend& be, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor* d_out, int64_t window, const char* op) {
    check_index_range(q, 0, op);
    Bf16Launch l;
    bf16_attention::Args& a = l.args;
    a.B = cuda::to_int(q.dim(0), op);
    a.T = cuda::to_int(q.dim(1), op);
    a.H = cuda::to_int(q.dim(2), op);
    a.hd = cuda::to_int(q.dim(3), op);
    a.Hkv = cuda::to_int(k.dim(2), op);
    a.window = static_cast<int>(tiles::effective_window(window, a.T, 0));
    a.scale = 1.0f / std::sqrt(static_cast<float>(a.hd));
    a.scale_log2 = a.scale * bf16_attention::kLog2e;
    l.head_dim = bf16_attention::padded_head_dim(a.hd);
    const Tensor* sources[4] = {&q, &k, &v, d_out};
    const bf16_attention::bf16** targets[4] = {&a.q, &a.k, &a.v, &a.d_out};
    for (int i = 0; i < 4; ++i) {
        if (sources[i] == nullptr) continue;
        l.rows[i] = cuda::pad_to_bf16_rows(be, *sources[i], a.hd, l.head_dim, op);
        *targets[i] = l.rows[i].data;
    }
    const int64_t heads = int64_t{a.B} * a.Hkv;
    const int G = a.H / a.Hkv;
    l.row_blocks = static_cast<unsigned>(
        cuda::to_int(heads * tiles::tile_count(a.T * G, bf16_attention::kRows), op));
    l.key_blocks = static_cast<unsigned>(
        cuda::to_int(heads * tiles::tile_count(a.T, bf16_attention::kKeys), op));
    return l;
}

// Calls f(std::integral_constant<int, HD>) for the padded head dims.
template <class F>
void with_padded_head_dim(int hd, F&& f) {
    switch (hd) {
        case 32:
            f(std::integral_constant<int, 32>{});
            break;
        case 64:
            f(std::integral_constant<int, 64>{});
            break;
        default:
            f(std::integral_constant<int, 128>{});
            break;
    }
}

void attention_forward_bf16(CudaBackend& be, const Tensor& q, const Tensor& k, const Tensor& v,
                            const Tensor& out, int64_t window) {
    const char* op = "attention";
    const Bf16Launch l = prepare_bf16(be, q, k, v, nullptr, window, op);
    cuda::with_float_data(out, [&](auto* o) {  // out: F32, or BF16 (stored rounded)
        using OutT = std::remove_pointer_t<decltype(o)>;
        with_padded_head_dim(l.head_dim, [&](auto hd_constant) {
            constexpr int HD = decltype(hd_constant)::value;
            constexpr size_t bytes = bf16_attention::forward_shared_bytes<HD>();
            const auto kernel = bf16_attention::attention_forward_bf16_kernel<HD, OutT>;
            allow_shared_bytes(kernel, bytes, op);
            kernel<<<l.row_blocks, bf16_attention::kThreads, bytes, be.stream()>>>(l.args, o);
        });
    });
    be.check_launch(op);
}

void attention_backward_bf16(CudaBackend& be, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& d_out, const Tensor& d_q, const Tensor& d_k,
                             const Tensor& d_v, int64_t window) {
    const char* op = "attention_backward";
    Bf16Launch l = prepare_bf16(be, q, k, v, &d_out, window, op);
    bf16_attention::Args& a = l.args;
    const int64_t n_queries = q.dim(0) * q.dim(1) * q.dim(2);
    const Tensor lse2 = be.alloc({n_queries}, DType::F32);
    const Tensor delta = be.alloc({n_queries}, DType::F32);
    a.lse2 = CudaBackend::data<float>(lse2);
    a.delta = CudaBackend::data<float>(delta);
    a.d_q = CudaBackend::data<float>(d_q);
    a.d_k = CudaBackend::data<float>(d_k);
    a.d_v = CudaBackend::data<float>(d_v);
    with_padded_head_dim(l.head_dim, [&](auto hd_constant) {
        constexpr int HD = decltype(hd_constant)::value;
        constexpr size_t dq_bytes = bf16_attention::dq_shared_bytes<HD>();
        constexpr size_t dkdv_bytes = bf16_attention::dkdv_shared_bytes<HD>();
        allow_shared_bytes(bf16_attention::attention_dq_bf16_kernel<HD>, dq_bytes, op);
        allow_shared_bytes(bf16_attention::attention_dkdv_bf16_kernel<HD>, dkdv_bytes, op);
        bf16_attention::attention_dq_bf16_kernel<HD>
            <<<l.row_blocks, bf16_attention::kThreads, dq_bytes, be.stream()>>>(a);
        be.check_launch(op);
        bf16_attention::attention_dkdv_bf16_kernel<HD>
            <<<l.key_blocks, bf16_attention::kThreads, dkdv_bytes, be.stream()>>>(a);
        be.check_launch(op);
    });
}

// The forward, with or without a cache (k_cache, v_cache, start undefined without).
void attention_forward(CudaBackend& be, const Tensor& q, const Tensor& k, const Tensor& v,
                       const Tensor* k_cache, const Tensor* v_cache, const Tensor* start,
                       const Tensor& out, int64_t window, const char* op) {
    if (q.numel() == 0) return;
    const int64_t S = k_cache != nullptr ? k_cache->dim(1) : 0;
    ForwardArgs a{};
    a.B = cuda::to_int(q.dim(0), op);
    a.T = cuda::to_int(q.dim(1), op);
    a.H = cuda::to_int(q.dim(2), op);
    a.hd = cuda::to_int(q.dim(3), op);
    a.Hkv = cuda::to_int(k.dim(2), op);
    a.S = cuda::to_int(S, op);
    check_index_range(q, S, op);
    a.window = static_cast<int>(tiles::effective_window(window, a.T, a.S));
    a.scale = 1.0f / std::sqrt(static_cast<float>(a.hd));
    a.q = CudaBackend::data<float>(q);
    a.k = CudaBackend::data<float>(k);
    a.v = CudaBackend::data<float>(v);
    if (k_cache != nullptr) {
        a.k_cache = CudaBackend::data<float>(*k_cache);
        a.v_cache = CudaBackend::data<float>(*v_cache);
        a.start = CudaBackend::data<int32_t>(*start);
    }
    a.out = CudaBackend::data<float>(out);
    a.status = be.status_word();

    const int dpl = dims_per_lane(a.hd);
    const int G = a.H / a.Hkv;
    a.n_row_tiles = tiles::tile_count(a.T * G, kTile);
    a.n_chunks = tiles::tile_count(a.hd, cuda::kWarp * dpl);
    // Fewer blocks than SMs (decode, short prompts): split each block's keys over slices so
    // that every SM gets work, at least one key tile per slice.
    const int64_t blocks = int64_t{a.B} * a.Hkv * a.n_row_tiles * a.n_chunks;
    const int64_t sms = std::max(1, be.device().sm_count);
    a.n_slices = 1;
    if (blocks < sms) {
        const int64_t max_keys =
            a.window > 0 ? std::min<int64_t>(int64_t{a.window} + a.T - 1, int64_t{a.T} + a.S)
                         : int64_t{a.T} + a.S;
        const int64_t max_tiles = (max_keys + kTile - 1) / kTile;
        a.n_slices = static_cast<int>(std::min(max_tiles, (sms + blocks - 1) / blocks));
    }
    Tensor part_out, part_max, part_sum;
    const int64_t n_queries = int64_t{a.B} * a.T * a.H;
    if (a.n_slices > 1) {
        part_out = be.alloc({a.n_slices * n_queries * a.hd}, DType::F32);
        part_max = be.alloc({a.n_slices * n_queries}, DType::F32);
        part_sum = be.alloc({a.n_slices * n_queries}, DType::F32);
        a.part_out = CudaBackend::data<float>(part_out);
        a.part_max = CudaBackend::data<float>(part_max);
        a.part_sum = CudaBackend::data<float>(part_sum);
    }

    const unsigned grid = static_cast<unsigned>(cuda::to_int(blocks * a.n_slices, op));
    with_dims_per_lane(dpl, [&](auto dpl_constant) {
        constexpr int DPL = decltype(dpl_constant)::value;
        constexpr size_t bytes = forward_shared_bytes<DPL>();
        allow_shared_bytes(attention_forward_kernel<DPL>, bytes, op);
        attention_forward_kernel<DPL><<<grid, kThreads, bytes, be.stream()>>>(a);
    });
    be.check_launch(op);

    if (a.n_slices > 1) {
        constexpr int kMergeThreads = 256;
        attention_merge_kernel<<<cuda::blocks_for(n_queries * a.hd, kMergeThreads), kMergeThreads,
                                 0, be.stream()>>>(a.part_out, a.part_max, a.part_sum, a.n_slices,
                                                   n_queries, a.hd, a.start, int64_t{a.T} * a.H,
                                                   a.out);
        be.check_launch(op);
    }
}

}  // namespace

void CudaBackend::attention_impl(const Tensor& q, const Tensor& k, const Tensor& v,
                                 const Tensor& out, int64_t window) {
    if (q.numel() == 0) return;
    if (attention_in_bf16(matmul_precision(), q.dim(3)))
        attention_forward_bf16(*this, q, k, v, out, window);
    else
        attention_forward(*this, q, k, v, nullptr, nullptr, nullptr, out, window, "attention");
}

void CudaBackend::attention_cached_impl(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const Tensor& k_cache, const Tensor& v_cache,
                                        const Tensor& start, const Tensor& out, int64_t window) {
    attention_forward(*this, q, k, v, &k_cache, &v_cache, &start, out, window, "attention_cached");
}

void CudaBackend::kv_cache_write_impl(const Tensor& k, const Tensor& v, const Tensor& k_cache,
                                      const Tensor& v_cache, const Tensor& start) {
    const char* op = "kv_cache_write";
    const int B = cuda::to_int(k.dim(0), op), T = cuda::to_int(k.dim(1), op);
    const int S = cuda::to_int(k_cache.dim(1), op);
    const int64_t row = k.dim(2) * k.dim(3);
    const int n_written = std::min(T, S);
    if (B == 0 || n_written == 0 || row == 0) return;
    const int blocks = cuda::to_int(int64_t{B} * n_written, op);
    kv_cache_write_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream()>>>(
        data<float>(k), data<float>(v), data<float>(k_cache), data<float>(v_cache),
        data<int32_t>(start), T, S, n_written, row, status_word());
    check_launch(op);
}

void CudaBackend::attention_backward_impl(const Tensor& q, const Tensor& k, const Tensor& v,
                                          const Tensor& d_out, const Tensor& d_q, const Tensor& d_k,
                                          const Tensor& d_v, int64_t window) {
    const char* op = "attention_backward";
    if (q.numel() == 0) return;
    if (attention_in_bf16(matmul_precision(), q.dim(3))) {
        attention_backward_bf16(*this, q, k, v, d_out, d_q, d_k, d_v, window);
        return;
    }
    BackwardArgs a{};
    a.B = cuda::to_int(q.dim(0), op);
    a.T = cuda::to_int(q.dim(1), op);
    a.H = cuda::to_int(q.dim(2), op);
    a.hd = cuda::to_int(q.dim(3), op);
    a.Hkv = cuda::to_int(k.dim(2), op);
    check_index_range(q, 0, op);
    a.window = static_cast<int>(tiles::effective_window(window, a.T, 0));
    a.scale = 1.0f / std::sqrt(static_cast<float>(a.hd));
    a.q = data<float>(q);
    a.k = data<float>(k);
    a.v = data<float>(v);
    a.d_out = data<float>(d_out);
    a.d_q = data<float>(d_q);
    a.d_k = data<float>(d_k);
    a.d_v = data<float>(d_v);
    const int64_t n_queries = q.dim(0) * q.dim(1) * q.dim(2);
    Tensor lse = alloc({n_queries}, DType::F32), delta = alloc({n_queries}, DType::F32);
    a.lse = data<float>(lse);
    a.delta = data<float>(delta);

    const int dpl = dims_per_lane(a.hd);
    const int G = a.H / a.Hkv;
    a.n_row_tiles = tiles::tile_count(a.T * G, kTile);
    a.n_key_tiles = tiles::tile_count(a.T, kTile);
    a.n_chunks = tiles::tile_count(a.hd, cuda::kWarp * dpl);
    const int64_t heads = int64_t{a.B} * a.Hkv;
    const unsigned stats_grid = static_cast<unsigned>(cuda::to_int(heads * a.n_row_tiles, op));
    const unsigned dq_grid =
        static_cast<unsigned>(cuda::to_int(heads * a.n_row_tiles * a.n_chunks, op));
    const unsigned dkdv_grid =
        static_cast<unsigned>(cuda::to_int(heads * a.n_key_tiles * a.n_chunks, op));

    with_dims_per_lane(dpl, [&](auto dpl_constant) {
        constexpr int DPL = decltype(dpl_constant)::value;
        constexpr size_t bytes = backward_shared_bytes<DPL>();
        allow_shared_bytes(attention_stats_kernel<DPL>, bytes, op);
        allow_shared_bytes(attention_dq_kernel<DPL>, bytes, op);
        allow_shared_bytes(attention_dkdv_kernel<DPL>, bytes, op);
        attention_stats_kernel<DPL><<<stats_grid, kThreads, bytes, stream()>>>(a);
        check_launch(op);
        attention_dq_kernel<DPL><<<dq_grid, kThreads, bytes, stream()>>>(a);
        check_launch(op);
        attention_dkdv_kernel<DPL><<<dkdv_grid, kThreads, bytes, stream()>>>(a);
        check_launch(op);
    });
}

}  // namespace tmx

// The CUDA backend's grouped matmul over experts, forward and backward side by side. Its CPU
// twin is in backends/cpu/matmul.cpp.
//
// Grouped: at training's sizes in bf16, one cuBLASLt matmul per expert, after the host reads the
// expert offsets (lt_grouped(): one sync per product). Otherwise own kernels: the offsets stay
// on the device and are never read by the host (no sync), so the kernels find their expert
// themselves. In fp32: 128x128 output tiles, 8-deep reduction
// steps staged in shared memory, 256 threads computing 8x8 outputs each; row tiles are cut per
// expert, so a tile never straddles two experts. Decode (a few slots) takes a matrix-vector
// kernel instead. Every output element is summed by one thread in a fixed order:
// deterministic, no atomics.
//
// In bf16 precision the grouped products take bf16 operands with rows padded to a multiple of
// 8 and 16-byte aligned, used in place where a BF16 operand already is so and copied otherwise
// (F32 rounded), and run on tensor cores (matmul_bf16.cuh); the decode matrix-vector kernel
// reads either type, rounding F32 elements as it reads.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/matmul_bf16.cuh"
#include "backends/cuda/matmul_common.cuh"
#include "backends/cuda/weights.cuh"
#include "engine/core/errors.h"

namespace tmx {
namespace {

using cuda::block_column_sum;
using cuda::kMaxGridY;
using cuda::kSumCols;
using cuda::kSumLanes;
using cuda::kWarp;
using cuda::launch_bias_rows;
using cuda::lt_matmul;
using cuda::maybe_bf16;
namespace bf16_gemm = cuda::bf16_gemm;

constexpr int kThreads = 256;

// ---- grouped matmul: tiles
//
// A block computes a 128 x 128 output tile; each of its 256 threads an 8 x 8 register block
// (rows 4 ty + {0..3} and 64 + 4 ty + {0..3}, columns likewise from tx), so every four
// shared-memory reads feed 64 FMAs. The reduction is staged 8 deep in two shared buffers: the
// next stage's global loads are in flight (in registers) while the current one is multiplied,
// and one barrier per stage suffices. Measured on an H100 (B32 x T512 training step): the
// earlier 64 x 64 tiles with 4 x 4 per thread spent 57% of the step in these kernels.

constexpr int kTileM = 128;        // output rows per block (slots; n for d_w)
constexpr int kTileN = 128;        // output columns per block
constexpr int kTileK = 8;          // reduction depth staged per step
constexpr int kTilePad = 4;        // keeps shared rows 16-byte aligned (float4 reads)
constexpr int kTileThreads = 256;  // 16 x 16 threads, 8 x 8 outputs each
constexpr int kHalfTile = kTileM / 2;
constexpr int kStageLoads = kTileM * kTileK / kTileThreads;  // elements each thread stages
static_assert(kTileM == kTileN && kTileM * kTileK == kStageLoads * kTileThreads);
static_assert(kTileThreads == (kTileM / 8) * (kTileN / 8));

// One reduction stage of a tile: a[k][m] and b[k][n] for k in [0, kTileK), both k-major so a
// thread reads each half of its rows and of its columns as one float4.
struct alignas(16) TileStage {
    float a[kTileK][kTileM + kTilePad];
    float b[kTileK][kTileN + kTilePad];
};

// The tile row (column) of a thread's register row i (column j), i, j in [0, 8).
__device__ __forceinline__ int tile_index(int t, int i) {
    return (i < 4 ? 0 : kHalfTile) + 4 * t + (i & 3);
}

// acc[i][j] += sum over the staged k of a[k][row i] * b[k][column j], in k order. Within a
// warp ty takes 2 values (broadcast reads of a) and tx 16 (adjacent float4s of b).
__device__ __forceinline__ void tile_fma(const TileStage& st, int tx, int ty, float (&acc)[8][8]) {
#pragma unroll
    for (int k = 0; k < kTileK; ++k) {
        const float4 a0 = *reinterpret_cast<const float4*>(&st.a[k][4 * ty]);
        const float4 a1 = *reinterpret_cast<const float4*>(&st.a[k][kHalfTile + 4 * ty]);
        const float4 b0 = *reinterpret_cast<const float4*>(&st.b[k][4 * tx]);
        const float4 b1 = *reinterpret_cast<const float4*>(&st.b[k][kHalfTile + 4 * tx]);
        const float ar[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
        const float br[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
            for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(ar[i], br[j], acc[i][j]);
    }
}

// An offset clamped to [0, S]: offsets are trusted (moe_group's prefix sums), this only keeps a
// corrupt one from sending a kernel outside x and out.
__device__ __forceinline__ int slot_bound(const int32_t* offsets, int e, int S) {
    return min(max(offsets[e], 0), S);
}

// Row tiles are cut per expert: expert e's slots [offsets[e], offsets[e+1]) make
// ceil(count / kTileM) tiles, numbered in expert order. Finds tile t's expert and slot range;
// false when t is past the last tile (the grid is sized for the most there can be,
// ceil(S / kTileM) + E). Every thread walks the E + 1 offsets itself (E is small; the loads hit
// the cache), which spares a shared-memory handoff.
__device__ bool find_row_tile(const int32_t* offsets, int E, int S, int t, int& expert,
                              int& row_begin, int& row_end) {
    int first = 0;  // the first tile of expert e
    for (int e = 0; e < E; ++e) {
        const int begin = slot_bound(offsets, e, S);
        const int end = max(begin, slot_bound(offsets, e + 1, S));
        const int tiles = (end - begin + kTileM - 1) / kTileM;
        if (t < first + tiles) {
            expert = e;
            row_begin = begin + (t - first) * kTileM;
            row_end = min(row_begin + kTileM, end);
            return true;
        }
        first += tiles;
    }
    return false;
}

// The staged elements of one operand that a thread loads from global memory for one stage.
struct StageRegs {
    float v[kStageLoads];
};

// out[s, c] (+)= sum over r of a[s, r] * W_e(r, c) (+ bias[e, c]) for every slot s of expert e,
// the r in order. a [S, R], out [S, C]. kTransW: W_e(r, c) = w[e][c, r], w [E, C, R] (the
// forward: x . w[e]^T); otherwise W_e(r, c) = w[e][r, c], w [E, R, C] (d_x = d_out . w[e]).
// Grid: (row tiles, ceil(C / kTileN)).
// Two blocks per multiprocessor on sm_90 (128 registers, no spills; as measured on the H100).
// For sm_89 ptxas spills the d_x variant at 128 registers, so there it runs one (an L4 has not
// run either yet). d_w's kernel needs more registers for its double bias sum and runs one.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
constexpr int kGemmMinBlocks = 1;
#else
constexpr int kGemmMinBlocks = 2;
#endif
template <bool kTransW>
__global__ void __launch_bounds__(kTileThreads, kGemmMinBlocks)
    grouped_gemm_kernel(const float* a, const float* w, const float* bias, const int32_t* offsets,
                        int E, int S, int R, int C, bool accumulate, float* out) {
    int e = 0, row_begin = 0, row_end = 0;
    if (!find_row_tile(offsets, E, S, static_cast<int>(blockIdx.x), e, row_begin, row_end))
        return;  // the whole block: past the last tile
    const int c0 = static_cast<int>(blockIdx.y) * kTileN;
    const float* we = w + static_cast<int64_t>(e) * R * C;
    const int tid = static_cast<int>(threadIdx.x), tx = tid % 16, ty = tid / 16;

    // a's tile as [k][m]: 8 adjacent threads read 8 adjacent r of one row. W's tile as [k][n],
    // read along the dimension w is contiguous in.
    auto load = [&](int r0, StageRegs& ra, StageRegs& rb) {
#pragma unroll
        for (int i = 0; i < kStageLoads; ++i) {
            const int idx = tid + i * kTileThreads, m = idx / kTileK, k = idx % kTileK;
            const int row = row_begin + m, r = r0 + k;
            ra.v[i] = row < row_end && r < R ? a[static_cast<int64_t>(row) * R + r] : 0.0f;
            if constexpr (kTransW) {
                const int c = c0 + m;  // idx / kTileK names a column of W here
                rb.v[i] = c < C && r < R ? we[static_cast<int64_t>(c) * R + r] : 0.0f;
            } else {
                const int kk = idx / kTileN, n = idx % kTileN, c = c0 + n, rr = r0 + kk;
                rb.v[i] = c < C && rr < R ? we[static_cast<int64_t>(rr) * C + c] : 0.0f;
            }
        }
    };
    auto store = [&](TileStage& st, const StageRegs& ra, const StageRegs& rb) {
#pragma unroll
        for (int i = 0; i < kStageLoads; ++i) {
            const int idx = tid + i * kTileThreads;
            st.a[idx % kTileK][idx / kTileK] = ra.v[i];
            if constexpr (kTransW)
                st.b[idx % kTileK][idx / kTileK] = rb.v[i];
            else
                st.b[idx / kTileN][idx % kTileN] = rb.v[i];
        }
    };

    __shared__ TileStage stages[2];
    float acc[8][8] = {};
    StageRegs ra, rb;
    load(0, ra, rb);
    store(stages[0], ra, rb);
    __syncthreads();
    int cur = 0;
    for (int r0 = 0; r0 < R; r0 += kTileK) {
        const bool more = r0 + kTileK < R;
        if (more) load(r0 + kTileK, ra, rb);  // in flight while this stage is multiplied
        tile_fma(stages[cur], tx, ty, acc);
        if (more) store(stages[cur ^ 1], ra, rb);  // its last readers passed the last barrier
        __syncthreads();
        cur ^= 1;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int row = row_begin + tile_index(ty, i);
        if (row >= row_end) continue;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int c = c0 + tile_index(tx, j);
            if (c >= C) continue;
            float v = acc[i][j];
            if (bias) v += bias[static_cast<int64_t>(e) * C + c];
            float* o = out + static_cast<int64_t>(row) * C + c;
            *o = accumulate ? *o + v : v;
        }
    }
}

// d_w[e][n, k] += sum over e's slots s, in order, of d_out[s, n] * x[s, k]; the blocks of the
// first k tile also add d_bias[e][n] += sum over s of d_out[s, n] (when d_bias is given), from
// the d_out tile they stage anyway. d_out [S, Nout], x [S, K], d_w [E, Nout, K], d_bias
// [E, Nout]. Grid: (max(1, ceil(K / kTileN)), ceil(Nout / kTileM), E); one block owns its
// outputs, so no atomics.
__global__ void __launch_bounds__(kTileThreads)
    grouped_dw_kernel(const float* d_out, const float* x, const int32_t* offsets, int S, int Nout,
                      int K, float* d_w, float* d_bias) {
    const int e = static_cast<int>(blockIdx.z);
    const int begin = slot_bound(offsets, e, S);
    const int end = max(begin, slot_bound(offsets, e + 1, S));
    if (begin == end) return;  // no slots: nothing to add (as the CPU skips the expert)
    const int n0 = static_cast<int>(blockIdx.y) * kTileM,
              k0 = static_cast<int>(blockIdx.x) * kTileN;
    const int tid = static_cast<int>(threadIdx.x), tx = tid % 16, ty = tid / 16;
    const bool with_bias = d_bias != nullptr && blockIdx.x == 0;

    // The slots are the reduction: a[ss][n] = d_out[s0 + ss, n0 + n] and b[ss][k] =
    // x[s0 + ss, k0 + k], both read along their rows (coalesced) with no transpose.
    auto load = [&](int s0, StageRegs& ra, StageRegs& rb) {
#pragma unroll
        for (int i = 0; i < kStageLoads; ++i) {
            const int idx = tid + i * kTileThreads, ss = idx / kTileN, col = idx % kTileN;
            const int s = s0 + ss, n = n0 + col, k = k0 + col;
            ra.v[i] = s < end && n < Nout ? d_out[static_cast<int64_t>(s) * Nout + n] : 0.0f;
            rb.v[i] = s < end && k < K ? x[static_cast<int64_t>(s) * K + k] : 0.0f;
        }
    };
    auto store = [&](TileStage& st, const StageRegs& ra, const StageRegs& rb) {
#pragma unroll
        for (int i = 0; i < kStageLoads; ++i) {
            const int idx = tid + i * kTileThreads;
            st.a[idx / kTileN][idx % kTileN] = ra.v[i];
            st.b[idx / kTileN][idx % kTileN] = rb.v[i];
        }
    };

    __shared__ TileStage stages[2];
    float acc[8][8] = {};
    double bias_acc = 0.0;  // thread tid < kTileM: column n0 + tid of d_bias, in double as the CPU
    StageRegs ra, rb;
    load(begin, ra, rb);
    store(stages[0], ra, rb);
    __syncthreads();
    int cur = 0;
    for (int s0 = begin; s0 < end; s0 += kTileK) {
        const bool more = s0 + kTileK < end;
        if (more) load(s0 + kTileK, ra, rb);
        tile_fma(stages[cur], tx, ty, acc);
        if (with_bias && tid < kTileM) {
#pragma unroll
            for (int ss = 0; ss < kTileK; ++ss) bias_acc += stages[cur].a[ss][tid];
        }
        if (more) store(stages[cur ^ 1], ra, rb);
        __syncthreads();
        cur ^= 1;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int n = n0 + tile_index(ty, i);
        if (n >= Nout) continue;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int k = k0 + tile_index(tx, j);
            if (k < K) d_w[(static_cast<int64_t>(e) * Nout + n) * K + k] += acc[i][j];
        }
    }
    if (with_bias && tid < kTileM && n0 + tid < Nout)
        d_bias[static_cast<int64_t>(e) * Nout + n0 + tid] += static_cast<float>(bias_acc);
}

// ---- grouped matmul in bf16: tensor cores (matmul_bf16.cuh)

// A grouped-matmul operand: t's elements as [rows, cols] (cols its last dimension) in bf16,
// rows padded to a multiple of 8 and 16-byte aligned. A BF16 t that already is so (cols a
// multiple of 8, data 16-byte aligned) is used in place, with empty storage; any other is
// copied (F32 rounded).
cuda::Bf16Rows gemm_rows(CudaBackend& be, const Tensor& t, int64_t cols, const char* op) {
    if (t.dtype() == DType::BF16 && cols % 8 == 0) {
        const auto* p = CudaBackend::data<__nv_bfloat16>(t);
        if (cuda::aligned16(p)) return {.data = p, .ld = cols};
    }
    return cuda::pad_to_bf16_rows(be, t, cols, (cols + 7) / 8 * 8, op);
}
bf16_gemm::Operand as_operand(const cuda::Bf16Rows& r) {
    return {r.data, r.ld};
}

// The shared memory a tensor-core kernel uses (bf16_gemm::kSharedBytes) is above the default
// 48 KiB limit: raised for the kernel before each launch (a cheap host call).
template <typename Kernel>
void allow_tile_shared_memory(Kernel kernel, const char* op) {
    TMX_CUDA_CHECK(op, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            bf16_gemm::kSharedBytes));
}

// What the forward and d_x kernels need: A [S, R] (the slots' rows), B the stacked expert
// weights (expert e's at b.p + e * b_expert_stride), bias [E, C] or null, out [S, C].
struct GroupedBf16Args {
    bf16_gemm::Operand a, b;
    int64_t b_expert_stride;
    const float* bias;
    const int32_t* offsets;
    int E, S, R, C;
    bool accumulate;
    float* out;
};

// The forward (kTransW: out[s, c] = sum_r x[s, r] w[e][c, r]) and d_x (d_x[s, c] += sum_r
// d_out[s, r] w[e][r, c]) products of grouped_gemm_kernel, on tensor cores. Grid: (row tiles,
// ceil(C / 128)), as grouped_grid gives; bf16_gemm::kSharedBytes of dynamic shared memory.
// Capped at 128 registers for two blocks per multiprocessor (no spills on sm_89 or sm_90; an
// L4's 100 KiB of shared memory holds one block anyway).
template <bool kTransW>
__global__ void __launch_bounds__(bf16_gemm::kThreads, 2)
    grouped_gemm_bf16_kernel(GroupedBf16Args p) {
    using namespace bf16_gemm;
    int e = 0, row_begin = 0, row_end = 0;
    if (!find_row_tile(p.offsets, p.E, p.S, static_cast<int>(blockIdx.x), e, row_begin, row_end))
        return;  // the whole block: past the last tile
    const int c0 = static_cast<int>(blockIdx.y) * kTile;
    const Operand we{p.b.p + static_cast<int64_t>(e) * p.b_expert_stride, p.b.ld};
    extern __shared__ __align__(128) unsigned char shared_raw[];
    auto* smem = reinterpret_cast<__nv_bfloat16*>(shared_raw);
    Accum acc[kFragRows][kFragCols];
    const auto load_a = [&](int d0, __nv_bfloat16* s) {
        load_stage_async<false>(s, p.a, row_begin, row_end, d0);
    };
    const auto load_b = [&](int d0, __nv_bfloat16* s) {
        if constexpr (kTransW)
            load_stage_async<false>(s, we, c0, p.C, d0);  // w[e] [C, R]: rows c
        else
            load_stage_async<true>(s, we, d0, p.R, c0);  // w[e] [R, C]: rows r
    };
    multiply<kTransW ? Product::Forward : Product::DataGrad>(smem, 0, p.R, load_a, load_b, acc);
    emit_tile(smem, acc, [&](int m, int n, float v) {
        const int row = row_begin + m, c = c0 + n;
        if (row >= row_end || c >= p.C) return;
        if (p.bias) v += p.bias[static_cast<int64_t>(e) * p.C + c];
        float* o = p.out + static_cast<int64_t>(row) * p.C + c;
        *o = p.accumulate ? *o + v : v;
    });
}

// d_w[e][n, k] += sum over e's slots s of d_out[s, n] * x[s, k], on tensor cores. Grid:
// (ceil(K / 128), ceil(Nout / 128), E); dynamic shared memory as above. d_bias is
// expert_bias_grad_kernel's, from the fp32 d_out.
__global__ void __launch_bounds__(bf16_gemm::kThreads, 2)
    grouped_dw_bf16_kernel(bf16_gemm::Operand d_out, bf16_gemm::Operand x, const int32_t* offsets,
                           int S, int Nout, int K, float* d_w) {
    using namespace bf16_gemm;
    const int e = static_cast<int>(blockIdx.z);
    const int begin = slot_bound(offsets, e, S);
    const int end = max(begin, slot_bound(offsets, e + 1, S));
    if (begin == end) return;  // no slots: nothing to add (as the CPU skips the expert)
    const int n0 = static_cast<int>(blockIdx.y) * kTile, k0 = static_cast<int>(blockIdx.x) * kTile;
    extern __shared__ __align__(128) unsigned char shared_raw[];
    auto* smem = reinterpret_cast<__nv_bfloat16*>(shared_raw);
    Accum acc[kFragRows][kFragCols];
    const auto load_a = [&](int s0, __nv_bfloat16* s) {
        load_stage_async<true>(s, d_out, s0, end, n0);
    };
    const auto load_b = [&](int s0, __nv_bfloat16* s) {
        load_stage_async<true>(s, x, s0, end, k0);
    };
    multiply<Product::WeightGrad>(smem, begin, end, load_a, load_b, acc);
    emit_tile(smem, acc, [&](int m, int c, float v) {
        const int n = n0 + m, k = k0 + c;
        if (n < Nout && k < K) d_w[(static_cast<int64_t>(e) * Nout + n) * K + k] += v;
    });
}

// d_bias[e][n] += sum over e's slots s, in order, of d_out[s, n], summed in double (as the
// CPU). Grid: (ceil(Nout / 32), E) of 32 x 8 blocks.
__global__ void expert_bias_grad_kernel(const float* d_out, const int32_t* offsets, int S, int Nout,
                                        float* d_bias) {
    const int e = static_cast<int>(blockIdx.y);
    const int begin = slot_bound(offsets, e, S);
    const int end = max(begin, slot_bound(offsets, e + 1, S));
    if (begin == end) return;  // the whole block
    const int64_t col = static_cast<int64_t>(blockIdx.x) * kSumCols + threadIdx.x;
    const double sum = block_column_sum(d_out, Nout, begin, end, col);
    if (threadIdx.y == 0 && col < Nout)
        d_bias[static_cast<int64_t>(e) * Nout + col] += static_cast<float>(sum);
}

// ---- grouped matmul: matrix-vector path for decode

// Up to this many slots, one warp per output element: decoding's shapes (batch 16 at top-2 is
// 32 slots), where the tiled kernels would compute mostly empty 128-row tiles.
constexpr int64_t kMatvecMaxSlots = 32;

// The expert whose slot range holds s, or -1 (offsets not covering s: the slot is left alone).
__device__ int expert_of_slot(const int32_t* offsets, int E, int s) {
    for (int e = 0; e < E; ++e)
        if (s >= offsets[e] && s < offsets[e + 1]) return e;
    return -1;
}

// out[s, n] = x[s, :] . w[e][n, :] (+ bias[e][n]), one warp per (s, n): the lanes stride along
// the weight row (each weight read once, coalesced) and a butterfly (fixed order) adds them.
// With round_bf16 (bf16 precision) F32 operands are rounded to bf16 as they are read; XT is
// float or __nv_bfloat16 (BF16 x, bf16 precision only), a bf16 element read as it is, so the
// result is the same as from its F32 value. The weight is read through its format's reader
// (weights.cuh: f32, bf16, f16 or Q8_0 as stored), its value rounded like an F32 operand's in
// bf16 precision (exact for a bf16 weight). The loads stay scalar: lane order along k is the
// summation order, the same for every type.

template <typename XT, typename WR>
__global__ void grouped_matvec_kernel(const XT* x, WR w, const float* bias, const int32_t* offsets,
                                      int E, int S, int Nout, int K, bool round_bf16, float* out) {
    const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
    const int lane = static_cast<int>(threadIdx.x % kWarp);
    if (warp >= static_cast<int64_t>(S) * Nout) return;  // whole warps
    const int s = static_cast<int>(warp / Nout), n = static_cast<int>(warp % Nout);
    const int e = expert_of_slot(offsets, E, s);
    if (e < 0) return;  // the same for the whole warp
    const XT* xs = x + static_cast<int64_t>(s) * K;
    const int64_t wn = (static_cast<int64_t>(e) * Nout + n) * K;
    float acc = 0.0f;
#pragma unroll 4
    for (int k = lane; k < K; k += kWarp)
        acc = fmaf(maybe_bf16(xs[k], round_bf16), maybe_bf16(w[wn + k], round_bf16), acc);
    acc = cuda::warp_sum(acc);
    if (lane == 0) {
        if (bias) acc += bias[static_cast<int64_t>(e) * Nout + n];
        out[static_cast<int64_t>(s) * Nout + n] = acc;
    }
}

// Grid of the grouped kernels: row tiles enough for any split of S slots among E experts
// (sum of ceil(count_e / kTileM) <= ceil(S / kTileM) + E), and column tiles.
dim3 grouped_grid(int S, int E, int C, const char* op) {
    const int64_t row_tiles = (static_cast<int64_t>(S) + kTileM - 1) / kTileM + E;
    const int64_t col_tiles = (static_cast<int64_t>(C) + kTileN - 1) / kTileN;
    if (row_tiles > INT32_MAX || col_tiles > kMaxGridY)
        throw Error(std::string("cuda: ") + op + ": " + std::to_string(S) + " slots x " +
                    std::to_string(C) + " columns exceed the kernel's grid");
    return dim3(static_cast<unsigned>(row_tiles), static_cast<unsigned>(col_tiles));
}

// Grid of the d_w kernels (fp32 and bf16 tiles are both 128 x 128): (ceil(K / 128),
// ceil(Nout / 128), E).
dim3 weight_grad_grid(int E, int Nout, int K, const char* op) {
    static_assert(kTileM == bf16_gemm::kTile && kTileN == bf16_gemm::kTile);
    const int64_t n_tiles = (static_cast<int64_t>(Nout) + kTileM - 1) / kTileM;
    const int64_t k_tiles = (static_cast<int64_t>(K) + kTileN - 1) / kTileN;
    if (n_tiles > kMaxGridY || E > kMaxGridY)
        throw Error(std::string("cuda: ") + op + ": " + std::to_string(E) + " experts x " +
                    std::to_string(Nout) + " outputs exceed the kernel's grid");
    return dim3(static_cast<unsigned>(k_tiles), static_cast<unsigned>(n_tiles),
                static_cast<unsigned>(E));
}

// ---- grouped matmul: one cuBLASLt matmul per expert for training's batches

// From this many slots per expert on average, bf16 grouped products run as one cuBLASLt matmul
// per expert (Hopper's wgmma kernels: several times the tiled kernels' rate at training
// shapes). The host then needs the offsets: one copy and stream sync per product, which costs
// a few microseconds against products of a millisecond, and none below this size (decoding).
constexpr int64_t kLtMinSlotsPerExpert = 256;

// Whether the grouped products take the cuBLASLt path: bf16, enough slots, rows of a multiple
// of 8 elements (so every expert's rows start 16-byte aligned in the contiguous bf16 operands),
// and no CUDA graph being captured (the host cannot read the offsets inside one).
bool lt_grouped(const CudaBackend& be, int64_t S, int64_t E, int64_t Nout, int64_t K,
                const char* op) {
    if (be.matmul_precision() != Precision::BF16 || S < kLtMinSlotsPerExpert * E || Nout % 8 != 0 ||
        K % 8 != 0)
        return false;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    TMX_CUDA_CHECK(op, cudaStreamIsCapturing(be.stream(), &capture));
    return capture == cudaStreamCaptureStatusNone;
}

// Expert e's slots [begin, end), as the kernels read the offsets (slot_bound): clamped to
// [0, S], an end before its begin meaning no slots. Waits for the stream.
std::vector<std::pair<int64_t, int64_t>> expert_slot_ranges(CudaBackend& be, const int32_t* offsets,
                                                            int E, int S, const char* op) {
    std::vector<int32_t> host(static_cast<size_t>(E) + 1);
    TMX_CUDA_CHECK(op, cudaMemcpyAsync(host.data(), offsets, host.size() * sizeof(int32_t),
                                       cudaMemcpyDeviceToHost, be.stream()));
    TMX_CUDA_CHECK(op, cudaStreamSynchronize(be.stream()));
    const auto bound = [&](int e) { return std::clamp<int64_t>(host[e], 0, S); };
    std::vector<std::pair<int64_t, int64_t>> ranges(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) ranges[e] = {bound(e), std::max(bound(e), bound(e + 1))};
    return ranges;
}

void lt_grouped_matmul(const CudaBackend& be, const void* a, const void* b, float* out,
                       const float* bias, int64_t M, int64_t N, int64_t K, bool trans_a,
                       bool trans_b, float beta, const char* op) {
    if (!lt_matmul(be, CUDA_R_16BF, a, b, out, bias, M, N, K, trans_a, trans_b, beta, true))
        throw Error(std::string("cuda: ") + op + ": cuBLASLt has no bf16 algorithm for M=" +
                    std::to_string(M) + ", N=" + std::to_string(N) + ", K=" + std::to_string(K));
}

// out[begin_e.., :] = x_e . w[e]^T (+ bias[e]) per expert. x [S, K] and w [E, Nout, K] as
// contiguous bf16 rows (gemm_rows with K a multiple of 8).
void lt_grouped_forward(CudaBackend& be, const __nv_bfloat16* x, const __nv_bfloat16* w,
                        const float* bias, const int32_t* offsets, int E, int S, int Nout, int K,
                        float* out, const char* op) {
    const auto ranges = expert_slot_ranges(be, offsets, E, S, op);
    for (int e = 0; e < E; ++e) {
        const auto [begin, end] = ranges[e];
        if (begin == end) continue;
        const int64_t rows = end - begin;
        const float* b = bias ? bias + static_cast<int64_t>(e) * Nout : nullptr;
        float* o = out + begin * Nout;
        const __nv_bfloat16* xe = x + begin * K;
        const __nv_bfloat16* we = w + static_cast<int64_t>(e) * Nout * K;
        if (b && cuda::aligned16(b)) {  // the bias through the epilogue, as the dense matmul
            lt_grouped_matmul(be, xe, we, o, b, rows, Nout, K, false, true, 0.0f, op);
            continue;
        }
        if (b) launch_bias_rows(be, o, b, rows, Nout, false, op);
        lt_grouped_matmul(be, xe, we, o, nullptr, rows, Nout, K, false, true, b ? 1.0f : 0.0f, op);
    }
}

// Per expert: d_x[begin_e.., :] += d_out_e . w[e] and d_w[e] += d_out_e^T . x_e. d_out [S, Nout],
// x [S, K], w [E, Nout, K] as contiguous bf16 rows.
void lt_grouped_backward(CudaBackend& be, const __nv_bfloat16* x, const __nv_bfloat16* w,
                         const __nv_bfloat16* d_out, const int32_t* offsets, int E, int S, int Nout,
                         int K, float* d_x, float* d_w, const char* op) {
    const auto ranges = expert_slot_ranges(be, offsets, E, S, op);
    for (int e = 0; e < E; ++e) {
        const auto [begin, end] = ranges[e];
        if (begin == end) continue;  // no slots: nothing to add (as the CPU skips the expert)
        const int64_t rows = end - begin, w_offset = static_cast<int64_t>(e) * Nout * K;
        const __nv_bfloat16* dy = d_out + begin * Nout;
        lt_grouped_matmul(be, dy, w + w_offset, d_x + begin * K, nullptr, rows, K, Nout, false,
                          false, 1.0f, op);
        lt_grouped_matmul(be, dy, x + begin * K, d_w + w_offset, nullptr, Nout, K, rows, true,
                          false, 1.0f, op);
    }
}

}  // namespace

void CudaBackend::grouped_matmul_impl(const Tensor& x, const Tensor& w, const Tensor& bias,
                                      const Tensor& offsets, const Tensor& out) {
    const char* op = "grouped_matmul";
    const int E = cuda::to_int(w.dim(0), op);
    const int Nout = cuda::to_int(w.dim(1), op), K = cuda::to_int(w.dim(2), op);
    const int S = cuda::to_int(x.dim(0), op);
    if (S == 0 || Nout == 0 || E == 0) return;  // E = 0 leaves no slot to any expert
    const float* bias_p = bias.defined() ? data<float>(bias) : nullptr;
    const bool bf16 = matmul_precision() == Precision::BF16;
    if (S > kMatvecMaxSlots && cuda::is_stored_weight(w, bf16)) {
        // Larger products read the weight decoded (one expert layer at a time, freed in stream
        // order after the product).
        grouped_matmul_impl(x, cuda::decode_weight(*this, w, bf16, op), bias, offsets, out);
        return;
    }
    if (S <= kMatvecMaxSlots) {
        const int64_t warps = static_cast<int64_t>(S) * Nout;
        cuda::with_float_data(x, [&](const auto* xp) {
            cuda::with_weight_reader(w, [&](auto wp) {
                grouped_matvec_kernel<<<cuda::blocks_for(warps * kWarp, kThreads), kThreads, 0,
                                        stream()>>>(xp, wp, bias_p, data<int32_t>(offsets), E, S,
                                                    Nout, K, bf16, data<float>(out));
            });
        });
    } else if (lt_grouped(*this, S, E, Nout, K, op)) {
        const cuda::Bf16Rows xa = gemm_rows(*this, x, K, op), wa = gemm_rows(*this, w, K, op);
        lt_grouped_forward(*this, xa.data, wa.data, bias_p, data<int32_t>(offsets), E, S, Nout, K,
                           data<float>(out), op);
        return;
    } else if (bf16) {
        const cuda::Bf16Rows xa = gemm_rows(*this, x, K, op), wa = gemm_rows(*this, w, K, op);
        const GroupedBf16Args args{.a = as_operand(xa),
                                   .b = as_operand(wa),
                                   .b_expert_stride = static_cast<int64_t>(Nout) * wa.ld,
                                   .bias = bias_p,
                                   .offsets = data<int32_t>(offsets),
                                   .E = E,
                                   .S = S,
                                   .R = K,
                                   .C = Nout,
                                   .accumulate = false,
                                   .out = data<float>(out)};
        allow_tile_shared_memory(grouped_gemm_bf16_kernel<true>, op);
        grouped_gemm_bf16_kernel<true><<<grouped_grid(S, E, Nout, op), bf16_gemm::kThreads,
                                         bf16_gemm::kSharedBytes, stream()>>>(args);
    } else {
        grouped_gemm_kernel<true><<<grouped_grid(S, E, Nout, op), kTileThreads, 0, stream()>>>(
            data<float>(x), data<float>(w), bias_p, data<int32_t>(offsets), E, S, K, Nout, false,
            data<float>(out));
    }
    check_launch(op);
}

void CudaBackend::grouped_matmul_backward_impl(const Tensor& x, const Tensor& w,
                                               const Tensor& offsets, const Tensor& d_out,
                                               const Tensor& d_x, const Tensor& d_w,
                                               const Tensor& d_bias) {
    const char* op = "grouped_matmul_backward";
    const int E = cuda::to_int(w.dim(0), op);
    const int Nout = cuda::to_int(w.dim(1), op), K = cuda::to_int(w.dim(2), op);
    const int S = cuda::to_int(x.dim(0), op);
    // Nothing to add without slots, experts or outputs (d_w and d_bias are then empty too).
    if (S == 0 || E == 0 || Nout == 0) return;
    const int32_t* off = data<int32_t>(offsets);
    if (matmul_precision() == Precision::BF16) {
        grouped_matmul_backward_bf16(x, w, off, E, S, Nout, K, d_out, d_x, d_w, d_bias);
        return;
    }
    if (K > 0) {
        // d_x[s, :] += d_out[s, :] . w[e]: the forward's kernel with w not transposed
        // (a = d_out [S, Nout], reduction over Nout, output columns K).
        grouped_gemm_kernel<false><<<grouped_grid(S, E, K, op), kTileThreads, 0, stream()>>>(
            data<float>(d_out), data<float>(w), nullptr, off, E, S, Nout, K, true,
            data<float>(d_x));
        check_launch(op);
    }
    // d_w (and d_bias); one k tile even when K = 0, whose blocks still sum d_bias.
    const dim3 grid = weight_grad_grid(E, Nout, std::max(K, 1), op);
    grouped_dw_kernel<<<grid, kTileThreads, 0, stream()>>>(
        data<float>(d_out), data<float>(x), off, S, Nout, K, data<float>(d_w),
        d_bias.defined() ? data<float>(d_bias) : nullptr);
    check_launch(op);
}

// grouped_matmul_backward in bf16 precision: the d_x and d_w products on tensor cores, d_bias
// from the fp32 d_out.
void CudaBackend::grouped_matmul_backward_bf16(const Tensor& x, const Tensor& w,
                                               const int32_t* offsets, int E, int S, int Nout,
                                               int K, const Tensor& d_out, const Tensor& d_x,
                                               const Tensor& d_w, const Tensor& d_bias) {
    const char* op = "grouped_matmul_backward";
    if (K > 0 && lt_grouped(*this, S, E, Nout, K, op)) {
        const cuda::Bf16Rows dy = gemm_rows(*this, d_out, Nout, op);
        const cuda::Bf16Rows wa = gemm_rows(*this, w, K, op), xa = gemm_rows(*this, x, K, op);
        lt_grouped_backward(*this, xa.data, wa.data, dy.data, offsets, E, S, Nout, K,
                            data<float>(d_x), data<float>(d_w), op);
    } else if (K > 0) {
        const cuda::Bf16Rows dy = gemm_rows(*this, d_out, Nout, op);
        {
            const cuda::Bf16Rows wa = gemm_rows(*this, w, K, op);
            const GroupedBf16Args args{.a = as_operand(dy),
                                       .b = as_operand(wa),
                                       .b_expert_stride = static_cast<int64_t>(Nout) * wa.ld,
                                       .bias = nullptr,
                                       .offsets = offsets,
                                       .E = E,
                                       .S = S,
                                       .R = Nout,
                                       .C = K,
                                       .accumulate = true,
                                       .out = data<float>(d_x)};
            allow_tile_shared_memory(grouped_gemm_bf16_kernel<false>, op);
            grouped_gemm_bf16_kernel<false><<<grouped_grid(S, E, K, op), bf16_gemm::kThreads,
                                              bf16_gemm::kSharedBytes, stream()>>>(args);
            check_launch(op);
        }
        const cuda::Bf16Rows xa = gemm_rows(*this, x, K, op);
        const dim3 grid = weight_grad_grid(E, Nout, K, op);
        allow_tile_shared_memory(grouped_dw_bf16_kernel, op);
        grouped_dw_bf16_kernel<<<grid, bf16_gemm::kThreads, bf16_gemm::kSharedBytes, stream()>>>(
            as_operand(dy), as_operand(xa), offsets, S, Nout, K, data<float>(d_w));
        check_launch(op);
    }
    if (d_bias.defined()) {
        if (E > kMaxGridY)
            throw Error(std::string("cuda: ") + op + ": " + std::to_string(E) +
                        " experts exceed the kernel's grid");
        const dim3 grid(cuda::blocks_for(Nout, kSumCols), static_cast<unsigned>(E));
        expert_bias_grad_kernel<<<grid, dim3(kSumCols, kSumLanes), 0, stream()>>>(
            data<float>(d_out), offsets, S, Nout, data<float>(d_bias));
        check_launch(op);
    }
}

}  // namespace tmx

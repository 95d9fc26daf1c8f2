// The grouped expert matmuls in bf16 precision, on tensor cores (WMMA, bf16 x bf16 -> fp32, sm_80
// and newer): the three products of grouped_matmul and its backward. Private to
// grouped_matmul.cu, which dispatches to them when the backend's matmul precision is BF16
// (engine/compute/backend.h states the contract: operands rounded to bf16, products summed in
// fp32, fp32 results).
//
// The operands are first rounded into bf16 copies with rows padded to a multiple of 8
// (matmul.cu: pad_to_bf16_rows), so that every 16-byte chunk is aligned: the kernels then copy
// them to shared memory with cp.async, kStages - 1 reduction steps ahead of the one multiplied.
// (A first version rounded fp32 loads on the way through registers, one step ahead: on the
// H100 it reached ~33 TFLOP/s, latency-bound.)
//
// A block computes a 128 x 128 output tile with 8 warps (2 along rows x 4 along columns), each
// warp a 64 x 32 block of 4 x 2 accumulator fragments of 16 x 16, the reduction 32 deep per
// step. Row tiles of the forward and d_x products are cut per expert
// (find_row_tile, as the fp32 kernels), so a tile never straddles two experts; d_w reduces over
// one expert's slots per block. Every output element is summed by one warp in a fixed order:
// deterministic, no atomics.
#pragma once

#include <cuda_bf16.h>
#include <mma.h>

#include <cstdint>
#include <type_traits>

#include "backends/cuda/async_copy.cuh"

namespace tmx::cuda::bf16_gemm {

namespace wmma = nvcuda::wmma;

constexpr int kTile = 128;     // output rows and columns per block
constexpr int kDepth = 32;     // reduction depth per stage
constexpr int kThreads = 256;  // 8 warps
constexpr int kWarpRows = 64, kWarpCols = 32;
constexpr int kFrag = 16;
constexpr int kFragRows = kWarpRows / kFrag, kFragCols = kWarpCols / kFrag;  // 4 x 2
constexpr int kChunk = 8;  // bf16 a thread copies at once: 16 bytes
constexpr int kChunksPerThread = kTile * kDepth / kChunk / kThreads;  // 2
static_assert(kChunksPerThread * kChunk * kThreads == kTile * kDepth);
static_assert((kTile / kWarpRows) * (kTile / kWarpCols) * 32 == kThreads);

// A staged operand in shared memory, in one of two shapes (both kTile x kDepth elements):
// "outer-major" [kTile][kDepth] when the global operand is contiguous along the reduction (a
// row of x, a row of w[e] in the forward), "depth-major" [kDepth][kTile] when it is contiguous
// along the output dimension. Rows are padded by 8 bf16 (16 bytes): WMMA needs the leading
// dimension a multiple of 8 and fragment pointers 32-byte aligned, which both pads keep.
template <bool kDepthMajor>
struct StageShape {
    static constexpr int kOuter = kDepthMajor ? kDepth : kTile;  // rows of the shared array
    static constexpr int kInner = kDepthMajor ? kTile : kDepth;  // contiguous elements per row
    static constexpr int kLd = kInner + 8;
    static constexpr int kElems = kOuter * kLd;
};
constexpr int kStageElems = StageShape<false>::kElems > StageShape<true>::kElems
                                ? StageShape<false>::kElems
                                : StageShape<true>::kElems;
constexpr int kStages = 3;  // reduction steps in flight: two loading while one is multiplied

// The dynamic shared memory of a block: kStages stages of both operands, reused after the
// loop as one 16 x 16 fp32 square per warp for the epilogue. 60 KiB: above the 48 KiB a
// kernel gets by default, so the launcher raises its limit (cudaFuncSetAttribute).
constexpr int kSharedBytes = 2 * kStages * kStageElems * 2;
static_assert(kSharedBytes >= kThreads / 32 * kFrag * kFrag * 4);

// A bf16 operand in global memory: element (outer, inner) at p[outer * ld + inner]. Rows are
// padded to ld, a multiple of 8 with zeros past the logical row (pad_to_bf16_rows), so every
// 16-byte chunk is aligned and either wholly inside a row or past it.
struct Operand {
    const __nv_bfloat16* p;
    int64_t ld;
};

// Starts loading a stage: the elements (outer, inner) for outer in [outer0, outer0 +
// Shape::kOuter), inner in [inner0, inner0 + Shape::kInner), zeros where outer >= outer_end
// or inner >= g.ld.
template <bool kDepthMajor>
__device__ __forceinline__ void load_stage_async(__nv_bfloat16* s, Operand g, int outer0,
                                                 int outer_end, int inner0) {
    using Shape = StageShape<kDepthMajor>;
    constexpr int kChunksPerRow = Shape::kInner / kChunk;
#pragma unroll
    for (int i = 0; i < kChunksPerThread; ++i) {
        const int id = static_cast<int>(threadIdx.x) + i * kThreads;
        const int row = id / kChunksPerRow, chunk = (id % kChunksPerRow) * kChunk;
        const int outer = outer0 + row, inner = inner0 + chunk;
        const bool in_range = outer < outer_end && inner < g.ld;
        copy16_async(s + row * Shape::kLd + chunk,
                     in_range ? g.p + static_cast<int64_t>(outer) * g.ld + inner : g.p, in_range);
    }
}

// The three products, as (A, B) operand layouts over a [rows, cols] output tile and a
// reduction index d:
//   Forward  out[s, c] = sum_r x[s, r] w[e][c, r]: A = x rows (outer-major), B = w[e] rows
//            (outer-major: column c's reduction is contiguous), matrix_b col_major.
//   DataGrad d_x[s, c] += sum_r d_out[s, r] w[e][r, c]: A as above, B = w[e] (depth-major),
//            matrix_b row_major.
//   WeightGrad d_w[e][n, k] += sum_s d_out[s, n] x[s, k]: A = d_out (depth-major, the slots are
//            the reduction), matrix_a col_major; B = x (depth-major), matrix_b row_major.
enum class Product { Forward, DataGrad, WeightGrad };

template <Product P>
struct Layout {
    static constexpr bool kADepthMajor = P == Product::WeightGrad;
    static constexpr bool kBDepthMajor = P != Product::Forward;
    using AFrag = wmma::fragment<
        wmma::matrix_a, kFrag, kFrag, kFrag, __nv_bfloat16,
        typename std::conditional<kADepthMajor, wmma::col_major, wmma::row_major>::type>;
    using BFrag = wmma::fragment<
        wmma::matrix_b, kFrag, kFrag, kFrag, __nv_bfloat16,
        typename std::conditional<kBDepthMajor, wmma::row_major, wmma::col_major>::type>;
    // Fragment at output row m (column n), reduction step d, of a staged operand.
    __device__ static const __nv_bfloat16* a_at(const __nv_bfloat16* s, int m, int d) {
        return kADepthMajor ? s + d * StageShape<true>::kLd + m
                            : s + m * StageShape<false>::kLd + d;
    }
    __device__ static const __nv_bfloat16* b_at(const __nv_bfloat16* s, int n, int d) {
        return kBDepthMajor ? s + d * StageShape<true>::kLd + n
                            : s + n * StageShape<false>::kLd + d;
    }
};

using Accum = wmma::fragment<wmma::accumulator, kFrag, kFrag, kFrag, float>;

// The main loop of a block: acc = A . B over the reduction [d_begin, d_end), in steps of
// kDepth, kStages - 1 steps loading ahead of the one being multiplied. load_a / load_b
// (d0, shared stage) start one step's copies of each operand.
template <Product P, typename LoadA, typename LoadB>
__device__ __forceinline__ void multiply(__nv_bfloat16* smem, int d_begin, int d_end, LoadA load_a,
                                         LoadB load_b, Accum (&acc)[kFragRows][kFragCols]) {
    using L = Layout<P>;
    const auto stage_a = [smem](int i) { return smem + i * kStageElems; };
    const auto stage_b = [smem](int i) { return smem + (kStages + i) * kStageElems; };
    const int warp = static_cast<int>(threadIdx.x) / 32;
    const int wm = (warp / (kTile / kWarpCols)) * kWarpRows;
    const int wn = (warp % (kTile / kWarpCols)) * kWarpCols;
#pragma unroll
    for (int i = 0; i < kFragRows; ++i)
#pragma unroll
        for (int j = 0; j < kFragCols; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
    const int steps = (d_end - d_begin + kDepth - 1) / kDepth;
#pragma unroll
    for (int i = 0; i < kStages - 1; ++i) {
        if (i < steps) {
            load_a(d_begin + i * kDepth, stage_a(i));
            load_b(d_begin + i * kDepth, stage_b(i));
        }
        commit_async();  // an empty group past the end keeps the count uniform
    }
    for (int step = 0; step < steps; ++step) {
        wait_async<kStages - 2>();  // this step's copies have landed (this thread's) ...
        __syncthreads();            // ... and everyone's; the stage loaded below is free
        const int next = step + kStages - 1;
        if (next < steps) {
            load_a(d_begin + next * kDepth, stage_a(next % kStages));
            load_b(d_begin + next * kDepth, stage_b(next % kStages));
        }
        commit_async();
        const __nv_bfloat16* sa = stage_a(step % kStages);
        const __nv_bfloat16* sb = stage_b(step % kStages);
#pragma unroll
        for (int d = 0; d < kDepth; d += kFrag) {
            typename L::AFrag fa[kFragRows];
            typename L::BFrag fb[kFragCols];
#pragma unroll
            for (int i = 0; i < kFragRows; ++i)
                wmma::load_matrix_sync(
                    fa[i], L::a_at(sa, wm + i * kFrag, d),
                    L::kADepthMajor ? StageShape<true>::kLd : StageShape<false>::kLd);
#pragma unroll
            for (int j = 0; j < kFragCols; ++j)
                wmma::load_matrix_sync(
                    fb[j], L::b_at(sb, wn + j * kFrag, d),
                    L::kBDepthMajor ? StageShape<true>::kLd : StageShape<false>::kLd);
#pragma unroll
            for (int i = 0; i < kFragRows; ++i)
#pragma unroll
                for (int j = 0; j < kFragCols; ++j)
                    wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
    }
    wait_async<0>();
    __syncthreads();  // every warp is done with the stages: emit_tile may reuse them
}

// Hands each accumulated element to `emit(row, col, value)`, row and col within the block's
// tile (the caller bounds-checks them). Each warp goes through its fragments one at a time via
// its own 16 x 16 square of shared memory; call after multiply()'s last barrier. Each emit
// round covers two whole 16-column rows of a fragment (half a warp each), so the stores of a
// row-major output fill whole 32-byte sectors: with each lane owning 8 columns of a row, a
// first version made 8 partial writes per sector and saturated the L2 (ncu on the H100).
template <typename Emit>
__device__ __forceinline__ void emit_tile(__nv_bfloat16* smem, Accum (&acc)[kFragRows][kFragCols],
                                          Emit emit) {
    const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
    const int wm = (warp / (kTile / kWarpCols)) * kWarpRows;
    const int wn = (warp % (kTile / kWarpCols)) * kWarpCols;
    float* square = reinterpret_cast<float*>(smem) + warp * kFrag * kFrag;
    const int half = lane / kFrag, col = lane % kFrag;
#pragma unroll
    for (int i = 0; i < kFragRows; ++i)
#pragma unroll
        for (int j = 0; j < kFragCols; ++j) {
            wmma::store_matrix_sync(square, acc[i][j], kFrag, wmma::mem_row_major);
            __syncwarp();
#pragma unroll
            for (int r = half; r < kFrag; r += 2)
                emit(wm + i * kFrag + r, wn + j * kFrag + col, square[r * kFrag + col]);
            __syncwarp();
        }
}

}  // namespace tmx::cuda::bf16_gemm

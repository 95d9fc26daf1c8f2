// What the CUDA backend's matmul files (cublaslt_matmul.cu, matmul.cu, weight_matmul.cu,
// grouped_matmul.cu) share: the cuBLASLt product, the bias-rows start of a GEMM, a block's
// column sums and the bf16 rounding of matrix-vector operands.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_common.cuh"

namespace tmx::cuda {

// out [M, N] = op(a) . op(b) (+ bias[N]) + beta * out on cuBLASLt (cublaslt_matmul.cu, which
// says how); false, having launched nothing, when the heuristic has no algorithm for it.
bool lt_matmul(const CudaBackend& be, cudaDataType_t operand_type, const void* a, const void* b,
               float* out, const float* bias, int64_t M, int64_t N, int64_t K, bool trans_a,
               bool trans_b, float beta, bool varying_size = false);
// out[m, n] = (keep ? out[m, n] : 0) + (bias ? bias[n] : 0) (cublaslt_matmul.cu).
void launch_bias_rows(CudaBackend& be, float* out, const float* bias, int64_t M, int64_t N,
                      bool keep, const char* op);

constexpr int kSumCols = 32;  // columns per block: a warp reads a row's 32 floats
constexpr int kSumLanes = 8;  // rows walked side by side: a 32 x 8 block
constexpr int64_t kMaxGridY = 65535;

// Sum in double of x[r, col] over rows [row_begin, row_end) of x [*, N]: thread (tx, ty) adds
// rows row_begin + ty, + 8, ... in order, then the ty == 0 threads add the 8 partials in ty
// order. A fixed order: deterministic. The result is valid in the ty == 0 threads; every thread
// of the block calls it (col >= N adds nothing).
inline __device__ double block_column_sum(const float* x, int64_t N, int64_t row_begin,
                                          int64_t row_end, int64_t col) {
    __shared__ double partial[kSumLanes][kSumCols];
    double acc = 0.0;
    if (col < N) {
#pragma unroll 4
        for (int64_t r = row_begin + threadIdx.y; r < row_end; r += kSumLanes)
            acc += x[r * N + col];
    }
    partial[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    double sum = 0.0;
    if (threadIdx.y == 0)
        for (int i = 0; i < kSumLanes; ++i) sum += partial[i][threadIdx.x];
    return sum;
}

// An operand element as a matrix-vector kernel multiplies it: F32 rounded to bf16 in bf16
// precision (round_bf16), a BF16 one as it is.
__device__ __forceinline__ float maybe_bf16(float v, bool round_bf16) {
    return round_bf16 ? __bfloat162float(__float2bfloat16_rn(v)) : v;
}
__device__ __forceinline__ float maybe_bf16(__nv_bfloat16 v, bool) {
    return cuda::to_float(v);
}

}  // namespace tmx::cuda

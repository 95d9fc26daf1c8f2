// Helpers shared by the CUDA backend's kernels (.cu files only).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "backends/cuda/cuda_backend.h"

namespace tmx::cuda {

// Checks a CUDA runtime or cuBLAS call inside an op: TMX_CUDA_CHECK("matmul", cublasLtMatmul(...)).
#define TMX_CUDA_CHECK(op, call) ::tmx::cuda::check((call), (op), #call)

constexpr int kWarp = 32;

// Blocks of `threads` covering n items, at most 2^31 - 1 blocks (grid-stride loops cover the
// rest). n > 0.
inline unsigned blocks_for(int64_t n, int threads) {
    const int64_t b = (n + threads - 1) / threads;
    return static_cast<unsigned>(b < INT32_MAX ? b : INT32_MAX);
}

// Blocks of `threads` for a grid-stride loop over n elements: enough to fill the device (2048
// resident threads per SM on sm_89 and sm_90, twice over), no more. n > 0.
inline unsigned elementwise_blocks(int64_t n, int threads, int sm_count) {
    const int64_t full = static_cast<int64_t>(sm_count) * (2 * 2048 / threads);
    return static_cast<unsigned>(std::min<int64_t>(blocks_for(n, threads), full));
}

__device__ __forceinline__ int64_t grid_start() {
    return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_stride() {
    return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

// A size that must fit in 32 bits for a kernel's index arithmetic: throws naming the op.
inline int to_int(int64_t v, const char* op) {
    if (v < 0 || v > std::numeric_limits<int>::max())
        throw std::logic_error(std::string("cuda ") + op + ": size " + std::to_string(v) +
                               " does not fit a 32-bit index");
    return static_cast<int>(v);
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = kWarp / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ double warp_sum(double v) {
    for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Sum of v over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the
// result. `shared` holds at least 32 values. Call from every thread of the block.
template <typename T>
__device__ T block_sum(T v, T* shared) {
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
    const int n_warps = blockDim.x / kWarp;
    v = warp_sum(v);
    __syncthreads();  // `shared` may still be read from a previous call
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < n_warps ? shared[lane] : T(0);
    return warp_sum(v);
}

// Max of v over the block; as block_sum.
__device__ __forceinline__ float block_max(float v, float* shared) {
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
    const int n_warps = blockDim.x / kWarp;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < n_warps ? shared[lane] : -INFINITY;
    return warp_max(v);
}

// Records an invalid input in the backend's status word: {code, value, limit}; the first
// error wins. The host throws it at the next sync point (CudaBackend::check_status).
__device__ __forceinline__ void report_error(int* status, int code, int value, int limit) {
    if (atomicCAS(status, 0, code) == 0) {
        status[1] = value;
        status[2] = limit;
    }
}

// t's elements as rows of `cols` (its last dimension), rounded to bf16 (nearest even) into pool
// memory, each row padded with zeros to ld (a multiple of 8, at least cols) so that every
// 16-byte chunk is aligned: the operands of the tensor-core kernels (defined in matmul.cu).
// `storage` keeps the memory.
struct Bf16Rows {
    Tensor storage;
    const __nv_bfloat16* data = nullptr;
    int64_t ld = 0;
};
Bf16Rows pad_to_bf16_rows(CudaBackend& be, const Tensor& t, int64_t cols, int64_t ld,
                          const char* op);

}  // namespace tmx::cuda

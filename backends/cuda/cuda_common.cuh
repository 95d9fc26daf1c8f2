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

// ---- float element types: an F32 tensor holds float, a BF16 one __nv_bfloat16

// An element as the fp32 value it holds. A bf16 widens by taking its 16 bits as the upper half
// of a float, as the CPU does: exact for every pattern, NaN payloads included
// (__bfloat162float becomes cvt.f32.bf16 on sm_90, which PTX lets canonicalise a NaN).
__device__ __forceinline__ float to_float(float v) {
    return v;
}
__device__ __forceinline__ float to_float(__nv_bfloat16 v) {
    return __uint_as_float(static_cast<uint32_t>(__bfloat16_as_ushort(v)) << 16);
}

// Stores v as the element type: a float as it is, a bf16 rounded to nearest even (the CPU's
// round_to_bf16), so a BF16 out holds exactly the rounding of what an F32 out would.
__device__ __forceinline__ void store_as(float* p, float v) {
    *p = v;
}
__device__ __forceinline__ void store_as(__nv_bfloat16* p, float v) {
    *p = __float2bfloat16_rn(v);
}

// 8 elements at p (16-byte aligned) as floats, read in 16-byte loads.
template <typename T>
__device__ __forceinline__ void load8_aligned(const T* p, float (&f)[8]) {
    constexpr int kVecs = 8 * sizeof(T) / 16;
    uint4 raw[kVecs];
#pragma unroll
    for (int j = 0; j < kVecs; ++j) raw[j] = reinterpret_cast<const uint4*>(p)[j];
    const T* v = reinterpret_cast<const T*>(raw);
#pragma unroll
    for (int c = 0; c < 8; ++c) f[c] = to_float(v[c]);
}

// 8 floats stored at p (16-byte aligned) as T (store_as), in 16-byte stores.
template <typename T>
__device__ __forceinline__ void store8_aligned(T* p, const float (&f)[8]) {
    constexpr int kVecs = 8 * sizeof(T) / 16;
    uint4 raw[kVecs];
    T* v = reinterpret_cast<T*>(raw);
#pragma unroll
    for (int c = 0; c < 8; ++c) store_as(v + c, f[c]);
#pragma unroll
    for (int j = 0; j < kVecs; ++j) reinterpret_cast<uint4*>(p)[j] = raw[j];
}

inline bool aligned16(const void* p) {
    return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Calls f with t's data as float* (F32) or __nv_bfloat16* (BF16): launches a kernel templated
// on the element type of a tensor that may be either.
template <typename F>
void with_float_data(const Tensor& t, F&& f) {
    if (t.dtype() == DType::BF16)
        f(CudaBackend::data<__nv_bfloat16>(t));
    else
        f(CudaBackend::data<float>(t));
}

// t's elements as rows of `cols` (its last dimension) in bf16, F32 rounded to nearest even and
// BF16 copied exactly, into pool memory, each row padded with zeros to ld (a multiple of 8, at
// least cols) so that every 16-byte chunk is aligned: the operands of the tensor-core kernels
// (defined in matmul.cu). `storage` keeps the memory.
struct Bf16Rows {
    Tensor storage;
    const __nv_bfloat16* data = nullptr;
    int64_t ld = 0;
};
Bf16Rows pad_to_bf16_rows(CudaBackend& be, const Tensor& t, int64_t cols, int64_t ld,
                          const char* op);

}  // namespace tmx::cuda

// The CUDA backend's optimizer support: sum_squares (the gradient norm for clipping), scale,
// and AdamW, each one pass over a flat buffer of up to ~2e9 elements (64-bit indices). Their
// CPU twins are in backends/cpu/cpu_backend.cpp; AdamW's per-element update is shared with the
// host in cuda_math.h (tested there with g++).
#include <algorithm>
#include <cstdint>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/cuda_math.h"

namespace tmx {
namespace {

constexpr int kThreads = 256;

// sum_squares: a fixed number of partial sums, chosen from n alone (not from the device), so
// that the order of the additions, hence the result, is the same on every GPU and every run.
// 1024 blocks of 256 threads fill an H100 (132 SMs x 2048 threads); one block of 1024 threads
// then sums the partials.
constexpr int kSumBlocks = 1024;
constexpr int kFinalThreads = 1024;
static_assert(kSumBlocks <= kFinalThreads, "the final pass reads one partial per thread");

// Elementwise launches: a grid-stride loop in blocks of kThreads.
unsigned elementwise_blocks(int64_t n, int sm_count) {
    return cuda::elementwise_blocks(n, kThreads, sm_count);
}
using cuda::grid_start;
using cuda::grid_stride;

// partial[block] = sum of x[i]^2 over the block's grid-stride elements, in double: each thread
// sums its elements in index order, then the block adds the threads in a fixed tree order.
__global__ void sum_squares_partial_kernel(const float* x, int64_t n, double* partial) {
    __shared__ double shared[cuda::kWarp];
    double s = 0.0;
    for (int64_t i = grid_start(); i < n; i += grid_stride()) {
        const double v = x[i];
        s += v * v;
    }
    s = cuda::block_sum(s, shared);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// out[0] = sum of the partials (one block; count <= blockDim.x), rounded to float once.
__global__ void sum_squares_final_kernel(const double* partial, int count, float* out) {
    __shared__ double shared[cuda::kWarp];
    const double s = cuda::block_sum(threadIdx.x < count ? partial[threadIdx.x] : 0.0, shared);
    if (threadIdx.x == 0) out[0] = static_cast<float>(s);
}

__global__ void scale_kernel(float* x, int64_t n, float s) {
    for (int64_t i = grid_start(); i < n; i += grid_stride()) x[i] *= s;
}

__global__ void adamw_kernel(float* params, const float* grads, float grad_scale, float* m,
                             float* v, int64_t n, cuda::AdamWCoefficients c) {
    for (int64_t i = grid_start(); i < n; i += grid_stride()) {
        float p = params[i], mi = m[i], vi = v[i];
        cuda::adamw_update(p, mi, vi, grads[i] * grad_scale, c);
        params[i] = p;
        m[i] = mi;
        v[i] = vi;
    }
}

}  // namespace

void CudaBackend::sum_squares_impl(const Tensor& x, const Tensor& out) {
    const int64_t n = x.numel();
    float* o = data<float>(out);
    if (n == 0) {
        TMX_CUDA_CHECK("sum_squares", cudaMemsetAsync(o, 0, sizeof(float), stream()));
        check_launch("sum_squares");
        return;
    }
    const int blocks =
        static_cast<int>(std::min<int64_t>(cuda::blocks_for(n, kThreads), kSumBlocks));
    Tensor partial = alloc({2 * blocks}, DType::F32);  // `blocks` doubles
    double* partial_p = data<double>(partial);
    sum_squares_partial_kernel<<<blocks, kThreads, 0, stream()>>>(data<float>(x), n, partial_p);
    check_launch("sum_squares");
    sum_squares_final_kernel<<<1, kFinalThreads, 0, stream()>>>(partial_p, blocks, o);
    check_launch("sum_squares");
}

void CudaBackend::scale_impl(const Tensor& x, float s) {
    const int64_t n = x.numel();
    if (n == 0) return;
    scale_kernel<<<elementwise_blocks(n, device().sm_count), kThreads, 0, stream()>>>(
        data<float>(x), n, s);
    check_launch("scale");
}

void CudaBackend::adamw_impl(const Tensor& params, const Tensor& grads, const Tensor& m,
                             const Tensor& v, const AdamWParams& hp) {
    const int64_t n = params.numel();
    if (n == 0) return;
    const cuda::AdamWCoefficients c =
        cuda::adamw_coefficients(hp.lr, hp.beta1, hp.beta2, hp.eps, hp.weight_decay, hp.step);
    adamw_kernel<<<elementwise_blocks(n, device().sm_count), kThreads, 0, stream()>>>(
        data<float>(params), data<float>(grads), hp.grad_scale, data<float>(m), data<float>(v), n,
        c);
    check_launch("adamw");
}

}  // namespace tmx

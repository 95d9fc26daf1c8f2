// The CUDA backend's matmuls against weights stored in bf16, f16 and Q8_0 (linear() on a stored
// weight): decoding's few rows read the weight once, as stored, in a matrix-vector kernel; more
// rows multiply a decoded copy on the dense matmul (matmul.cu). The CPU twin is
// backends/cpu/weight_matmul.cpp.
#include <cuda_bf16.h>

#include <cstdint>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/matmul_common.cuh"
#include "backends/cuda/weights.cuh"

namespace tmx {
namespace {

using cuda::kWarp;
using cuda::maybe_bf16;

constexpr int kThreads = 256;

// Up to this many rows of x, linear() on a 16- or 8-bit weight reads it once with the kernel
// below (decoding: one row per sequence); above, the weight is decoded into a matmul operand.
constexpr int kWeightMatvecMaxRows = 16;

// out[m, n] = (accumulate ? out[m, n] : 0) + x[m, :] . w[n, :] (+ bias[n]) for m < M <=
// kWeightMatvecMaxRows, one warp per n: the lanes stride along the weight row, each weight
// element read once for all M rows of x, and a butterfly (fixed order) adds the lanes. Operands
// are rounded to bf16 as they are read in bf16 precision, as grouped_matvec_kernel's.
template <typename XT, typename WR>
__global__ void weight_matvec_kernel(const XT* x, WR w, const float* bias, int M, int N, int K,
                                     bool accumulate, bool round_bf16, float* out) {
    const int64_t n = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
    const int lane = static_cast<int>(threadIdx.x % kWarp);
    if (n >= N) return;  // whole warps
    float acc[kWeightMatvecMaxRows] = {};
    const int64_t row = n * K;
    for (int k = lane; k < K; k += kWarp) {
        const float wv = maybe_bf16(w[row + k], round_bf16);
#pragma unroll
        for (int m = 0; m < kWeightMatvecMaxRows; ++m)
            if (m < M)
                acc[m] =
                    fmaf(maybe_bf16(x[static_cast<int64_t>(m) * K + k], round_bf16), wv, acc[m]);
    }
#pragma unroll
    for (int m = 0; m < kWeightMatvecMaxRows; ++m) {
        if (m >= M) break;  // M is the same for every lane
        float v = cuda::warp_sum(acc[m]);
        if (lane == 0) {
            if (bias) v += bias[n];
            float* o = out + static_cast<int64_t>(m) * N + n;
            *o = accumulate ? *o + v : v;
        }
    }
}

// out[i] = w[i] for n elements: a stored weight decoded to F32, or rounded on to BF16.
template <typename WR, typename Out>
__global__ void decode_weight_kernel(WR w, int64_t n, Out* out) {
    for (int64_t i = cuda::grid_start(); i < n; i += cuda::grid_stride())
        cuda::store_as(out + i, w[i]);
}

}  // namespace

Tensor cuda::decode_weight(CudaBackend& be, const Tensor& t, bool to_bf16, const char* op) {
    Tensor out = be.alloc(t.shape(), to_bf16 ? DType::BF16 : DType::F32);
    const int64_t n = t.numel();
    if (n == 0) return out;
    const unsigned blocks = cuda::elementwise_blocks(n, kThreads, be.device().sm_count);
    with_weight_reader(t, [&](auto w) {
        if (to_bf16)
            decode_weight_kernel<<<blocks, kThreads, 0, be.stream()>>>(
                w, n, CudaBackend::data<__nv_bfloat16>(out));
        else
            decode_weight_kernel<<<blocks, kThreads, 0, be.stream()>>>(
                w, n, CudaBackend::data<float>(out));
    });
    be.check_launch(op);
    return out;
}

// A weight in a format the dense matmul does not read (cuda::is_stored_weight): up to
// kWeightMatvecMaxRows rows of x, read as stored by the matrix-vector kernel; more, decoded
// into a matmul operand first (for one product: no copy of the model). Else the dense matmul.
void CudaBackend::linear_impl(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y,
                              bool accumulate) {
    const char* op = "linear";
    const bool bf16 = matmul_precision() == Precision::BF16;
    if (!cuda::is_stored_weight(w, bf16)) {
        Backend::linear_impl(x, w, b, y, accumulate);
        return;
    }
    const int64_t M = x.dim(0), N = w.dim(0), K = w.dim(1);
    if (M == 0 || N == 0) return;
    if (M > kWeightMatvecMaxRows) {
        matmul_impl(x, cuda::decode_weight(*this, w, bf16, op), y,
                    {.trans_b = true, .accumulate = accumulate}, b);
        return;
    }
    const int n = cuda::to_int(N, op), k = cuda::to_int(K, op);
    cuda::with_float_data(x, [&](const auto* xp) {
        cuda::with_weight_reader(w, [&](auto wr) {
            weight_matvec_kernel<<<cuda::blocks_for(N * kWarp, kThreads), kThreads, 0, stream()>>>(
                xp, wr, b.defined() ? data<float>(b) : nullptr, static_cast<int>(M), n, k,
                accumulate, bf16, data<float>(y));
        });
    });
    check_launch(op);
}

}  // namespace tmx

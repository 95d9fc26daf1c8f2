// CUDA layernorm and rmsnorm over the last dimension, forward and backward (CPU twin:
// backends/cpu/norm.cpp). Statistics in fp32, computed in two passes so that a large common
// offset in a row does not cancel. The forward's out may be BF16: the fp32 result, rounded.
//
// Rows: one warp per row, the row re-read from memory (L1/L2) at each pass instead of held in
// registers, so any d works with the same code. Weight and bias gradients are column sums over
// all rows: per-chunk partial sums (a fixed range of rows each) into scratch, then a second
// kernel adds the chunks in order. No atomics; the chunking depends only on N, so results are
// the same from run to run and from GPU to GPU.
#include <algorithm>
#include <cstdint>

#include "backends/cuda/cuda_common.cuh"

namespace tmx {
namespace {

using cuda::kWarp;

constexpr int kRowsPerBlock = 4;  // warps per block, one row each
constexpr int kColumnThreads = 256;
// Column sums: at most this many row chunks (the partials are [chunks, d]), each of at least
// kMinRowsPerChunk rows (fewer rows would leave a thread too little work to hide latency).
constexpr int64_t kMaxChunks = 256;
constexpr int64_t kMinRowsPerChunk = 32;

struct RowStats {
    float mean, rstd;
};

// A row's mean (0 for rmsnorm, which does not centre) and 1 / sqrt(var + eps), where var is the
// mean square about that mean, as the CPU's row_stats(). Computed by one warp; every lane gets
// the same values (warp_sum's butterfly adds the same pairs on every lane).
// The first pass sums x - x[0] rather than x, so its partial sums stay on the scale of the
// row's spread, not of its mean (rows of 1000 + N(0, 1) would otherwise lose ~1e-4 of the
// spread to rounding). The second pass is about the mean: no E[x^2] - E[x]^2 cancellation.
template <bool kLayerNorm>
__device__ RowStats row_stats(const float* row, int d, float eps) {
    const int lane = threadIdx.x % kWarp;
    float mean = 0.0f;
    if (kLayerNorm) {
        const float shift = row[0];
        float s = 0.0f;
        for (int i = lane; i < d; i += kWarp) s += row[i] - shift;
        mean = shift + cuda::warp_sum(s) / static_cast<float>(d);
    }
    float v = 0.0f;
    for (int i = lane; i < d; i += kWarp) {
        const float c = row[i] - mean;
        v += c * c;
    }
    const float var = cuda::warp_sum(v) / static_cast<float>(d);
    return {mean, 1.0f / sqrtf(var + eps)};  // sqrtf is correctly rounded (no fast math)
}

// The row loop of the kernels below: warp w of block b takes row b * kRowsPerBlock + w, then
// strides by the grid. A row index is the same on all lanes of a warp, so whole warps enter and
// leave the loop together (warp_sum needs all 32 lanes).
__device__ __forceinline__ int64_t first_row() {
    return static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
}
__device__ __forceinline__ int64_t row_stride() {
    return static_cast<int64_t>(gridDim.x) * kRowsPerBlock;
}

// out = (x - mean) * rstd * weight (+ bias). bias is read only for layernorm. OutT: float, or
// __nv_bfloat16 for a BF16 out (the fp32 value rounded as it is stored).
template <bool kLayerNorm, typename OutT>
__global__ void norm_kernel(const float* x, const float* weight, const float* bias, OutT* out,
                            int64_t N, int d, float eps) {
    const int lane = threadIdx.x % kWarp;
    for (int64_t n = first_row(); n < N; n += row_stride()) {
        const float* row = x + n * d;
        OutT* dst = out + n * d;
        const RowStats s = row_stats<kLayerNorm>(row, d, eps);
        // Each lane reads x[i] before writing out[i] and no other lane touches i: safe even
        // when out aliases x.
        for (int i = lane; i < d; i += kWarp) {
            const float y = (row[i] - s.mean) * s.rstd * weight[i];
            cuda::store_as(dst + i, kLayerNorm ? y + bias[i] : y);
        }
    }
}

// d_x += rstd * (g*w - mean(g*w) - xhat * mean(g*w*xhat)), the first mean only for layernorm
// (its output does not depend on a shift of x). Saves each row's mean and rstd for the column
// sums.
template <bool kLayerNorm>
__global__ void norm_backward_rows_kernel(const float* x, const float* weight, const float* dy,
                                          float* dx, float* means, float* rstds, int64_t N, int d,
                                          float eps) {
    const int lane = threadIdx.x % kWarp;
    for (int64_t n = first_row(); n < N; n += row_stride()) {
        const float* row = x + n * d;
        const float* g = dy + n * d;
        const RowStats s = row_stats<kLayerNorm>(row, d, eps);
        if (lane == 0) {
            means[n] = s.mean;
            rstds[n] = s.rstd;
        }
        float sum_gw = 0.0f, sum_gwx = 0.0f;
        for (int i = lane; i < d; i += kWarp) {
            const float gw = g[i] * weight[i];
            sum_gw += gw;
            sum_gwx += gw * ((row[i] - s.mean) * s.rstd);
        }
        const float mean_gw = kLayerNorm ? cuda::warp_sum(sum_gw) / static_cast<float>(d) : 0.0f;
        const float mean_gwx = cuda::warp_sum(sum_gwx) / static_cast<float>(d);
        float* dst = dx + n * d;
        for (int i = lane; i < d; i += kWarp) {
            const float xhat = (row[i] - s.mean) * s.rstd;
            dst[i] += s.rstd * (g[i] * weight[i] - mean_gw - xhat * mean_gwx);
        }
    }
}

// Partial column sums over the rows of chunk blockIdx.y, in row order: one thread per column
// (a warp reads 32 consecutive columns of a row: coalesced).
// partial_w[chunk, i] = sum g * xhat; partial_b[chunk, i] = sum g (layernorm only).
template <bool kLayerNorm>
__global__ void norm_backward_columns_kernel(const float* x, const float* dy, const float* means,
                                             const float* rstds, float* partial_w, float* partial_b,
                                             int64_t N, int d, int64_t rows_per_chunk) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= d) return;
    const int64_t chunk = blockIdx.y;
    const int64_t first = chunk * rows_per_chunk;
    const int64_t last = first + rows_per_chunk < N ? first + rows_per_chunk : N;
    float sw = 0.0f, sb = 0.0f;
    for (int64_t n = first; n < last; ++n) {
        const float g = dy[n * d + i];
        sw += g * ((x[n * d + i] - means[n]) * rstds[n]);  // xhat exactly as the rows kernel
        if (kLayerNorm) sb += g;
    }
    partial_w[chunk * d + i] = sw;
    if (kLayerNorm) partial_b[chunk * d + i] = sb;
}

// d_weight[i] += sum over chunks of partial_w[chunk, i], in chunk order (likewise d_bias).
// The chunk sums are added in double: they are few, and this keeps the final rounding to one.
template <bool kLayerNorm>
__global__ void norm_backward_finish_kernel(const float* partial_w, const float* partial_b,
                                            float* d_weight, float* d_bias, int chunks, int d) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= d) return;
    double sw = 0.0, sb = 0.0;
    for (int c = 0; c < chunks; ++c) {
        sw += partial_w[static_cast<int64_t>(c) * d + i];
        if (kLayerNorm) sb += partial_b[static_cast<int64_t>(c) * d + i];
    }
    d_weight[i] += static_cast<float>(sw);
    if (kLayerNorm) d_bias[i] += static_cast<float>(sb);
}

}  // namespace

void CudaBackend::norm_impl(NormType type, const Tensor& x, const Tensor& weight,
                            const Tensor& bias, float eps, const Tensor& out) {
    const char* op = "norm";
    const int64_t N = x.dim(0);
    const int d = cuda::to_int(x.dim(1), op);
    if (N == 0 || d == 0) return;
    const unsigned blocks = cuda::blocks_for(N, kRowsPerBlock);
    const int threads = kRowsPerBlock * kWarp;
    cuda::with_float_data(out, [&](auto* o) {
        if (type == NormType::LayerNorm)
            norm_kernel<true><<<blocks, threads, 0, stream()>>>(data<float>(x), data<float>(weight),
                                                                data<float>(bias), o, N, d, eps);
        else
            norm_kernel<false><<<blocks, threads, 0, stream()>>>(
                data<float>(x), data<float>(weight), nullptr, o, N, d, eps);
    });
    check_launch(op);
}

void CudaBackend::norm_backward_impl(NormType type, const Tensor& x, const Tensor& weight,
                                     const Tensor& d_out, float eps, const Tensor& d_x,
                                     const Tensor& d_weight, const Tensor& d_bias) {
    const char* op = "norm_backward";
    const int64_t N = x.dim(0);
    const int d = cuda::to_int(x.dim(1), op);
    if (N == 0 || d == 0) return;
    const bool layernorm = type == NormType::LayerNorm;

    // Per-row statistics, saved by the rows kernel for the column sums.
    Tensor means = alloc({N}, DType::F32), rstds = alloc({N}, DType::F32);
    const unsigned row_blocks = cuda::blocks_for(N, kRowsPerBlock);
    const int row_threads = kRowsPerBlock * kWarp;
    if (layernorm)
        norm_backward_rows_kernel<true><<<row_blocks, row_threads, 0, stream()>>>(
            data<float>(x), data<float>(weight), data<float>(d_out), data<float>(d_x),
            data<float>(means), data<float>(rstds), N, d, eps);
    else
        norm_backward_rows_kernel<false><<<row_blocks, row_threads, 0, stream()>>>(
            data<float>(x), data<float>(weight), data<float>(d_out), data<float>(d_x),
            data<float>(means), data<float>(rstds), N, d, eps);
    check_launch(op);

    // Column sums: chunks of rows_per_chunk rows (a function of N only: reproducible).
    const int64_t rows_per_chunk = std::max(kMinRowsPerChunk, (N + kMaxChunks - 1) / kMaxChunks);
    const int chunks = static_cast<int>((N + rows_per_chunk - 1) / rows_per_chunk);  // <= 256
    Tensor partial_w = alloc({chunks, d}, DType::F32);
    Tensor partial_b = layernorm ? alloc({chunks, d}, DType::F32) : Tensor{};
    const dim3 column_grid(cuda::blocks_for(d, kColumnThreads), static_cast<unsigned>(chunks));
    if (layernorm)
        norm_backward_columns_kernel<true><<<column_grid, kColumnThreads, 0, stream()>>>(
            data<float>(x), data<float>(d_out), data<float>(means), data<float>(rstds),
            data<float>(partial_w), data<float>(partial_b), N, d, rows_per_chunk);
    else
        norm_backward_columns_kernel<false><<<column_grid, kColumnThreads, 0, stream()>>>(
            data<float>(x), data<float>(d_out), data<float>(means), data<float>(rstds),
            data<float>(partial_w), nullptr, N, d, rows_per_chunk);
    check_launch(op);

    const unsigned finish_blocks = cuda::blocks_for(d, kColumnThreads);
    if (layernorm)
        norm_backward_finish_kernel<true><<<finish_blocks, kColumnThreads, 0, stream()>>>(
            data<float>(partial_w), data<float>(partial_b), data<float>(d_weight),
            data<float>(d_bias), chunks, d);
    else
        norm_backward_finish_kernel<false><<<finish_blocks, kColumnThreads, 0, stream()>>>(
            data<float>(partial_w), nullptr, data<float>(d_weight), nullptr, chunks, d);
    check_launch(op);
}

}  // namespace tmx

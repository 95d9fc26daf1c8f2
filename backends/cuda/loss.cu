// CUDA cross-entropy per token and its gradient (CPU twin: backends/cpu/loss.cpp).
//
// One block per row of logits. The row's max and sum of exps come from one pass (an online
// max/sum per thread, merged across the block in a fixed order: deterministic), because the
// logits are the largest tensor of a step (B*T x V, 2 GiB at 16k tokens x 32k vocabulary) and
// each pass over them costs its bandwidth: the forward reads them once, the backward twice.
#include <cfloat>
#include <cstdint>

#include "backends/cuda/cuda_common.cuh"

namespace tmx {
namespace {

using cuda::kWarp;

constexpr int kMaxThreads = 512;

// Threads per row: V rounded up to whole warps, at most kMaxThreads.
int threads_for(int V) {
    const int warps = (V + kWarp - 1) / kWarp;
    return warps < 1 ? kWarp : (warps * kWarp < kMaxThreads ? warps * kWarp : kMaxThreads);
}

struct RowExpSum {
    float max;  // the row's maximum
    float sum;  // sum_v exp(row[v] - max)
};

// RowExpSum of one row, by the whole block (call from every thread; all get the result).
// `shared` holds kWarp floats.
__device__ RowExpSum row_exp_sum(const float* row, int V, float* shared) {
    // Each thread keeps the max m of its elements and their sum of exp(z - m), rescaling the
    // sum when m grows. m starts at -FLT_MAX, not -inf, so that a -inf logit adds exp(-inf) = 0
    // instead of exp(-inf + inf) = NaN.
    float m = -FLT_MAX, s = 0.0f;
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        const float z = row[v];
        if (z > m) {
            s = s * expf(m - z) + 1.0f;
            m = z;
        } else {
            s += expf(z - m);
        }
    }
    // Merge: bring every thread's sum to the row's max, then add them up.
    const float row_max = cuda::block_max(m, shared);
    const float row_sum = cuda::block_sum(s * expf(m - row_max), shared);
    return {row_max, row_sum};
}

// losses[n] = log(sum) + max - logits[n, t]; 0 for t = -1; an invalid t is reported and
// gives 0. `t` is the same on all threads of the block, so the early `continue`s are
// block-uniform (row_exp_sum synchronises the block).
__global__ void cross_entropy_kernel(const float* logits, const int32_t* targets, float* losses,
                                     int64_t N, int V, int* status) {
    __shared__ float shared[kWarp];
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
        const int32_t t = targets[n];
        if (t < 0 || t >= V) {
            if (threadIdx.x == 0) {
                if (t != -1) cuda::report_error(status, cuda::kBadTarget, t, V);
                losses[n] = 0.0f;
            }
            continue;
        }
        const float* row = logits + n * V;
        const RowExpSum r = row_exp_sum(row, V, shared);
        // (max - z_t) first: it is exact when z_t is near the max, as it is for a good model.
        if (threadIdx.x == 0) losses[n] = (r.max - row[t]) + logf(r.sum);
    }
}

// d_logits[n, :] = scale * softmax(logits[n, :]) - scale * onehot(t), written (not added);
// rows with t = -1 (or an invalid t, reported) get 0. Each thread writes the elements it read
// (the same stride in both passes), so an F32 d_logits may alias logits. OutT: float, or
// __nv_bfloat16 for a BF16 d_logits (the fp32 value rounded as it is stored).
template <typename OutT>
__global__ void cross_entropy_backward_kernel(const float* logits, const int32_t* targets,
                                              float scale, OutT* d_logits, int64_t N, int V,
                                              int* status) {
    __shared__ float shared[kWarp];
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
        const int32_t t = targets[n];
        OutT* drow = d_logits + n * V;
        if (t < 0 || t >= V) {
            if (t != -1 && threadIdx.x == 0) cuda::report_error(status, cuda::kBadTarget, t, V);
            for (int v = threadIdx.x; v < V; v += blockDim.x) cuda::store_as(drow + v, 0.0f);
            continue;
        }
        const float* row = logits + n * V;
        const RowExpSum r = row_exp_sum(row, V, shared);
        const float inv = scale / r.sum;  // softmax * scale = exp(z - max) * inv
        for (int v = threadIdx.x; v < V; v += blockDim.x) {
            float g = expf(row[v] - r.max) * inv;
            if (v == t) g -= scale;
            cuda::store_as(drow + v, g);
        }
    }
}

}  // namespace

void CudaBackend::cross_entropy_impl(const Tensor& logits, const Tensor& targets,
                                     const Tensor& losses) {
    const char* op = "cross_entropy";
    const int64_t N = logits.dim(0);
    const int V = cuda::to_int(logits.dim(1), op);
    if (N == 0) return;
    cross_entropy_kernel<<<cuda::blocks_for(N, 1), threads_for(V), 0, stream()>>>(
        data<float>(logits), data<int32_t>(targets), data<float>(losses), N, V, status_word());
    check_launch(op);
}

void CudaBackend::cross_entropy_backward_impl(const Tensor& logits, const Tensor& targets,
                                              float scale, const Tensor& d_logits) {
    const char* op = "cross_entropy_backward";
    const int64_t N = logits.dim(0);
    const int V = cuda::to_int(logits.dim(1), op);
    if (N == 0) return;
    cuda::with_float_data(d_logits, [&](auto* d) {
        cross_entropy_backward_kernel<<<cuda::blocks_for(N, 1), threads_for(V), 0, stream()>>>(
            data<float>(logits), data<int32_t>(targets), scale, d, N, V, status_word());
    });
    check_launch(op);
}

}  // namespace tmx

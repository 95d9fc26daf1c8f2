// The CUDA backend's dense matmul (cuBLASLt, cublaslt_matmul.cu) and its bias gradient, forward
// and backward side by side. Their CPU twins are in backends/cpu/matmul.cpp; matmuls on stored
// 16- and 8-bit weights are in weight_matmul.cu, the grouped matmul over experts in
// grouped_matmul.cu.
//
// In bf16 precision (Backend::matmul_precision()) operands may also be BF16 tensors (out, bias
// and gradients stay F32). The dense matmul rounds each F32 operand into a bf16 copy
// (pad_to_bf16_rows, below, which the grouped matmul and attention use too), passes a BF16 one to
// cuBLASLt as it is, and runs cuBLASLt on bf16 with fp32 accumulation and output.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/matmul_common.cuh"
#include "engine/core/errors.h"

namespace tmx {
namespace {

using cuda::block_column_sum;
using cuda::kMaxGridY;
using cuda::kSumCols;
using cuda::kSumLanes;
using cuda::launch_bias_rows;
using cuda::lt_matmul;

constexpr int kThreads = 256;

// ---- bias_backward: column sums of d_out [M, N]

constexpr int64_t kSumChunkRows = 1024;  // rows per block (the first pass of two)

// Block (column chunk bx, row chunk by) sums its rows of its 32 columns. With one row chunk the
// sum goes straight into d_bias; otherwise into partial [chunks, N] for add_partials_kernel.
__global__ void column_sums_kernel(const float* x, int64_t M, int64_t N, int64_t chunk_rows,
                                   double* partial, float* d_bias) {
    const int64_t col = static_cast<int64_t>(blockIdx.x) * kSumCols + threadIdx.x;
    const int64_t begin = static_cast<int64_t>(blockIdx.y) * chunk_rows;
    const int64_t end = begin + chunk_rows < M ? begin + chunk_rows : M;
    const double sum = block_column_sum(x, N, begin, end, col);
    if (threadIdx.y != 0 || col >= N) return;
    if (partial)
        partial[static_cast<int64_t>(blockIdx.y) * N + col] = sum;
    else
        d_bias[col] += static_cast<float>(sum);
}

// d_bias[col] += the column's partial sums, in chunk order.
__global__ void add_partials_kernel(const double* partial, int64_t chunks, int64_t N,
                                    float* d_bias) {
    const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (col >= N) return;
    double sum = 0.0;
    for (int64_t c = 0; c < chunks; ++c) sum += partial[c * N + col];
    d_bias[col] += static_cast<float>(sum);
}

// dst [rows, ld] = src [rows, cols] in bf16 (an fp32 src rounded to nearest even, a bf16 one
// copied), each row padded with zeros from cols to ld (a multiple of 8). A thread writes 8 bf16
// (16 bytes) at a time, reading them in 16-byte loads where src's rows allow (vec: src 16-byte
// aligned, cols a multiple of 16 bytes' elements).
template <typename Src>
__global__ void pad_to_bf16_rows_kernel(const Src* src, int64_t rows, int64_t cols, int64_t ld,
                                        bool vec, __nv_bfloat16* dst) {
    const int64_t chunks_per_row = ld / 8, total = rows * chunks_per_row;
    for (int64_t i = cuda::grid_start(); i < total; i += cuda::grid_stride()) {
        const int64_t r = i / chunks_per_row, c0 = (i - r * chunks_per_row) * 8;
        const Src* row = src + r * cols;
        float f[8];
        if (vec && c0 + 8 <= cols) {
            cuda::load8_aligned(row + c0, f);
        } else {
#pragma unroll
            for (int c = 0; c < 8; ++c) f[c] = c0 + c < cols ? cuda::to_float(row[c0 + c]) : 0.0f;
        }
        cuda::store8_aligned(dst + r * ld + c0, f);
    }
}

}  // namespace

cuda::Bf16Rows cuda::pad_to_bf16_rows(CudaBackend& be, const Tensor& t, int64_t cols, int64_t ld,
                                      const char* op) {
    const int64_t rows = cols > 0 ? t.numel() / cols : 0;
    Bf16Rows r;
    r.storage = be.alloc({std::max<int64_t>(1, (rows * ld + 1) / 2)});  // 2 bf16 per float
    auto* dst = reinterpret_cast<__nv_bfloat16*>(CudaBackend::data<float>(r.storage));
    r.data = dst;
    r.ld = ld;
    if (rows * ld > 0) {
        cuda::with_float_data(t, [&](const auto* src) {
            // Every row's start 16-byte aligned: the first, and the others when cols allows.
            constexpr int64_t kPerChunk = 16 / sizeof(*src);  // elements in 16 bytes
            const bool vec = cuda::aligned16(src) && (rows == 1 || cols % kPerChunk == 0);
            pad_to_bf16_rows_kernel<<<cuda::elementwise_blocks(rows * ld / 8, kThreads,
                                                               be.device().sm_count),
                                      kThreads, 0, be.stream()>>>(src, rows, cols, ld, vec, dst);
        });
        be.check_launch(op);
    }
    return r;
}

void CudaBackend::matmul_impl(const Tensor& a, const Tensor& b, const Tensor& out,
                              MatmulOptions opts, const Tensor& bias) {
    const char* op = "matmul";
    const int64_t M = out.dim(0), N = out.dim(1);
    const int64_t K = opts.trans_a ? a.dim(0) : a.dim(1);
    if (M == 0 || N == 0) return;
    float* o = data<float>(out);
    const float* bias_p = bias.defined() ? data<float>(bias) : nullptr;
    const auto bias_rows = [&](bool keep) { launch_bias_rows(*this, o, bias_p, M, N, keep, op); };
    if (K == 0) {  // an empty sum: out = bias or 0, or unchanged (+ bias) with accumulate
        if (!opts.accumulate || bias_p) bias_rows(opts.accumulate);
        return;
    }
    // In bf16, a BF16 operand as it is, an F32 one as a rounded copy in pool memory (freed in
    // stream order). A BF16 view off 16-byte alignment (a weight at an odd offset of the flat
    // bf16 copy) is copied too: cuBLASLt may have no bf16 algorithm for a 2-byte-aligned operand.
    const bool bf16 = matmul_precision() == Precision::BF16;
    const cudaDataType_t type = bf16 ? CUDA_R_16BF : CUDA_R_32F;
    Tensor a_bf16, b_bf16;
    const auto operand = [&](const Tensor& t, Tensor& copy) -> const void* {
        if (!bf16) return data<float>(t);
        if (t.dtype() == DType::BF16 && cuda::aligned16(data<__nv_bfloat16>(t)))
            return data<__nv_bfloat16>(t);
        // All of t as one row: 8 elements a thread, as the grouped operands.
        const cuda::Bf16Rows r =
            cuda::pad_to_bf16_rows(*this, t, t.numel(), (t.numel() + 7) / 8 * 8, op);
        copy = r.storage;
        return r.data;
    };
    const void* a_p = operand(a, a_bf16);
    const void* b_p = operand(b, b_bf16);
    // The bias through cuBLASLt's epilogue only when overwriting (D = A B + bias, beta = 0): with
    // accumulate it is added to out first, so it is added exactly once whatever cuBLASLt's
    // order of beta * C and the epilogue; likewise where the epilogue has no algorithm. And only
    // for a 16-byte-aligned bias: the alignments the heuristic is told are A's, B's and D's, and
    // an epilogue may load the bias in 16-byte vectors (a bias view at an odd element of the
    // flat parameters is 4-byte aligned).
    if (bias_p && !opts.accumulate && cuda::aligned16(bias_p) &&
        lt_matmul(*this, type, a_p, b_p, o, bias_p, M, N, K, opts.trans_a, opts.trans_b, 0.0f))
        return;
    float beta = opts.accumulate ? 1.0f : 0.0f;
    if (bias_p) {
        bias_rows(opts.accumulate);
        beta = 1.0f;
    }
    if (!lt_matmul(*this, type, a_p, b_p, o, nullptr, M, N, K, opts.trans_a, opts.trans_b, beta))
        throw Error(std::string("cuda: matmul: cuBLASLt has no ") + to_string(matmul_precision()) +
                    " algorithm for M=" + std::to_string(M) + ", N=" + std::to_string(N) +
                    ", K=" + std::to_string(K));
}

// Two passes when the rows span several chunks (per-chunk partial sums in double, then their
// sum in chunk order), one otherwise; the chunking depends only on M: deterministic.
void CudaBackend::bias_backward_impl(const Tensor& d_out, const Tensor& d_bias) {
    const char* op = "bias_backward";
    const int64_t M = d_out.dim(0), N = d_out.dim(1);
    if (M == 0 || N == 0) return;
    const int64_t chunk_rows = std::max(kSumChunkRows, (M + kMaxGridY - 1) / kMaxGridY);
    const int64_t chunks = (M + chunk_rows - 1) / chunk_rows;
    const dim3 grid(cuda::blocks_for(N, kSumCols), static_cast<unsigned>(chunks));
    const dim3 block(kSumCols, kSumLanes);
    if (chunks == 1) {
        column_sums_kernel<<<grid, block, 0, stream()>>>(data<float>(d_out), M, N, chunk_rows,
                                                         nullptr, data<float>(d_bias));
        check_launch(op);
        return;
    }
    // Pool memory (256-byte aligned at offset 0) holds the doubles: 2 floats each.
    Tensor scratch = alloc({2 * chunks * N}, DType::F32);
    auto* partial = reinterpret_cast<double*>(data<float>(scratch));
    column_sums_kernel<<<grid, block, 0, stream()>>>(data<float>(d_out), M, N, chunk_rows, partial,
                                                     nullptr);
    check_launch(op);
    add_partials_kernel<<<cuda::blocks_for(N, kThreads), kThreads, 0, stream()>>>(
        partial, chunks, N, data<float>(d_bias));
    check_launch(op);
}

}  // namespace tmx

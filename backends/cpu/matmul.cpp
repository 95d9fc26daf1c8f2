// CPU matmuls: dense (OpenBLAS sgemm) and grouped over experts (one sgemm per expert's rows).
// In bf16 precision each operand is first copied rounded to bf16 (the values a GPU's tensor
// cores multiply), or widened from a BF16 tensor; the sgemm then sums the exact products of
// those values in fp32.
#include <cblas.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "backends/cpu/cpu_backend.h"

namespace tmx {

void cpu_sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const float* A, const float* B, float beta, float* C) {
    if (M == 0 || N == 0) return;
    if (K == 0) {  // BLAS may not touch C when K is 0; the contract says C = beta * C
        for (int64_t i = 0; i < M * N; ++i) C[i] = beta == 0.0f ? 0.0f : beta * C[i];
        return;
    }
    if (!trans_a && trans_b && M <= kSmallGemmRows)
        return cpu_small_sgemm_nt(M, N, K, alpha, A, B, beta, C);
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(M), static_cast<int>(N),
                static_cast<int>(K), alpha, A, static_cast<int>(trans_a ? M : K), B,
                static_cast<int>(trans_b ? K : N), beta, C, static_cast<int>(N));
}

namespace {

// Sets every row of out [M, N] to bias [N], so a following GEMM with beta = 1 adds onto it.
void broadcast_rows(const float* bias, int64_t M, int64_t N, float* out) {
    for (int64_t m = 0; m < M; ++m)
        std::memcpy(out + m * N, bias, static_cast<size_t>(N) * sizeof(float));
}

// sums[n] += sum over rows of x[M, N], accumulated in double. A thread takes a block of
// columns and walks the rows, reading each row's part of the block contiguously (vectorised)
// rather than one column at a time down the rows; each column still adds its terms in row
// order, so the sums do not depend on the thread count.
void column_sums_add(const float* x, int64_t M, int64_t N, float* sums) {
    constexpr int64_t kCols = 32;
    const int64_t blocks = (N + kCols - 1) / kCols;
#pragma omp parallel for schedule(static) if (M * N > (1 << 15))
    for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t n0 = blk * kCols, cols = std::min(kCols, N - n0);
        double acc[kCols] = {};
        for (int64_t m = 0; m < M; ++m) {
            const float* row = x + m * N + n0;
#pragma omp simd
            for (int64_t c = 0; c < cols; ++c) acc[c] += row[c];
        }
        for (int64_t c = 0; c < cols; ++c) sums[n0 + c] += static_cast<float>(acc[c]);
    }
}

void add_rows(const float* bias, int64_t M, int64_t N, float* out) {
    for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) out[m * N + n] += bias[n];
}

}  // namespace

const float* cpu_operand(Precision p, const Tensor& t, std::vector<float>& rounded) {
    const int64_t n = t.numel();
    if (t.dtype() == DType::BF16) {
        rounded.resize(static_cast<size_t>(n));
        cpu_widen_bf16(CpuBackend::data<uint16_t>(t), rounded.data(), n);
        return rounded.data();
    }
    const float* x = CpuBackend::data<float>(t);
    if (p == Precision::F32) return x;
    rounded.resize(static_cast<size_t>(n));
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (int64_t i = 0; i < n; ++i) rounded[i] = round_to_bf16(x[i]);
    return rounded.data();
}

void CpuBackend::matmul_impl(const Tensor& a, const Tensor& b, const Tensor& out,
                             MatmulOptions opts, const Tensor& bias) {
    int64_t M = out.dim(0), N = out.dim(1);
    int64_t K = opts.trans_a ? a.dim(0) : a.dim(1);
    float* o = data<float>(out);
    float beta = opts.accumulate ? 1.0f : 0.0f;
    if (bias.defined()) {
        if (opts.accumulate) {
            add_rows(data<float>(bias), M, N, o);
        } else {
            broadcast_rows(data<float>(bias), M, N, o);
            beta = 1.0f;
        }
    }
    std::vector<float> a_rounded, b_rounded;
    cpu_sgemm(opts.trans_a, opts.trans_b, M, N, K, 1.0f,
              cpu_operand(matmul_precision(), a, a_rounded),
              cpu_operand(matmul_precision(), b, b_rounded), beta, o);
}

namespace {

// Whether w is read by cpu_weight_matmul_nt (a 16- or 8-bit stored weight) rather than widened
// whole and multiplied by sgemm. A BF16 w in BF16 precision keeps the sgemm, which training
// (the model's bf16 copy of its weights) has always used.
bool stored_weight(const Tensor& w, Precision p) {
    return w.dtype() == DType::F16 || w.dtype() == DType::Q8_0 ||
           (w.dtype() == DType::BF16 && p == Precision::F32);
}

}  // namespace

void CpuBackend::linear_impl(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y,
                             bool accumulate) {
    if (!stored_weight(w, matmul_precision()))
        return matmul_impl(x, w, y, {.trans_b = true, .accumulate = accumulate}, b);
    const int64_t M = y.dim(0), N = y.dim(1), K = w.dim(1);
    float* o = data<float>(y);
    float beta = accumulate ? 1.0f : 0.0f;
    if (b.defined()) {
        if (accumulate) {
            add_rows(data<float>(b), M, N, o);
        } else {
            broadcast_rows(data<float>(b), M, N, o);
            beta = 1.0f;
        }
    }
    std::vector<float> x_rounded;
    cpu_weight_matmul_nt(w.dtype(), M, N, K, cpu_operand(matmul_precision(), x, x_rounded),
                         data<std::byte>(w), beta, o);
}

void CpuBackend::grouped_matmul_impl(const Tensor& x, const Tensor& w, const Tensor& bias,
                                     const Tensor& offsets, const Tensor& out) {
    int64_t E = w.dim(0), Nout = w.dim(1), K = w.dim(2);
    const int32_t* off = data<int32_t>(offsets);
    std::vector<float> x_rounded, w_rounded;
    const float* xs = cpu_operand(matmul_precision(), x, x_rounded);
    const bool stored = stored_weight(w, matmul_precision());
    const float* ws = stored ? nullptr : cpu_operand(matmul_precision(), w, w_rounded);
    const int64_t expert_bytes = dtype_bytes(w.dtype(), Nout * K);
    float* o = data<float>(out);
    for (int64_t e = 0; e < E; ++e) {
        int64_t begin = off[e], rows = off[e + 1] - off[e];
        if (rows <= 0) continue;
        float* oe = o + begin * Nout;
        float beta = 0.0f;
        if (bias.defined()) {
            broadcast_rows(data<float>(bias) + e * Nout, rows, Nout, oe);
            beta = 1.0f;
        }
        if (stored)
            cpu_weight_matmul_nt(w.dtype(), rows, Nout, K, xs + begin * K,
                                 data<std::byte>(w) + e * expert_bytes, beta, oe);
        else
            cpu_sgemm(false, true, rows, Nout, K, 1.0f, xs + begin * K, ws + e * Nout * K, beta,
                      oe);
    }
}

void CpuBackend::bias_backward_impl(const Tensor& d_out, const Tensor& d_bias) {
    const int64_t M = d_out.dim(0), N = d_out.dim(1);
    column_sums_add(data<float>(d_out), M, N, data<float>(d_bias));
}

void CpuBackend::grouped_matmul_backward_impl(const Tensor& x, const Tensor& w,
                                              const Tensor& offsets, const Tensor& d_out,
                                              const Tensor& d_x, const Tensor& d_w,
                                              const Tensor& d_bias) {
    const int64_t E = w.dim(0), Nout = w.dim(1), K = w.dim(2);
    const int32_t* off = data<int32_t>(offsets);
    std::vector<float> x_rounded, w_rounded, dy_rounded;
    const float* xs = cpu_operand(matmul_precision(), x, x_rounded);
    const float* ws = cpu_operand(matmul_precision(), w, w_rounded);
    const float* dy = cpu_operand(matmul_precision(), d_out, dy_rounded);
    const float* dy_fp32 = data<float>(d_out);  // d_bias sums the unrounded gradient
    float* dx = data<float>(d_x);
    float* dw = data<float>(d_w);
    for (int64_t e = 0; e < E; ++e) {
        const int64_t begin = off[e], rows = off[e + 1] - off[e];
        if (rows <= 0) continue;
        const float* dye = dy + begin * Nout;
        // d_x[rows, K] += d_out[rows, Nout] . w[e] [Nout, K]
        cpu_sgemm(false, false, rows, K, Nout, 1.0f, dye, ws + e * Nout * K, 1.0f, dx + begin * K);
        // d_w[e] [Nout, K] += d_out^T . x
        cpu_sgemm(true, false, Nout, K, rows, 1.0f, dye, xs + begin * K, 1.0f, dw + e * Nout * K);
        if (d_bias.defined())
            column_sums_add(dy_fp32 + begin * Nout, rows, Nout, data<float>(d_bias) + e * Nout);
    }
}

}  // namespace tmx

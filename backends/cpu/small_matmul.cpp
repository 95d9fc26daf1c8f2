// Matmuls with a few rows (up to kSmallGemmRows) against a weight matrix: the shape of decoding,
// where each step multiplies one token per sequence by every weight matrix. The time is the one
// pass over the weights that any method needs; BLAS's GEMM would first pack the weights into a
// buffer, reading them once more and writing a copy, which roughly doubles a decode step.
#include <algorithm>

#include "backends/cpu/cpu_backend.h"

namespace tmx {

void cpu_small_sgemm_nt(int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                        const float* B, float beta, float* C) {
    // Four weight rows at a time: four independent dot products per pass over a row of A keep
    // the vector units busy, and the rows stay in L1 while every row of A uses them.
    constexpr int64_t kRows = 4;
    auto store = [&](int64_t m, int64_t n, float dot) {
        float& c = C[m * N + n];
        c = alpha * dot + (beta == 0.0f ? 0.0f : beta * c);  // beta 0: C is not read
    };
    // Threads only for a weight matrix of 1 MB or more: below, waking them costs more than
    // the pass over the weights.
#pragma omp parallel for schedule(static) if (N * K >= (1 << 18))
    for (int64_t n0 = 0; n0 < N; n0 += kRows) {
        if (n0 + kRows <= N) {
            const float *b0 = B + n0 * K, *b1 = b0 + K, *b2 = b1 + K, *b3 = b2 + K;
            for (int64_t m = 0; m < M; ++m) {
                const float* a = A + m * K;
                float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
                for (int64_t k = 0; k < K; ++k) {
                    s0 += a[k] * b0[k];
                    s1 += a[k] * b1[k];
                    s2 += a[k] * b2[k];
                    s3 += a[k] * b3[k];
                }
                store(m, n0, s0);
                store(m, n0 + 1, s1);
                store(m, n0 + 2, s2);
                store(m, n0 + 3, s3);
            }
        } else {
            for (int64_t n = n0; n < N; ++n)
                for (int64_t m = 0; m < M; ++m) {
                    const float *a = A + m * K, *b = B + n * K;
                    float s = 0.0f;
#pragma omp simd reduction(+ : s)
                    for (int64_t k = 0; k < K; ++k) s += a[k] * b[k];
                    store(m, n, s);
                }
        }
    }
}

}  // namespace tmx

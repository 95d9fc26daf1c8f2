// CPU cross-entropy per token: log-sum-exp with fp32 exps (vectorised) summed in double.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/cpu_math.h"

namespace tmx {
namespace {

// The max m of a row of logits and sum_v exp(row[v] - m). The exps are fp32 (within 1.5 ulp)
// so that the loop vectorises, and are summed in double: the sum's relative error stays ~1e-7
// for any vocabulary size.
struct RowExpSum {
    float max;
    double sum;
};

RowExpSum row_exp_sum(const float* row, int64_t V) {
    float m = row[0];
#pragma omp simd reduction(max : m)
    for (int64_t v = 1; v < V; ++v) m = std::max(m, row[v]);
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int64_t v = 0; v < V; ++v) sum += cpu::exp_fast(row[v] - m);
    return {m, sum};
}

}  // namespace

void CpuBackend::cross_entropy_impl(const Tensor& logits, const Tensor& targets,
                                    const Tensor& losses) {
    const int64_t N = logits.dim(0), V = logits.dim(1);
    const float* z = data<float>(logits);
    const int32_t* t = data<int32_t>(targets);
    float* out = data<float>(losses);
    for (int64_t n = 0; n < N; ++n)
        if (t[n] >= V)
            throw std::out_of_range("cross_entropy: target " + std::to_string(t[n]) +
                                    " outside the vocabulary of " + std::to_string(V));
#pragma omp parallel for schedule(static) if (N * V > (1 << 16))
    for (int64_t n = 0; n < N; ++n) {
        if (t[n] < 0) {
            out[n] = 0.0f;
            continue;
        }
        const float* row = z + n * V;
        const RowExpSum r = row_exp_sum(row, V);
        out[n] = static_cast<float>(std::log(r.sum) + r.max - row[t[n]]);
    }
}

void CpuBackend::cross_entropy_backward_impl(const Tensor& logits, const Tensor& targets,
                                             float scale, const Tensor& d_logits) {
    const int64_t N = logits.dim(0), V = logits.dim(1);
    const float* z = data<float>(logits);
    const int32_t* t = data<int32_t>(targets);
    CpuOutput result(d_logits);
    float* dz = result.data();
#pragma omp parallel for schedule(static) if (N * V > (1 << 16))
    for (int64_t n = 0; n < N; ++n) {
        const float* row = z + n * V;
        float* drow = dz + n * V;
        if (t[n] < 0) {
            std::fill(drow, drow + V, 0.0f);
            continue;
        }
        const RowExpSum r = row_exp_sum(row, V);
        const float m = r.max, inv = static_cast<float>(scale / r.sum);  // softmax * scale
#pragma omp simd
        for (int64_t v = 0; v < V; ++v) drow[v] = cpu::exp_fast(row[v] - m) * inv;
        drow[t[n]] -= scale;
    }
    result.store();
}

}  // namespace tmx

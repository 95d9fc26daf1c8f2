// CPU cross-entropy per token (log-sum-exp in double).
#include <cmath>
#include <stdexcept>
#include <string>

#include "backends/cpu/cpu_backend.h"

namespace tmx {

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
        float m = row[0];
        for (int64_t v = 1; v < V; ++v) m = std::max(m, row[v]);
        double sum = 0.0;
        for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(row[v] - m));
        out[n] = static_cast<float>(std::log(sum) + m - row[t[n]]);
    }
}

void CpuBackend::cross_entropy_backward_impl(const Tensor& logits, const Tensor& targets,
                                             float scale, const Tensor& d_logits) {
    const int64_t N = logits.dim(0), V = logits.dim(1);
    const float* z = data<float>(logits);
    const int32_t* t = data<int32_t>(targets);
    float* dz = data<float>(d_logits);
#pragma omp parallel for schedule(static) if (N * V > (1 << 16))
    for (int64_t n = 0; n < N; ++n) {
        const float* row = z + n * V;
        float* drow = dz + n * V;
        if (t[n] < 0) {
            std::fill(drow, drow + V, 0.0f);
            continue;
        }
        float m = row[0];
        for (int64_t v = 1; v < V; ++v) m = std::max(m, row[v]);
        double sum = 0.0;
        for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(row[v] - m));
        const double inv = 1.0 / sum;
        for (int64_t v = 0; v < V; ++v)
            drow[v] = static_cast<float>(scale * std::exp(static_cast<double>(row[v] - m)) * inv);
        drow[t[n]] -= scale;
    }
}

}  // namespace tmx

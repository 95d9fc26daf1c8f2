// CPU layernorm and rmsnorm over the last dimension (statistics accumulated in double).
#include <algorithm>
#include <cmath>
#include <vector>

#include "backends/cpu/cpu_backend.h"

namespace tmx {
namespace {

// A row's mean (0 for rmsnorm, which does not centre) and 1 / sqrt(var + eps), where var is
// the mean square about that mean. Accumulated in double; `omp simd` lets the sums run in
// vector lanes (a fixed order, so still deterministic).
struct RowStats {
    float mean, rstd;
};

RowStats row_stats(NormType type, const float* row, int64_t d, float eps) {
    double mean = 0.0;
    if (type == NormType::LayerNorm) {
#pragma omp simd reduction(+ : mean)
        for (int64_t i = 0; i < d; ++i) mean += row[i];
        mean /= static_cast<double>(d);
    }
    double var = 0.0;
#pragma omp simd reduction(+ : var)
    for (int64_t i = 0; i < d; ++i) {
        const double c = row[i] - mean;
        var += c * c;
    }
    var /= static_cast<double>(d);
    return {static_cast<float>(mean), static_cast<float>(1.0 / std::sqrt(var + eps))};
}

}  // namespace

void CpuBackend::norm_impl(NormType type, const Tensor& x, const Tensor& weight, const Tensor& bias,
                           float eps, const Tensor& out) {
    int64_t N = x.dim(0), d = x.dim(1);
    const float* in = data<float>(x);
    const float* w = data<float>(weight);
    const float* b = bias.defined() ? data<float>(bias) : nullptr;
    CpuOutput result(out);
    float* o = result.data();
#pragma omp parallel for schedule(static) if (N * d > (1 << 15))
    for (int64_t n = 0; n < N; ++n) {
        const float* row = in + n * d;
        float* dst = o + n * d;
        const RowStats stats = row_stats(type, row, d, eps);
        // Not a structured binding: clang 14 cannot use one inside the OpenMP loop.
        const float m = stats.mean, rstd = stats.rstd;
#pragma omp simd
        for (int64_t i = 0; i < d; ++i) {
            float y = (row[i] - m) * rstd * w[i];
            dst[i] = b ? y + b[i] : y;
        }
    }
    result.store();
}

void CpuBackend::norm_backward_impl(NormType type, const Tensor& x, const Tensor& weight,
                                    const Tensor& d_out, float eps, const Tensor& d_x,
                                    const Tensor& d_weight, const Tensor& d_bias) {
    const int64_t N = x.dim(0), d = x.dim(1);
    const float* in = data<float>(x);
    const float* w = data<float>(weight);
    const float* dy = data<float>(d_out);
    float* dx = data<float>(d_x);
    std::vector<float> means(static_cast<size_t>(N)), rstds(static_cast<size_t>(N));
    // Rows are independent for d_x; the statistics are kept for the column sums below.
#pragma omp parallel for schedule(static) if (N * d > (1 << 15))
    for (int64_t n = 0; n < N; ++n) {
        const float* row = in + n * d;
        const float* g = dy + n * d;
        const RowStats stats = row_stats(type, row, d, eps);
        // Not a structured binding: clang 14 cannot use one inside the OpenMP loop.
        const float m = stats.mean, rstd = stats.rstd;
        means[n] = m;
        rstds[n] = rstd;
        // dx = rstd * (g*w - mean(g*w) - xhat * mean(g*w*xhat)); the first mean only for
        // layernorm, whose output does not depend on a shift of x.
        double sum_gw = 0.0, sum_gwx = 0.0;
#pragma omp simd reduction(+ : sum_gw, sum_gwx)
        for (int64_t i = 0; i < d; ++i) {
            const double gw = static_cast<double>(g[i]) * w[i];
            sum_gw += gw;
            sum_gwx += gw * (row[i] - m) * rstd;
        }
        const float mean_gw = type == NormType::LayerNorm ? static_cast<float>(sum_gw / d) : 0.0f;
        const float mean_gwx = static_cast<float>(sum_gwx / d);
        float* dst = dx + n * d;
#pragma omp simd
        for (int64_t i = 0; i < d; ++i) {
            const float xhat = (row[i] - m) * rstd;
            dst[i] += rstd * (g[i] * w[i] - mean_gw - xhat * mean_gwx);
        }
    }
    // d_weight[i] = sum_n g * xhat, d_bias[i] = sum_n g. A thread takes a block of columns and
    // walks the rows, reading each row's part of the block contiguously (vectorised); each
    // column adds its terms in row order, so the sums do not depend on the thread count.
    float* dw = data<float>(d_weight);
    float* db = d_bias.defined() ? data<float>(d_bias) : nullptr;
    constexpr int64_t kCols = 32;
    const int64_t blocks = (d + kCols - 1) / kCols;
#pragma omp parallel for schedule(static) if (N * d > (1 << 15))
    for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t i0 = blk * kCols, cols = std::min(kCols, d - i0);
        double sw[kCols] = {}, sb[kCols] = {};
        for (int64_t n = 0; n < N; ++n) {
            const float* g = dy + n * d + i0;
            const float* row = in + n * d + i0;
            const float m = means[n], rstd = rstds[n];
#pragma omp simd
            for (int64_t c = 0; c < cols; ++c) {
                sw[c] += static_cast<double>(g[c]) * (row[c] - m) * rstd;
                sb[c] += g[c];
            }
        }
        for (int64_t c = 0; c < cols; ++c) {
            dw[i0 + c] += static_cast<float>(sw[c]);
            if (db) db[i0 + c] += static_cast<float>(sb[c]);
        }
    }
}

}  // namespace tmx

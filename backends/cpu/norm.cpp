// CPU layernorm and rmsnorm over the last dimension (statistics accumulated in double).
#include <cmath>

#include "backends/cpu/cpu_backend.h"

namespace tmx {

void CpuBackend::norm_impl(NormType type, const Tensor& x, const Tensor& weight,
                           const Tensor& bias, float eps, const Tensor& out) {
    int64_t N = x.dim(0), d = x.dim(1);
    const float* in = data<float>(x);
    const float* w = data<float>(weight);
    const float* b = bias.defined() ? data<float>(bias) : nullptr;
    float* o = data<float>(out);
#pragma omp parallel for schedule(static) if (N * d > (1 << 15))
    for (int64_t n = 0; n < N; ++n) {
        const float* row = in + n * d;
        float* dst = o + n * d;
        double mean = 0.0;
        if (type == NormType::LayerNorm) {
            for (int64_t i = 0; i < d; ++i) mean += row[i];
            mean /= static_cast<double>(d);
        }
        double var = 0.0;
        for (int64_t i = 0; i < d; ++i) {
            double c = row[i] - mean;
            var += c * c;
        }
        var /= static_cast<double>(d);
        float rstd = static_cast<float>(1.0 / std::sqrt(var + eps));
        float m = static_cast<float>(mean);
        for (int64_t i = 0; i < d; ++i) {
            float y = (row[i] - m) * rstd * w[i];
            dst[i] = b ? y + b[i] : y;
        }
    }
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
        double mean = 0.0;
        if (type == NormType::LayerNorm) {
            for (int64_t i = 0; i < d; ++i) mean += row[i];
            mean /= static_cast<double>(d);
        }
        double var = 0.0;
        for (int64_t i = 0; i < d; ++i) var += (row[i] - mean) * (row[i] - mean);
        var /= static_cast<double>(d);
        const float rstd = static_cast<float>(1.0 / std::sqrt(var + eps));
        const float m = static_cast<float>(mean);
        means[n] = m;
        rstds[n] = rstd;
        // dx = rstd * (g*w - mean(g*w) - xhat * mean(g*w*xhat)); the first mean only for
        // layernorm, whose output does not depend on a shift of x.
        double sum_gw = 0.0, sum_gwx = 0.0;
        for (int64_t i = 0; i < d; ++i) {
            const double gw = static_cast<double>(g[i]) * w[i];
            sum_gw += gw;
            sum_gwx += gw * (row[i] - m) * rstd;
        }
        const float mean_gw = type == NormType::LayerNorm ? static_cast<float>(sum_gw / d) : 0.0f;
        const float mean_gwx = static_cast<float>(sum_gwx / d);
        float* dst = dx + n * d;
        for (int64_t i = 0; i < d; ++i) {
            const float xhat = (row[i] - m) * rstd;
            dst[i] += rstd * (g[i] * w[i] - mean_gw - xhat * mean_gwx);
        }
    }
    float* dw = data<float>(d_weight);
    float* db = d_bias.defined() ? data<float>(d_bias) : nullptr;
#pragma omp parallel for schedule(static) if (N * d > (1 << 15))
    for (int64_t i = 0; i < d; ++i) {
        double sw = 0.0, sb = 0.0;
        for (int64_t n = 0; n < N; ++n) {
            const float g = dy[n * d + i];
            sw += static_cast<double>(g) * (in[n * d + i] - means[n]) * rstds[n];
            sb += g;
        }
        dw[i] += static_cast<float>(sw);
        if (db) db[i] += static_cast<float>(sb);
    }
}

}  // namespace tmx

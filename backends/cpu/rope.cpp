// CPU rotary position embedding, rotate-half layout (angles computed in double).
#include <cmath>
#include <vector>

#include "backends/cpu/cpu_backend.h"

namespace tmx {

void CpuBackend::rope_impl(const Tensor& x, const Tensor& positions, double theta, bool inverse) {
    int64_t N = x.dim(0), H = x.dim(1), hd = x.dim(2), half = hd / 2;
    float* p = data<float>(x);
    const int32_t* pos = data<int32_t>(positions);
    std::vector<double> inv_freq(static_cast<size_t>(half));
    for (int64_t i = 0; i < half; ++i)
        inv_freq[i] = 1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(hd));
#pragma omp parallel for schedule(static) if (N * H * hd > (1 << 15))
    for (int64_t n = 0; n < N; ++n) {
        std::vector<float> cos_t(static_cast<size_t>(half)), sin_t(static_cast<size_t>(half));
        for (int64_t i = 0; i < half; ++i) {
            double angle = static_cast<double>(pos[n]) * inv_freq[i];
            cos_t[i] = static_cast<float>(std::cos(angle));
            sin_t[i] = static_cast<float>(inverse ? -std::sin(angle) : std::sin(angle));
        }
        for (int64_t h = 0; h < H; ++h) {
            float* v = p + (n * H + h) * hd;
            for (int64_t i = 0; i < half; ++i) {
                float x1 = v[i], x2 = v[i + half];
                v[i] = x1 * cos_t[i] - x2 * sin_t[i];
                v[i + half] = x2 * cos_t[i] + x1 * sin_t[i];
            }
        }
    }
}

}  // namespace tmx

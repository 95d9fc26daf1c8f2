// CPU rotary position embedding, rotate-half layout (angles computed in double).
#include <algorithm>
#include <cmath>
#include <vector>

#include "backends/cpu/cpu_backend.h"

namespace tmx {

void CpuBackend::rope_impl(const Tensor& x, const Tensor& positions, double theta, bool inverse) {
    int64_t N = x.dim(0), H = x.dim(1), hd = x.dim(2), half = hd / 2;
    float* p = data<float>(x);
    const int32_t* pos = data<int32_t>(positions);
    if (N == 0) return;
    std::vector<double> inv_freq(static_cast<size_t>(half));
    for (int64_t i = 0; i < half; ++i)
        inv_freq[i] = 1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(hd));
    // cos and sin of each position in [first, last], computed once: a batch repeats the same
    // positions in every sequence, so there are far fewer positions than rows.
    const auto [lo, hi] = std::minmax_element(pos, pos + N);
    const int64_t first = *lo, n_pos = static_cast<int64_t>(*hi) - first + 1;
    std::vector<float> cos_t, sin_t;
    const bool table = n_pos <= N;  // else (sparse positions) each row computes its own
    auto angles = [&](int64_t position, float* c, float* s) {
        for (int64_t i = 0; i < half; ++i) {
            const double angle = static_cast<double>(position) * inv_freq[i];
            c[i] = static_cast<float>(std::cos(angle));
            s[i] = static_cast<float>(inverse ? -std::sin(angle) : std::sin(angle));
        }
    };
    if (table) {
        cos_t.resize(static_cast<size_t>(n_pos * half));
        sin_t.resize(static_cast<size_t>(n_pos * half));
#pragma omp parallel for schedule(static) if (n_pos * half > (1 << 12))
        for (int64_t t = 0; t < n_pos; ++t)
            angles(first + t, cos_t.data() + t * half, sin_t.data() + t * half);
    }
#pragma omp parallel for schedule(static) if (N * H * hd > (1 << 15))
    for (int64_t n = 0; n < N; ++n) {
        std::vector<float> own_cos, own_sin;
        const float *c, *s;
        if (table) {
            c = cos_t.data() + (pos[n] - first) * half;
            s = sin_t.data() + (pos[n] - first) * half;
        } else {
            own_cos.resize(static_cast<size_t>(half));
            own_sin.resize(static_cast<size_t>(half));
            angles(pos[n], own_cos.data(), own_sin.data());
            c = own_cos.data();
            s = own_sin.data();
        }
        for (int64_t h = 0; h < H; ++h) {
            float* v = p + (n * H + h) * hd;
#pragma omp simd
            for (int64_t i = 0; i < half; ++i) {
                const float x1 = v[i], x2 = v[i + half];
                v[i] = x1 * c[i] - x2 * s[i];
                v[i + half] = x2 * c[i] + x1 * s[i];
            }
        }
    }
}

}  // namespace tmx

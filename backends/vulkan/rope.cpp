// Vulkan rotary position embedding (shaders/rope.comp): the angle is reduced in exact integer
// arithmetic on the device from a per-frequency fixed-point table built here in double.
#include <cmath>
#include <numbers>
#include <vector>

#include "backends/vulkan/vulkan_backend.h"

namespace tmx {

const Tensor& VulkanBackend::rope_table(double theta, int64_t head_dim) {
    auto key = std::make_pair(theta, head_dim);
    if (auto it = rope_tables_.find(key); it != rope_tables_.end()) return it->second;
    const int64_t half = head_dim / 2;
    std::vector<uint32_t> words(static_cast<size_t>(2 * half));
    for (int64_t i = 0; i < half; ++i) {
        // The CPU's frequency, in turns per position: a fraction below 1/(2 pi), stored as
        // F = f * 2^64 (lo word, hi word). Scaling by 2^32 and taking fractional parts is exact.
        const double inv_freq =
            1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(head_dim));
        const double f = inv_freq / (2.0 * std::numbers::pi);
        const double scaled = std::ldexp(f - std::floor(f), 32);
        const double hi = std::floor(scaled);
        words[2 * i] = static_cast<uint32_t>(std::ldexp(scaled - hi, 32));
        words[2 * i + 1] = static_cast<uint32_t>(hi);
    }
    Tensor t = alloc({2 * half}, DType::I32);
    upload(t, words.data());
    return rope_tables_[key] = t;
}

void VulkanBackend::rope_impl(const Tensor& x, const Tensor& positions, double theta,
                              bool inverse) {
    const int64_t N = x.dim(0), H = x.dim(1), half = x.dim(2) / 2;
    if (N * H * half == 0) return;
    const Tensor& table = rope_table(theta, x.dim(2));
    struct {
        uint32_t N, H, half, inverse;
    } p{static_cast<uint32_t>(N), static_cast<uint32_t>(H), static_cast<uint32_t>(half),
        inverse ? 1u : 0u};
    auto [gx, gy] = grid(static_cast<uint64_t>(N * H * half), tuning_.elementwise_wg);
    run("rope", {tuning_.elementwise_wg}, {inout(x), in(positions), in(table)}, p, gx, gy);
}

}  // namespace tmx

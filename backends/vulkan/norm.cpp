// Vulkan layernorm and rmsnorm: one workgroup per row (shaders/norm.comp).
#include "backends/vulkan/vulkan_backend.h"

namespace tmx {

void VulkanBackend::norm_impl(NormType type, const Tensor& x, const Tensor& weight,
                              const Tensor& bias, float eps, const Tensor& out_t) {
    const int64_t N = x.dim(0), d = x.dim(1);
    if (N == 0 || d == 0) return;
    struct {
        uint32_t N, d;
        float eps;
        uint32_t layernorm;
    } p{static_cast<uint32_t>(N), static_cast<uint32_t>(d), eps,
        type == NormType::LayerNorm ? 1u : 0u};
    auto [gx, gy] = grid(static_cast<uint64_t>(N), 1);
    run("norm", {tuning_.row_wg}, {in(x), in(weight), in(bias), out(out_t)}, p, gx, gy);
}

}  // namespace tmx

// Vulkan cross-entropy per token and its backward: one workgroup per row
// (shaders/cross_entropy.comp, cross_entropy_backward.comp).
#include "backends/vulkan/vulkan_backend.h"

namespace tmx {

void VulkanBackend::cross_entropy_impl(const Tensor& logits, const Tensor& targets,
                                       const Tensor& losses) {
    const int64_t N = logits.dim(0);
    struct {
        uint32_t N, V;
    } p{static_cast<uint32_t>(N), static_cast<uint32_t>(logits.dim(1))};
    auto [gx, gy] = grid(static_cast<uint64_t>(N), 1);
    run("cross_entropy", {tuning_.row_wg},
        {in(logits), in(targets), out(losses), stream_->status_binding()}, p, gx, gy);
}

void VulkanBackend::cross_entropy_backward_impl(const Tensor& logits, const Tensor& targets,
                                                float scale, const Tensor& d_logits) {
    const int64_t N = logits.dim(0);
    if (N == 0) return;
    struct {
        uint32_t N, V;
        float scale;
    } p{static_cast<uint32_t>(N), static_cast<uint32_t>(logits.dim(1)), scale};
    auto [gx, gy] = grid(static_cast<uint64_t>(N), 1);
    run("cross_entropy_backward", {tuning_.row_wg},
        {in(logits), in(targets), out(d_logits), stream_->status_binding()}, p, gx, gy);
}

}  // namespace tmx

// Vulkan's part of drawing tokens: greedy decoding's argmax over each row of logits on the
// device (shaders/argmax_rows.comp), so a greedy step downloads a token per sequence rather
// than its logits.
#include "backends/vulkan/vulkan_backend.h"

namespace tmx {

void VulkanBackend::argmax_rows_impl(const Tensor& logits, int32_t* tokens) {
    const int64_t N = logits.dim(0);
    struct {
        uint32_t N, V;
    } p{static_cast<uint32_t>(N), static_cast<uint32_t>(logits.dim(1))};
    const Tensor ids = alloc({N}, DType::I32);
    auto [gx, gy] = grid(static_cast<uint64_t>(N), 1);
    run("argmax_rows", {tuning_.row_wg}, {in(logits), out(ids)}, p, gx, gy);
    download_impl(ids, tokens);
}

}  // namespace tmx

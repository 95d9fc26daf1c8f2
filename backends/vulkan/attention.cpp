// Vulkan attention over a sequence or a chunk plus the rolling KV cache (one shader, see
// shaders/attention.comp), and the cache write.
#include <algorithm>
#include <cmath>
#include <limits>

#include "backends/vulkan/vulkan_backend.h"
#include "engine/errors.h"

namespace tmx {
namespace {

constexpr int64_t kMaxHeadDim = 256;  // attention.comp's MAX_HEAD_DIM

struct AttentionPush {
    uint32_t T, H, Hkv, hd, S, window, has_cache;
    float scale;
};

AttentionPush attention_push(const Tensor& q, const Tensor& k, int64_t S, int64_t window,
                             bool has_cache) {
    const int64_t hd = q.dim(3);
    if (hd > kMaxHeadDim)
        throw Error("attention: head_dim " + std::to_string(hd) +
                    " is larger than the Vulkan backend supports (" + std::to_string(kMaxHeadDim) +
                    ")");
    const int64_t w = std::min<int64_t>(window, std::numeric_limits<int32_t>::max());
    return {static_cast<uint32_t>(q.dim(1)),
            static_cast<uint32_t>(q.dim(2)),
            static_cast<uint32_t>(k.dim(2)),
            static_cast<uint32_t>(hd),
            static_cast<uint32_t>(S),
            static_cast<uint32_t>(w),
            has_cache ? 1u : 0u,
            1.0f / std::sqrt(static_cast<float>(hd))};
}

}  // namespace

void VulkanBackend::attention_impl(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& out_t, int64_t window) {
    if (q.numel() == 0) return;
    const AttentionPush p = attention_push(q, k, 0, window, false);
    run("attention", {tuning_.attention_wg, tuning_.attention_chunk},
        {in(q), in(k), in(v), in(Tensor{}), in(Tensor{}), in(Tensor{}), out(out_t)}, p,
        static_cast<uint32_t>(q.dim(1)), static_cast<uint32_t>(q.dim(2)),
        static_cast<uint32_t>(q.dim(0)));
}

void VulkanBackend::attention_cached_impl(const Tensor& q, const Tensor& k, const Tensor& v,
                                          const Tensor& k_cache, const Tensor& v_cache,
                                          const Tensor& start, const Tensor& out_t,
                                          int64_t window) {
    if (q.numel() == 0) return;
    const AttentionPush p = attention_push(q, k, k_cache.dim(1), window, true);
    run("attention", {tuning_.attention_wg, tuning_.attention_chunk},
        {in(q), in(k), in(v), in(k_cache), in(v_cache), in(start), out(out_t)}, p,
        static_cast<uint32_t>(q.dim(1)), static_cast<uint32_t>(q.dim(2)),
        static_cast<uint32_t>(q.dim(0)));
}

void VulkanBackend::kv_cache_write_impl(const Tensor& k, const Tensor& v, const Tensor& k_cache,
                                        const Tensor& v_cache, const Tensor& start) {
    const int64_t B = k.dim(0), T = k.dim(1), S = k_cache.dim(1), row = k.dim(2) * k.dim(3);
    struct {
        uint32_t B, T, S, row;
    } p{static_cast<uint32_t>(B), static_cast<uint32_t>(T), static_cast<uint32_t>(S),
        static_cast<uint32_t>(row)};
    auto [gx, gy] = grid(static_cast<uint64_t>(B * std::min(T, S) * row), tuning_.elementwise_wg);
    run("kv_cache_write", {tuning_.elementwise_wg},
        {in(k), in(v), out(k_cache), out(v_cache), in(start)}, p, gx, gy);
}

}  // namespace tmx

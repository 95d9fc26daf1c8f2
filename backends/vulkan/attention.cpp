// Vulkan attention over a sequence or a chunk plus the rolling KV cache, and the cache write.
// Three shaders share one contract (shaders/attention_common.glsl), picked by the number of
// queries: a split over key slices plus a merge for few (decode; in rope_attention_cached_store
// the split rotates q and the chunk's keys as it reads them and the merge writes the cache, so
// that no other dispatch is needed), query x key tiles in shared memory for many (prefill), and
// one workgroup per query otherwise (attention.comp). The backward recomputes the softmax in
// two passes: per query (d_q, and the softmax statistics), then per key (d_k, d_v).
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "backends/vulkan/vulkan_backend.h"
#include "engine/core/errors.h"

namespace tmx {
namespace {

constexpr int64_t kMaxHeadDim = 256;  // attention.comp's MAX_HEAD_DIM
// attention_backward.comp (the query side) and attention_backward_kv.comp (the key side):
// their MAX_HEAD_DIM, and the workgroup size and keys (or query-head pairs) per chunk.
constexpr int64_t kBackwardMaxHeadDim = 256;
constexpr uint32_t kBackwardWg = 64, kBackwardChunk = 128;

// attention_common.glsl's push constants after the binding offsets.
struct AttentionPush {
    uint32_t T, H, Hkv, hd, S, window, has_cache;
    float scale;
    uint32_t n_split = 0, slice_len = 0, heads = 0;  // attention_split.comp only
    uint32_t rope = 0;                               // attention_split.comp only
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

// Query heads per attention_split workgroup: the largest divisor of the GQA group whose
// queries fit the shader's arrays (1 always does: head_dim <= 256).
uint32_t split_heads(int64_t group, int64_t hd) {
    int64_t g = std::min<int64_t>(group, vk::kSplitMaxGroup);
    while (g > 1 && (group % g != 0 || g * hd > vk::kSplitGroupDim)) --g;
    return static_cast<uint32_t>(g);
}

// Whether attention over T queries of head_dim hd takes the split path (attention_split.comp,
// then attention_combine.comp): few queries, the chunk's keys fit its staging array, and a
// variant of it fits the device (the default is the smallest one that does, if any does).
bool takes_split_path(const VulkanBackend::Tuning& tu, const vk::TuningTable& table,
                      const vk::DeviceInfo& d, int64_t T, int64_t hd) {
    return T <= tu.attention_split_max_t && T * hd <= vk::kSplitChunkDim &&
           vk::invalid_reason(vk::Kernel::AttentionSplit,
                              table.default_variant(vk::Kernel::AttentionSplit, T, hd, 0, 0), d)
               .empty();
}

}  // namespace

void VulkanBackend::attention_impl(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& out_t, int64_t window) {
    // No cache: has_cache = 0 and the cache bindings are dummies.
    attention_cached_impl(q, k, v, Tensor{}, Tensor{}, Tensor{}, out_t, window);
}

void VulkanBackend::attention_cached_impl(const Tensor& q, const Tensor& k, const Tensor& v,
                                          const Tensor& k_cache, const Tensor& v_cache,
                                          const Tensor& start, const Tensor& out_t,
                                          int64_t window) {
    record_attention(q, k, v, k_cache, v_cache, start, out_t, window, /*store=*/false);
}

void VulkanBackend::rope_attention_cached_store_impl(const Tensor& q, const Tensor& k,
                                                     const Tensor& v, const Tensor& positions,
                                                     double theta, const Tensor& k_cache,
                                                     const Tensor& v_cache, const Tensor& start,
                                                     const Tensor& out_t, int64_t window) {
    // On the split path, RoPE as q and k are read and the cache write in the merge: the
    // attention's two dispatches and no other. Elsewhere, the sequence.
    if (q.numel() > 0 && takes_split_path(tuning_, table_, ctx_->info(), q.dim(1), q.dim(3))) {
        const SplitRope rope{positions, rope_table(theta, q.dim(3))};
        record_attention(q, k, v, k_cache, v_cache, start, out_t, window, /*store=*/true, &rope);
    } else {
        Backend::rope_attention_cached_store_impl(q, k, v, positions, theta, k_cache, v_cache,
                                                  start, out_t, window);
    }
}

void VulkanBackend::record_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                     const Tensor& k_cache, const Tensor& v_cache,
                                     const Tensor& start, const Tensor& out_t, int64_t window,
                                     bool store, const SplitRope* rope) {
    if (q.numel() == 0) return;
    const bool has_cache = k_cache.defined();
    const int64_t B = q.dim(0), T = q.dim(1), H = q.dim(2), Hkv = k.dim(2), hd = q.dim(3);
    const int64_t S = has_cache ? k_cache.dim(1) : 0;
    AttentionPush p = attention_push(q, k, S, window, has_cache);
    const Tuning& tu = tuning_;

    if (takes_split_path(tu, table_, ctx_->info(), T, hd)) {
        const uint32_t heads = split_heads(H / Hkv, hd);
        // Every query sees at most this many keys; the slices cover that many.
        const int64_t keys = window > 0 ? std::min(window, S + T) : S + T;
        const vk::Variant shape =
            choose(vk::Kernel::AttentionSplit, {.op = TunableCall::Op::AttentionCached,
                                                .rows = B * T,
                                                .n = hd,
                                                .k = keys,
                                                .heads = H,
                                                .kv_heads = Hkv});
        const uint32_t slice_keys = shape.spec[1];
        const int64_t n_split = (keys + slice_keys - 1) / slice_keys;
        p.n_split = static_cast<uint32_t>(n_split);
        p.slice_len = static_cast<uint32_t>((keys + n_split - 1) / n_split);
        p.heads = heads;
        p.rope = rope ? 1u : 0u;
        const Tensor positions = rope ? rope->positions : Tensor{},
                     table = rope ? rope->table : Tensor{};
        // Per (b, i, h, slice): [m, l, acc[hd]]; phase 2 reads it after phase 1 wrote it.
        Tensor partials = alloc({B * T * H * n_split * (hd + 2)});
        // The short-chain form (vulkan_tuning.h) where its vec4 rows fit the head, with head_dim
        // and the group's heads as constants; else the first form of the same shape.
        const bool rows = shape.spec[2] == vk::kSplitRows && hd % 4 == 0 &&
                          hd <= 4 * static_cast<int64_t>(shape.spec[0]);
        std::vector<uint32_t> spec(shape.spec.begin(), shape.spec.begin() + 2);
        if (rows) spec.insert(spec.end(), {static_cast<uint32_t>(hd), heads});
        run(rows ? "attention_split_rows" : "attention_split", spec,
            {in(q), in(k), in(v), in(k_cache), in(v_cache), in(start), out(partials), in(positions),
             in(table)},
            p, p.n_split, static_cast<uint32_t>(H / heads), static_cast<uint32_t>(B * T));
        // The merge, and with `store` the cache write (B > 0 in its push constants): the
        // split has read the cache before the merge's barrier, and an invocation per output
        // element covers the write's B * min(T, S) * Hkv * hd elements too.
        struct {
            uint32_t rows, hd, n_split;
            uint32_t B, T, S, row;
            uint32_t rope;
        } cp{static_cast<uint32_t>(B * T * H),
             static_cast<uint32_t>(hd),
             p.n_split,
             store ? static_cast<uint32_t>(B) : 0u,
             static_cast<uint32_t>(T),
             static_cast<uint32_t>(S),
             static_cast<uint32_t>(Hkv * hd),
             p.rope};
        // Without `store`, the write's bindings are the dummy, bound as read (the merge
        // writes nothing there, and a written dummy would order later commands after it).
        const auto read = [&](const Tensor& t) { return in(store ? t : Tensor{}); };
        const auto written = [&](const Tensor& t) { return store ? out(t) : in(Tensor{}); };
        auto [gx, gy] = grid(static_cast<uint64_t>(B * T * H * hd), tu.elementwise_wg);
        run("attention_combine", {tu.elementwise_wg},
            {in(partials), out(out_t), read(k), read(v), written(k_cache), written(v_cache),
             read(start), in(positions), in(table)},
            cp, gx, gy);
        return;
    }

    if (T >= tu.attention_tile_min_t && hd <= vk::kAttentionTiledMaxHeadDim) {
        // Every candidate fits the device's shared memory (vulkan_tuning.h).
        const int64_t span = std::min<int64_t>(window, std::numeric_limits<int32_t>::max());
        const vk::Variant shape =
            choose(vk::Kernel::AttentionTiled, {.op = TunableCall::Op::Attention,
                                                .rows = T,
                                                .n = hd,
                                                .k = span,
                                                .heads = H,
                                                .kv_heads = Hkv});
        const uint32_t bq = shape.spec[1];
        // SG (vk::Variant) picks the module; the subgroup form's 4th constant is SEPARATE_V, the
        // blocked form's the head_dim its tiles are sized for.
        const bool subgroup = shape.spec[3] == 1, blocked = shape.spec[3] == vk::kAttentionBlocked;
        std::vector<uint32_t> spec(shape.spec.begin(), shape.spec.begin() + 3);
        if (subgroup) spec.push_back(vk::attention_separate_values(shape, ctx_->info()) ? 1 : 0);
        if (blocked) spec.push_back(vk::blocked_attention_head_dim(shape, hd));
        run(subgroup  ? "attention_tiled_sg"
            : blocked ? "attention_tiled_rb"
                      : "attention_tiled",
            spec, {in(q), in(k), in(v), in(k_cache), in(v_cache), in(start), out(out_t)}, p,
            static_cast<uint32_t>((T + bq - 1) / bq), static_cast<uint32_t>(H),
            static_cast<uint32_t>(B));
        return;
    }

    run("attention", {tu.attention_wg, tu.attention_chunk},
        {in(q), in(k), in(v), in(k_cache), in(v_cache), in(start), out(out_t)}, p,
        static_cast<uint32_t>(T), static_cast<uint32_t>(H), static_cast<uint32_t>(B));
}

namespace {

// attention_backward_tiled.comp (the query side) and attention_backward_kv_tiled.comp (the key
// side) share one shape: BQ queries (or query-head pairs) and BK keys a tile in 4 x 4 register
// blocks (WG = BQ * BK / 16), the tiles sized for a head_dim (MAX_HEAD_DIM: 32, 64 or 128, a
// multiple of both), so that a small head_dim does not pay for 128-wide tiles.
constexpr int64_t kBackwardTiledMaxHeadDim = 128;
struct BackwardTiles {
    uint32_t wg = 0, queries = 0, keys = 0, max_hd = 0;
    std::vector<uint32_t> spec() const { return {wg, queries, keys, max_hd}; }
};

// 32 queries (or pairs) and 32 keys a tile, 64 invocations, sized for the head_dim: at most
// at most 27 KiB (head_dim 128), within the 32 KiB of lavapipe and MoltenVK, where it is tested.
// None past head_dim 128 or on a device with less shared memory.
std::optional<BackwardTiles> backward_tiles(int64_t hd, uint64_t shared_bytes) {
    if (hd > kBackwardTiledMaxHeadDim) return std::nullopt;
    BackwardTiles tiles{64, 32, 32, 32};
    while (tiles.max_hd < hd) tiles.max_hd *= 2;
    // The arrays at the top of each shader, in floats.
    const uint64_t qp = tiles.queries + 4, kp = tiles.keys + 4, rp = tiles.max_hd + 4;
    const uint64_t parts = tiles.keys / 4;
    const uint64_t query_side = 32 * qp + 32 * kp + 8 * rp + 2 * tiles.keys * qp +
                                3 * parts * tiles.queries + 3 * tiles.queries;
    const uint64_t key_side =
        32 * kp + 32 * qp + 2 * 8 * rp + 2 * tiles.queries * kp + 3 * tiles.queries;
    if (std::max(query_side, key_side) * 4 > shared_bytes) return std::nullopt;
    return tiles;
}

}  // namespace

// Tiled (attention_backward_tiled.comp, attention_backward_kv_tiled.comp) where head_dim and
// the device's shared memory allow, else one workgroup per query, then per key
// (attention_backward.comp, attention_backward_kv.comp). Either pair writes the same statistics
// and follows one fixed summation order, so each is bitwise reproducible; the two differ from
// each other by rounding only.
void VulkanBackend::attention_backward_impl(const Tensor& q, const Tensor& k, const Tensor& v,
                                            const Tensor& d_out, const Tensor& d_q,
                                            const Tensor& d_k, const Tensor& d_v, int64_t window) {
    if (q.numel() == 0) return;
    const int64_t B = q.dim(0), T = q.dim(1), H = q.dim(2), Hkv = k.dim(2), hd = q.dim(3);
    if (hd > kBackwardMaxHeadDim)
        throw Error("attention_backward: head_dim " + std::to_string(hd) +
                    " is larger than the Vulkan backend supports (" +
                    std::to_string(kBackwardMaxHeadDim) + ")");
    // Both passes' push constants after the binding offsets.
    struct {
        uint32_t T, H, Hkv, hd, window;
        float scale;
    } p{static_cast<uint32_t>(T),
        static_cast<uint32_t>(H),
        static_cast<uint32_t>(Hkv),
        static_cast<uint32_t>(hd),
        static_cast<uint32_t>(std::min<int64_t>(window, std::numeric_limits<int32_t>::max())),
        1.0f / std::sqrt(static_cast<float>(hd))};
    // Per (b, h, i): the softmax max m, denominator l and D = sum_j P_ij dP_ij, written by pass
    // 1 and read by pass 2.
    Tensor stats = alloc({B * H * T * 3});
    if (const auto tiles = backward_tiles(hd, ctx_->info().shared_memory_bytes)) {
        run("attention_backward_tiled", tiles->spec(),
            {in(q), in(k), in(v), in(d_out), inout(d_q), out(stats)}, p,
            static_cast<uint32_t>((T + tiles->queries - 1) / tiles->queries),
            static_cast<uint32_t>(H), static_cast<uint32_t>(B));
        run("attention_backward_kv_tiled", tiles->spec(),
            {in(q), in(k), in(v), in(d_out), in(stats), inout(d_k), inout(d_v)}, p,
            static_cast<uint32_t>((T + tiles->keys - 1) / tiles->keys), static_cast<uint32_t>(Hkv),
            static_cast<uint32_t>(B));
        return;
    }
    run("attention_backward", {kBackwardWg, kBackwardChunk},
        {in(q), in(k), in(v), in(d_out), inout(d_q), out(stats)}, p, static_cast<uint32_t>(T),
        static_cast<uint32_t>(H), static_cast<uint32_t>(B));
    run("attention_backward_kv", {kBackwardWg, kBackwardChunk},
        {in(q), in(k), in(v), in(d_out), in(stats), inout(d_k), inout(d_v)}, p,
        static_cast<uint32_t>(T), static_cast<uint32_t>(Hkv), static_cast<uint32_t>(B));
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

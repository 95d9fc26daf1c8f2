// The Vulkan backend's fused moe_route, rope_attention_cached_store and grouped_ffn_down take
// their fused paths at decoding's sizes and run the sequence elsewhere (backends/vulkan/moe.cpp,
// attention.cpp, matmul.cpp), counted in dispatches: the fewer commands are the point of fusing.
// Their results against the CPU are tests/backends/fused_ops_test.cpp's.
#ifdef TMX_HAS_VULKAN

#include <functional>

#include "tests/backends/vulkan/vulkan_fixture.h"

namespace tmx::test {
namespace {

class VulkanFusedOps : public VulkanTest {
  protected:
    uint64_t dispatches_of(const std::function<void()>& op) {
        const uint64_t before = vk().counters().dispatches;
        op();
        const uint64_t n = vk().counters().dispatches - before;
        vk().synchronize();  // and no error reported
        return n;
    }
};

// One workgroup for N <= 64 rows and N * k <= 512 slots (moe_route.comp), else router_topk,
// moe_group and gather_rows.
TEST_F(VulkanFusedOps, MoeRouteIsOneDispatchAtDecodingsRows) {
    SCOPED_TRACE(trace());
    const int64_t d = 24;
    struct Case {
        int64_t N, E, k;
        uint64_t dispatches;
    };
    for (const Case c : {Case{1, 8, 2, 1}, Case{4, 8, 2, 1}, Case{64, 8, 2, 1}, Case{64, 8, 8, 1},
                         Case{4, 1024, 8, 1}, Case{65, 8, 2, 3}, Case{57, 16, 9, 3}}) {
        SCOPED_TRACE("N " + std::to_string(c.N) + " E " + std::to_string(c.E) + " k " +
                     std::to_string(c.k));
        Backend& b = vk();
        const int64_t slots = c.N * c.k;
        const Tensor logits = up(b, normal(c.N * c.E), {c.N, c.E}),
                     x = up(b, normal(c.N * d), {c.N, d});
        const Tensor idx = poisoned_ids(b, {c.N, c.k}), gates = poisoned(b, {c.N, c.k}),
                     offsets = poisoned_ids(b, {c.E + 1}), rows = poisoned_ids(b, {slots}),
                     slot_of = poisoned_ids(b, {slots}), xs = poisoned(b, {slots, d});
        EXPECT_EQ(
            dispatches_of([&] { b.moe_route(logits, x, idx, gates, offsets, rows, slot_of, xs); }),
            c.dispatches);
        EXPECT_EQ(down_ids(b, offsets).back(), slots);
    }
}

// On the split path (T <= attention_split_max_t), q and k are rotated as they are read and the
// merge also writes the cache: as many dispatches as attention_cached alone. Elsewhere, RoPE on
// q and on k, attention_cached and then kv_cache_write.
TEST_F(VulkanFusedOps, RopeAttentionCachedStoreIsTheSplitPathsTwoDispatches) {
    SCOPED_TRACE(trace());
    const int64_t B = 2, H = 4, Hkv = 2, hd = 16, S = 40;
    const int64_t split_max_t = vk().tuning().attention_split_max_t;
    for (const int64_t T : {int64_t{1}, split_max_t, split_max_t + 1, int64_t{16}}) {
        SCOPED_TRACE("T " + std::to_string(T));
        Backend& b = vk();
        const Tensor q = up(b, normal(B * T * H * hd), {B, T, H, hd}),
                     k = up(b, normal(B * T * Hkv * hd), {B, T, Hkv, hd}),
                     v = up(b, normal(B * T * Hkv * hd), {B, T, Hkv, hd}),
                     k_cache = up(b, normal(B * S * Hkv * hd), {B, S, Hkv, hd}),
                     v_cache = up(b, normal(B * S * Hkv * hd), {B, S, Hkv, hd}),
                     start = up_ids(b, {3, 20}, {B}), out = b.alloc({B, T, H, hd});
        std::vector<int32_t> positions;
        for (int32_t s : {3, 20})
            for (int64_t t = 0; t < T; ++t) positions.push_back(s + static_cast<int32_t>(t));
        const Tensor pos = up_ids(b, positions, {B * T});
        const uint64_t attention = dispatches_of(
            [&] { b.attention_cached(q, k, v, k_cache, v_cache, start, out, /*window=*/0); });
        const uint64_t fused = dispatches_of([&] {
            b.rope_attention_cached_store(q, k, v, pos, 10000.0, k_cache, v_cache, start, out,
                                          /*window=*/0);
        });
        EXPECT_EQ(fused, T <= split_max_t ? attention : attention + 3);
    }
}

// One token's slots and their combine into the residual: one dispatch (grouped_matmul_gemv.comp's
// OP_COMBINE); more tokens, the product and moe_combine. Its results against the sequence's on
// the same backend: within the product's rounding (the same sums, another shader's last add).
TEST_F(VulkanFusedOps, GroupedFfnDownIsOneDispatchForOneToken) {
    SCOPED_TRACE(trace());
    const int64_t E = 4, Nout = 40, K = 48;
    for (const int64_t N : {int64_t{1}, int64_t{2}}) {
        SCOPED_TRACE("N " + std::to_string(N));
        Backend& b = vk();
        const int64_t k = 2, S = N * k;
        // Token n's choices: experts n % E and (n + 2) % E, slots sorted by expert.
        std::vector<int32_t> counts(E, 0), expert_of;
        for (int64_t n = 0; n < N; ++n)
            for (int64_t e : {n % E, (n + 2) % E}) {
                expert_of.push_back(static_cast<int32_t>(e));
                ++counts[e];
            }
        const std::vector<int32_t> offsets = expert_offsets(counts);
        std::vector<int32_t> slot_of, next(offsets.begin(), offsets.end());
        for (int32_t e : expert_of) slot_of.push_back(next[e]++);
        const auto h = normal(N * Nout);
        const Tensor x = up(b, normal(S * K), {S, K}),
                     w2 = up(b, normal(E * Nout * K), {E, Nout, K}),
                     b2 = up(b, normal(E * Nout), {E, Nout}), off = up_ids(b, offsets, {E + 1}),
                     of = up_ids(b, slot_of, {S}), gates = up(b, normal(S), {N, k});
        Tensor fused_out = up(b, h, {N, Nout}), fused_ys = poisoned(b, {S, Nout});
        EXPECT_EQ(dispatches_of(
                      [&] { b.grouped_ffn_down(x, w2, b2, off, of, gates, fused_ys, fused_out); }),
                  N == 1 ? 1u : 2u);
        Tensor seq_out = up(b, h, {N, Nout}), seq_ys = poisoned(b, {S, Nout});
        b.grouped_matmul(x, w2, b2, off, seq_ys);
        b.moe_combine(seq_ys, of, gates, seq_out);
        EXPECT_TRUE(Close(down(b, fused_ys), down(b, seq_ys), 1e-6));
        EXPECT_TRUE(Close(down(b, fused_out), down(b, seq_out), 1e-6));
    }
}

}  // namespace
}  // namespace tmx::test

#endif  // TMX_HAS_VULKAN

// The Vulkan attention paths against the CPU backend at the sizes that select them
// (backends/vulkan/attention.cpp): the split over key slices for few queries (a long wrapped
// cache, windows shorter than the split so whole slices are empty), the tiled kernel for many
// queries (windows, GQA, an odd head_dim, sequences at different starts) in both its forms,
// and the fallback shader for head_dim 256. Cache slots the contract says are not read hold NaN.
#ifdef TMX_HAS_VULKAN

#include <limits>

#include "backends/vulkan/vulkan_tuning.h"
#include "tests/backends/backend_pair_fixture.h"  // BitwiseEqual
#include "tests/backends/vulkan/vulkan_fixture.h"

namespace tmx::test {
namespace {

struct Case {
    int64_t T, H, Hkv, hd, window, S;  // S 0: plain attention(), no cache
    std::vector<int32_t> start;        // one per sequence (with a cache)
};

std::string describe(const Case& c) {
    std::string s = "T,H,Hkv,hd,window,S " + std::to_string(c.T) + "," + std::to_string(c.H) + "," +
                    std::to_string(c.Hkv) + "," + std::to_string(c.hd) + "," +
                    std::to_string(c.window) + "," + std::to_string(c.S) + " starts";
    for (int32_t p : c.start) s += " " + std::to_string(p);
    return s;
}

class VulkanAttention : public VulkanTest {
  protected:
    // Runs the case on both backends; expects the results within the reduction tolerance and
    // the Vulkan backend to record `dispatches` dispatches, and to give the same bits when run
    // again.
    void check(const Case& c, uint64_t dispatches) {
        SCOPED_TRACE(describe(c));
        const bool cached = c.S > 0;
        const int64_t B = static_cast<int64_t>(c.start.size()), row = c.Hkv * c.hd;
        auto q = normal(B * c.T * c.H * c.hd, 1.5), k = normal(B * c.T * row, 1.5),
             v = normal(B * c.T * row);
        std::vector<float> kc(B * c.S * row, std::numeric_limits<float>::quiet_NaN()), vc = kc;
        for (int64_t b = 0; b < B && cached; ++b)
            for (int64_t p = std::max<int64_t>(0, c.start[b] - c.S); p < c.start[b]; ++p) {
                const int64_t at = (b * c.S + p % c.S) * row;
                const auto kr = normal(row, 1.5), vr = normal(row);
                std::copy(kr.begin(), kr.end(), kc.begin() + at);
                std::copy(vr.begin(), vr.end(), vc.begin() + at);
            }
        std::vector<float> results[2];
        int i = 0;
        for (Backend* be : {static_cast<Backend*>(&vk()), &cpu()}) {
            Tensor qt = up(*be, q, {B, c.T, c.H, c.hd}), kt = up(*be, k, {B, c.T, c.Hkv, c.hd}),
                   vt = up(*be, v, {B, c.T, c.Hkv, c.hd}), out = be->alloc({B, c.T, c.H, c.hd});
            const uint64_t before = vk().counters().dispatches;
            if (cached) {
                be->attention_cached(qt, kt, vt, up(*be, kc, {B, c.S, c.Hkv, c.hd}),
                                     up(*be, vc, {B, c.S, c.Hkv, c.hd}), up_ids(*be, c.start, {B}),
                                     out, c.window);
            } else {
                be->attention(qt, kt, vt, out, c.window);
            }
            if (be == &vk()) {
                EXPECT_EQ(vk().counters().dispatches - before, dispatches) << "the path taken";
            }
            results[i++] = down(*be, out);
            if (be == &vk()) {
                Tensor again = be->alloc({B, c.T, c.H, c.hd});
                if (cached) {
                    be->attention_cached(qt, kt, vt, up(*be, kc, {B, c.S, c.Hkv, c.hd}),
                                         up(*be, vc, {B, c.S, c.Hkv, c.hd}),
                                         up_ids(*be, c.start, {B}), again, c.window);
                } else {
                    be->attention(qt, kt, vt, again, c.window);
                }
                EXPECT_TRUE(BitwiseEqual(down(*be, again), results[0])) << "a second run";
            }
        }
        const int64_t keys = c.window ? c.window : c.S + c.T;
        EXPECT_TRUE(Close(results[0], results[1], reduction_tol(std::max(c.hd, keys))));
    }
};

// 1000 slots, window 700: 11 slices of 64 keys. Sequences: wrapped several times (every
// slice full), 100 positions (slices 2 to 10 empty), an empty cache (only the query itself).
TEST_F(VulkanAttention, DecodeSplitsALongWrappedCache) {
    SCOPED_TRACE(trace());
    check({1, 8, 2, 64, 700, 1000, {2345, 100, 0}}, 2);
    check({3, 8, 1, 24, 700, 1000, {1999, 5}}, 2);    // a few queries, group 8, odd head_dim
    check({4, 6, 3, 32, 0, 1000, {996, 0, 129}}, 2);  // no window: the cache holds it all
    check({1, 4, 4, 16, 1, 1000, {1500}}, 2);         // window 1: the query alone
    check({2, 8, 2, 64, 700, 0, {0, 0}}, 2);          // plain attention() of 2 tokens
}

TEST_F(VulkanAttention, PrefillTilesMatchCpu) {
    SCOPED_TRACE(trace());
    for (int64_t hd : {64, 24}) {
        check({300, 8, 2, hd, 64, 64, {0, 517}}, 1);  // window 64, cache of the window
        check({300, 8, 2, hd, 0, 400, {0, 90}}, 1);   // no window: the cache covers all
        check({300, 8, 2, hd, 64, 0, {0, 0}}, 1);     // plain attention(), window 64
        check({300, 8, 2, hd, 0, 0, {0, 0}}, 1);      // plain attention(), no window
    }
    check({17, 4, 1, 128, 5, 16, {3, 40}}, 1);  // a partial query tile, head_dim 128
}

// The tiled kernel's subgroup form (".sg1", vulkan_tuning.h) forced, at the default form's
// cases: a variant whose key and value tiles lie side by side in shared memory and one whose
// value tile takes the key tile's place, where the device has them.
TEST_F(VulkanAttention, PrefillSubgroupTilesMatchCpu) {
    SCOPED_TRACE(trace());
    const vk::DeviceInfo& d = vk().context().info();
    if (!d.subgroup_shuffle) GTEST_SKIP() << "no subgroup shuffles";
    std::vector<vk::Variant> picked;
    for (bool separate : {true, false})
        for (const vk::Variant& v : vk::candidates(vk::Kernel::AttentionTiled, d))
            if (v.spec[3] == 1 && vk::attention_separate_values(v, d) == separate) {
                picked.push_back(v);
                break;
            }
    ASSERT_FALSE(picked.empty());
    for (const vk::Variant& v : picked) {
        const std::string name = v.name(vk::Kernel::AttentionTiled);
        SCOPED_TRACE("attention_tiled=" + name);
        vk().force_variant("attention_tiled", name);
        for (int64_t hd : {64, 24}) {
            check({300, 8, 2, hd, 64, 64, {0, 517}}, 1);
            check({300, 8, 2, hd, 0, 400, {0, 90}}, 1);
            check({300, 8, 2, hd, 64, 0, {0, 0}}, 1);
            check({300, 8, 2, hd, 0, 0, {0, 0}}, 1);
        }
        check({17, 4, 1, 128, 5, 16, {3, 40}}, 1);
        check({40, 4, 4, 40, 0, 30, {0, 200}}, 1);  // GQA group 1, head_dim 40
    }
    vk().force_variant("attention_tiled", "");
}

// head_dim 256: beyond the tiled kernel, so the fallback shader runs; decode still splits.
TEST_F(VulkanAttention, HeadDim256FallsBackForPrefill) {
    SCOPED_TRACE(trace());
    check({40, 4, 2, 256, 16, 16, {0, 33}}, 1);
    check({40, 4, 2, 256, 0, 0, {0, 0}}, 1);
    check({1, 4, 1, 256, 200, 300, {777}}, 2);
}

}  // namespace
}  // namespace tmx::test

#endif  // TMX_HAS_VULKAN

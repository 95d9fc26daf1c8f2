// The Vulkan attention paths against the CPU backend at the sizes that select them
// (backends/vulkan/attention.cpp): the split over key slices for few queries (a long wrapped
// cache, windows shorter than the split so whole slices are empty), the tiled kernel for many
// queries (windows, GQA, an odd head_dim, sequences at different starts) in both its forms,
// and the fallback shader for head_dim 256. Cache slots the contract says are not read hold NaN.
// Then the backward's tiled passes and their fallback (VulkanAttentionBackward).
#ifdef TMX_HAS_VULKAN

#include <limits>
#include <string>
#include <vector>

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

// Decoding's split at other shapes (tmx tune's candidates, vulkan_tuning.h): short slices with
// several invocations summing parts of each key's dot products, a slice length that does not
// divide the workgroup, slices longer than the workgroup: the cases above, then RoPE, attention
// and the cache write in one (rope_attention_cached_store, whose split stages the chunk's
// rotated keys) against the CPU.
TEST_F(VulkanAttention, DecodeSplitsAtOtherShapes) {
    SCOPED_TRACE(trace());
    for (const char* shape : {"wg64.sl16", "wg256.sl16", "wg32.sl7", "wg64.sl100"}) {
        SCOPED_TRACE(std::string("attention_split=") + shape);
        vk().force_variant("attention_split", shape);
        check({1, 8, 2, 64, 700, 1000, {2345, 100, 0}}, 2);
        check({3, 8, 1, 24, 700, 1000, {1999, 5}}, 2);
        check({1, 4, 4, 16, 1, 1000, {1500}}, 2);

        const int64_t B = 2, T = 2, H = 8, Hkv = 2, hd = 32, S = 300, window = 200;
        const std::vector<int32_t> starts{517, 40};
        std::vector<int32_t> positions;
        for (int32_t p : starts)
            for (int32_t t = 0; t < T; ++t) positions.push_back(p + t);
        const auto q = normal(B * T * H * hd), k = normal(B * T * Hkv * hd),
                   v = normal(B * T * Hkv * hd), kc = normal(B * S * Hkv * hd),
                   vc = normal(B * S * Hkv * hd);
        std::vector<float> got[2][3];
        int i = 0;
        for (Backend* be : {static_cast<Backend*>(&vk()), &cpu()}) {
            const Tensor k_cache = up(*be, kc, {B, S, Hkv, hd}),
                         v_cache = up(*be, vc, {B, S, Hkv, hd}), out = be->alloc({B, T, H, hd});
            const uint64_t before = vk().counters().dispatches;
            be->rope_attention_cached_store(up(*be, q, {B, T, H, hd}), up(*be, k, {B, T, Hkv, hd}),
                                            up(*be, v, {B, T, Hkv, hd}),
                                            up_ids(*be, positions, {B * T}), 10000.0, k_cache,
                                            v_cache, up_ids(*be, starts, {B}), out, window);
            if (be == &vk()) {
                EXPECT_EQ(vk().counters().dispatches - before, 2u) << "the split path";
            }
            got[i][0] = down(*be, out);
            got[i][1] = down(*be, k_cache);
            got[i][2] = down(*be, v_cache);
            ++i;
        }
        EXPECT_TRUE(Close(got[0][0], got[1][0], reduction_tol(window))) << "out";
        EXPECT_TRUE(Close(got[0][1], got[1][1], 1e-6)) << "the keys stored, rotated";
        EXPECT_TRUE(BitwiseEqual(got[0][2], got[1][2])) << "the values stored";
    }
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

// attention_backward: the tiled passes (attention_backward_tiled.comp, then
// attention_backward_kv_tiled.comp) up to head_dim 128, the per-query and per-key shaders
// beyond. The shared cases (tests/backends/backward_ops_test.cpp) cover windows shorter and
// longer than a tile, window 0, GQA groups 1, 3 and 4 and sequences that are no multiple of the
// tiles at head_dim 8 to 64; these add the head_dims with other tile shapes (24 in 32-wide
// tiles, 128 in 8-key tiles), sequences and windows at a tile's edge, and the fallback.
class VulkanAttentionBackward : public VulkanTest {
  protected:
    struct BackwardCase {
        int64_t B, T, H, Hkv, hd, window;
    };

    // Runs the case on both backends and twice more on Vulkan: expects the results within the
    // reduction tolerance of the CPU's, the repeats bit-identical, and (where the device can
    // time its commands, which names them) the two shaders `first` then `second`.
    void check(const BackwardCase& c, const std::string& first, const std::string& second) {
        SCOPED_TRACE("B,T,H,Hkv,hd,window " + std::to_string(c.B) + "," + std::to_string(c.T) +
                     "," + std::to_string(c.H) + "," + std::to_string(c.Hkv) + "," +
                     std::to_string(c.hd) + "," + std::to_string(c.window));
        const Shape qs{c.B, c.T, c.H, c.hd}, ks{c.B, c.T, c.Hkv, c.hd};
        const int64_t nq = shape_numel(qs), nk = shape_numel(ks);
        const auto q = normal(nq, 1.5), k = normal(nk, 1.5), v = normal(nk), d_out = normal(nq);
        const auto init_q = normal(nq), init_k = normal(nk), init_v = normal(nk);
        auto run = [&](Backend& be) {
            Tensor d_q = up(be, init_q, qs), d_k = up(be, init_k, ks), d_v = up(be, init_v, ks);
            be.attention_backward(up(be, q, qs), up(be, k, ks), up(be, v, ks), up(be, d_out, qs),
                                  d_q, d_k, d_v, c.window);
            return std::vector<std::vector<float>>{down(be, d_q), down(be, d_k), down(be, d_v)};
        };
        const auto want = run(cpu());
        std::vector<std::vector<float>> got;
        if (vk().can_profile()) {
            vk().synchronize();
            vk().begin_profile();
            got = run(vk());
            const std::vector<Backend::ProfiledCommands> profile = vk().end_profile();
            std::vector<std::string> shaders;
            for (const Backend::ProfiledCommands& p : profile)
                if (p.name.rfind("attention", 0) == 0) shaders.push_back(p.name);
            EXPECT_EQ(shaders, (std::vector<std::string>{first, second})) << "the path taken";
        } else {
            got = run(vk());
        }
        const int64_t keys = c.window > 0 ? std::min(c.window, c.T) : c.T;
        const double tol = reduction_tol(c.hd + (c.H / c.Hkv) * keys);
        const char* names[] = {"d_q", "d_k", "d_v"};
        for (int o = 0; o < 3; ++o) EXPECT_TRUE(Close(got[o], want[o], tol)) << names[o];
        EXPECT_EQ(run(vk()), got) << "a repeat differs";
    }
};

TEST_F(VulkanAttentionBackward, TilesMatchCpuAndRepeatBitwise) {
    SCOPED_TRACE(trace());
    for (int64_t hd : {24, 128}) {
        check({2, 45, 8, 2, hd, 0}, "attention_backward_tiled", "attention_backward_kv_tiled");
        check({1, 70, 4, 4, hd, 9}, "attention_backward_tiled", "attention_backward_kv_tiled");
        check({2, 33, 8, 2, hd, 40}, "attention_backward_tiled", "attention_backward_kv_tiled");
    }
    // Sequences of whole tiles, windows of a tile and one key either side of it.
    for (int64_t window : {15, 16, 17})
        check({1, 48, 8, 2, 64, window}, "attention_backward_tiled", "attention_backward_kv_tiled");
    check({2, 32, 4, 1, 64, 0}, "attention_backward_tiled", "attention_backward_kv_tiled");
    check({1, 1, 4, 2, 64, 0}, "attention_backward_tiled", "attention_backward_kv_tiled");
}

// head_dim 256: beyond the tiles, one workgroup per query, then per key.
TEST_F(VulkanAttentionBackward, HeadDim256FallsBack) {
    SCOPED_TRACE(trace());
    check({2, 40, 4, 2, 256, 16}, "attention_backward", "attention_backward_kv");
    check({1, 19, 4, 4, 256, 0}, "attention_backward", "attention_backward_kv");
}

}  // namespace
}  // namespace tmx::test

#endif  // TMX_HAS_VULKAN

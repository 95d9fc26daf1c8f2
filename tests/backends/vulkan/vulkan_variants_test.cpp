// Every variant of every tunable shader family (vulkan_tuning.h) against the CPU backend.
// Without tuning a device only ever runs the few built-in defaults, but `tmx tune` may pick any
// candidate, and TMX_VULKAN_FORCE_VARIANT forces one: each must compute the same product, on
// shapes that are no multiple of any tile (partial tiles in every dimension), in every layout,
// with bias and accumulation, and grouped over experts with uneven counts (one with no slot).
// The matrix-vector kernels also read weights stored in every format (f16, bf16, Q8_0; f16 is
// also the module the fp16 weight copies run) starting half-way into a word, and operands that
// start off a 16-byte boundary (their one-by-one reads); the dense one also with norm_linear's
// norm in its dispatch (its prologue). CI runs this suite at lavapipe's subgroup sizes 4, 8
// and 16 (tests/CMakeLists.txt), as the shaders' reductions depend on it.
#ifdef TMX_HAS_VULKAN

#include <algorithm>
#include <array>
#include <cstdlib>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "backends/vulkan/vulkan_tuning.h"
#include "engine/compute/kernel_tuning.h"
#include "engine/compute/weight_format.h"
#include "tests/backends/backend_pair_fixture.h"  // BitwiseEqual
#include "tests/backends/vulkan/vulkan_fixture.h"

namespace tmx::test {
namespace {

std::string dims(std::initializer_list<int64_t> v) {
    std::string s;
    for (int64_t d : v) s += (s.empty() ? "" : ",") + std::to_string(d);
    return s;
}

class VulkanVariants : public VulkanTest {
  protected:
    // Runs `body` once with each candidate of `kernel` forced on the Vulkan backend (the variant
    // named in failures), checking that the calls really ran that kernel (every call, but for
    // the backward's two kernels, which run together); then clears the forced variant. `keep`
    // (when given) picks the candidates to run.
    template <class F>
    void for_each_variant(vk::Kernel kernel, F body,
                          const std::function<bool(const vk::Variant&)>& keep = nullptr) {
        const std::string family = vk::kernel_name(kernel);
        std::vector<vk::Variant> variants = vk::candidates(kernel, vk().context().info());
        if (keep) std::erase_if(variants, [&](const vk::Variant& v) { return !keep(v); });
        ASSERT_FALSE(variants.empty()) << family;
        const bool backward =
            kernel == vk::Kernel::GroupedMatmulDx || kernel == vk::Kernel::GroupedMatmulDw;
        for (const vk::Variant& v : variants) {
            const std::string name = v.name(kernel);
            SCOPED_TRACE(family + " variant " + name);
            vk().force_variant(family, name);
            std::vector<TunableCall> log;
            vk().log_calls(&log);
            body();
            vk().log_calls(nullptr);
            const auto ran = std::count_if(
                log.begin(), log.end(), [&](const TunableCall& c) { return c.kernel == family; });
            EXPECT_GT(ran, 0) << "no call ran " << family;
            if (!backward) {
                EXPECT_EQ(static_cast<size_t>(ran), log.size()) << "calls ran another kernel";
            }
        }
        vk().force_variant(family, "");
    }

    // A [rows, cols] output on `be`: NaN (every element must be written) or, to accumulate onto,
    // `init`.
    static Tensor output(Backend& be, Shape shape, const std::vector<float>* init = nullptr) {
        return init ? up(be, *init, std::move(shape)) : poisoned(be, std::move(shape));
    }

    // matmul(a, b) (+ bias) on both backends, a [M, K] or [K, M], b [K, N] or [N, K].
    void check_matmul(int64_t M, int64_t N, int64_t K, bool ta, bool tb, bool accumulate) {
        SCOPED_TRACE("matmul M,N,K " + dims({M, N, K}) + " ta " + std::to_string(ta) + " tb " +
                     std::to_string(tb) + (accumulate ? " accumulate" : ""));
        const auto a = normal(M * K), b = normal(K * N), bias = normal(N), init = normal(M * N);
        const Shape sa = ta ? Shape{K, M} : Shape{M, K};
        const Shape sb = tb ? Shape{N, K} : Shape{K, N};
        const MatmulOptions o{.trans_a = ta, .trans_b = tb, .accumulate = accumulate};
        std::vector<float> results[2];
        int i = 0;
        for (Backend* be : {static_cast<Backend*>(&vk()), &cpu()}) {
            Tensor out = output(*be, {M, N}, accumulate ? &init : nullptr);
            be->matmul(up(*be, a, sa), up(*be, b, sb), out, o, up(*be, bias, {N}));
            results[i++] = down(*be, out);
        }
        EXPECT_TRUE(Close(results[0], results[1], reduction_tol(K)));
    }

    // linear(x [M, K], w [N, K], bias) on both backends.
    void check_linear(int64_t M, int64_t N, int64_t K) {
        SCOPED_TRACE("linear M,N,K " + dims({M, N, K}));
        const auto x = normal(M * K), w = normal(N * K), bias = normal(N);
        std::vector<float> results[2];
        int i = 0;
        for (Backend* be : {static_cast<Backend*>(&vk()), &cpu()}) {
            Tensor y = output(*be, {M, N});
            be->linear(up(*be, x, {M, K}), up(*be, w, {N, K}), up(*be, bias, {N}), y);
            results[i++] = down(*be, y);
        }
        EXPECT_TRUE(Close(results[0], results[1], reduction_tol(K)));
    }

    // A weight of `shape` stored in format t on the Vulkan backend, `lead` values into its buffer
    // (f16 and bf16 after 1 value, Q8_0 after one block: half-way into a 4-byte word; f32 after
    // 1: off a 16-byte boundary), and its decoded values on the CPU backend.
    std::array<Tensor, 2> stored(DType t, Shape shape, int64_t lead) {
        const int64_t n = lead + shape_numel(shape);
        const std::vector<float> all = normal(n, 0.5);
        std::vector<uint8_t> bytes(static_cast<size_t>(dtype_bytes(t, n)));
        encode_weights(t, all.data(), n, bytes.data());
        std::vector<float> decoded(static_cast<size_t>(n));
        decode_weights(t, bytes.data(), n, decoded.data());
        Tensor flat = vk().alloc({n}, t);
        vk().upload(flat, bytes.data());
        return {flat.slice(lead, shape), up(cpu(), decoded, {n}).slice(lead, shape)};
    }

    // An fp32 operand of `shape` on `be`, `lead` values into its buffer.
    static Tensor offset(Backend& be, const std::vector<float>& values, int64_t lead, Shape shape) {
        std::vector<float> all(static_cast<size_t>(lead), 0.0f);
        all.insert(all.end(), values.begin(), values.end());
        return up(be, all, {static_cast<int64_t>(all.size())}).slice(lead, std::move(shape));
    }

    // linear(x [M, K], w [N, K] in format t, bias), w `w_lead` and x `x_lead` values into their
    // buffers, against the CPU on w's decoded values.
    void check_linear_stored(DType t, int64_t w_lead, int64_t x_lead, int64_t M, int64_t N,
                             int64_t K) {
        SCOPED_TRACE(std::string("linear ") + to_string(t) + " M,N,K " + dims({M, N, K}) +
                     " w lead " + std::to_string(w_lead) + " x lead " + std::to_string(x_lead));
        const std::array<Tensor, 2> w = stored(t, {N, K}, w_lead);
        const auto x = normal(M * K), bias = normal(N);
        std::vector<float> results[2];
        int i = 0;
        for (Backend* be : {static_cast<Backend*>(&vk()), &cpu()}) {
            Tensor y = output(*be, {M, N});
            be->linear(offset(*be, x, x_lead, {M, K}), w[i], up(*be, bias, {N}), y);
            results[i++] = down(*be, y);
        }
        EXPECT_TRUE(Close(results[0], results[1], reduction_tol(K)));
    }

    // norm_linear(x [M, K]) into y [M, N] with w [N, K] stored in format t: w `w_lead` values
    // into its buffer, x `x_lead`, the norm's weight and bias and normed `norm_lead` (the
    // product's 4-at-a-time reads need all of them on 16-byte boundaries); against the CPU on
    // w's decoded values. Up to Tuning::norm_prologue_max_rows rows it is one dispatch (the
    // norm runs in the product's), above them two.
    void check_norm_linear(NormType type, DType t, int64_t w_lead, int64_t x_lead,
                           int64_t norm_lead, int64_t M, int64_t N, int64_t K) {
        const bool layernorm = type == NormType::LayerNorm;
        SCOPED_TRACE(std::string("norm_linear ") + (layernorm ? "layernorm " : "rmsnorm ") +
                     to_string(t) + " M,N,K " + dims({M, N, K}) + " leads w,x,norm " +
                     dims({w_lead, x_lead, norm_lead}));
        const std::array<Tensor, 2> w = stored(t, {N, K}, w_lead);
        const auto x = normal(M * K, 2.0), g = normal(K), beta = normal(K), bias = normal(N);
        std::array<std::vector<float>, 2> y, normed;
        int i = 0;
        for (Backend* be : {static_cast<Backend*>(&vk()), &cpu()}) {
            Tensor y_t = output(*be, {M, N});
            Tensor normed_t = poisoned(*be, {norm_lead + M * K}).slice(norm_lead, {M, K});
            const uint64_t dispatches = vk().counters().dispatches;
            be->norm_linear(type, offset(*be, x, x_lead, {M, K}), offset(*be, g, norm_lead, {K}),
                            layernorm ? offset(*be, beta, norm_lead, {K}) : Tensor{}, 1e-5f,
                            normed_t, w[i], up(*be, bias, {N}), y_t);
            if (be == &vk()) {
                EXPECT_EQ(vk().counters().dispatches - dispatches,
                          M <= vk().tuning().norm_prologue_max_rows ? 1u : 2u);
            }
            y[i] = down(*be, y_t);
            normed[i++] = down(*be, normed_t);
        }
        EXPECT_TRUE(Close(normed[0], normed[1], reduction_tol(K))) << "normed";
        EXPECT_TRUE(Close(y[0], y[1], reduction_tol(K))) << "y";
    }

    // grouped_matmul as check_grouped, with w [E, Nout, K] in format t, `w_lead` and `x_lead`
    // values into their buffers.
    void check_grouped_stored(DType t, int64_t w_lead, int64_t x_lead,
                              const std::vector<int32_t>& counts, int64_t Nout, int64_t K) {
        const int64_t E = static_cast<int64_t>(counts.size());
        const std::vector<int32_t> offsets = expert_offsets(counts);
        const int64_t S = offsets[E];
        SCOPED_TRACE(std::string("grouped_matmul ") + to_string(t) + " S,E,Nout,K " +
                     dims({S, E, Nout, K}) + " w lead " + std::to_string(w_lead) + " x lead " +
                     std::to_string(x_lead));
        const std::array<Tensor, 2> w = stored(t, {E, Nout, K}, w_lead);
        const auto x = normal(S * K), bias = normal(E * Nout);
        std::vector<float> results[2];
        int i = 0;
        for (Backend* be : {static_cast<Backend*>(&vk()), &cpu()}) {
            Tensor out = output(*be, {S, Nout});
            be->grouped_matmul(offset(*be, x, x_lead, {S, K}), w[i], up(*be, bias, {E, Nout}),
                               up_ids(*be, offsets, {E + 1}), out);
            results[i++] = down(*be, out);
        }
        EXPECT_TRUE(Close(results[0], results[1], reduction_tol(K)));
    }

    // grouped_matmul over experts with counts[e] slots each: x [S, K], w [E, Nout, K].
    void check_grouped(const std::vector<int32_t>& counts, int64_t Nout, int64_t K,
                       bool with_bias) {
        const int64_t E = static_cast<int64_t>(counts.size());
        const std::vector<int32_t> offsets = expert_offsets(counts);
        const int64_t S = offsets[E];
        SCOPED_TRACE("grouped_matmul S,E,Nout,K " + dims({S, E, Nout, K}) +
                     (with_bias ? " bias" : " no bias"));
        const auto x = normal(S * K), w = normal(E * Nout * K), bias = normal(E * Nout);
        std::vector<float> results[2];
        int i = 0;
        for (Backend* be : {static_cast<Backend*>(&vk()), &cpu()}) {
            Tensor out = output(*be, {S, Nout});
            be->grouped_matmul(up(*be, x, {S, K}), up(*be, w, {E, Nout, K}),
                               with_bias ? up(*be, bias, {E, Nout}) : Tensor{},
                               up_ids(*be, offsets, {E + 1}), out);
            results[i++] = down(*be, out);
        }
        EXPECT_TRUE(Close(results[0], results[1], reduction_tol(K)));
    }

    // grouped_matmul_backward's d_x and d_w, accumulated onto zeros, on both backends; an expert
    // without slots keeps a zero d_w.
    void check_grouped_backward(const std::vector<int32_t>& counts, int64_t Nout, int64_t K) {
        const int64_t E = static_cast<int64_t>(counts.size());
        const std::vector<int32_t> offsets = expert_offsets(counts);
        const int64_t S = offsets[E];
        SCOPED_TRACE("grouped_matmul_backward S,E,Nout,K " + dims({S, E, Nout, K}));
        const auto x = normal(S * K), w = normal(E * Nout * K), d_out = normal(S * Nout);
        const std::vector<float> zero_x(S * K, 0.0f), zero_w(E * Nout * K, 0.0f);
        std::array<std::vector<float>, 2> dx, dw;
        int i = 0;
        for (Backend* be : {static_cast<Backend*>(&vk()), &cpu()}) {
            Tensor d_x = up(*be, zero_x, {S, K}), d_w = up(*be, zero_w, {E, Nout, K});
            be->grouped_matmul_backward(up(*be, x, {S, K}), up(*be, w, {E, Nout, K}),
                                        up_ids(*be, offsets, {E + 1}), up(*be, d_out, {S, Nout}),
                                        d_x, d_w, Tensor{});
            dx[i] = down(*be, d_x);
            dw[i++] = down(*be, d_w);
        }
        EXPECT_TRUE(Close(dx[0], dx[1], reduction_tol(Nout))) << "d_x";
        EXPECT_TRUE(Close(dw[0], dw[1], reduction_tol(S))) << "d_w";
        for (int64_t e = 0; e < E; ++e) {
            if (counts[e] != 0) continue;
            const auto first = dw[0].begin() + e * Nout * K;
            EXPECT_TRUE(std::all_of(first, first + Nout * K, [](float v) { return v == 0.0f; }))
                << "d_w of expert " << e << ", which has no slot";
        }
    }

    // Prefill attention of T queries per sequence (2 sequences), plain or after a rolling cache
    // of S slots (S 0: plain attention()), on both backends; `repeat`: the Vulkan backend runs
    // it twice, to the same bits.
    void check_attention(int64_t T, int64_t H, int64_t Hkv, int64_t hd, int64_t window, int64_t S,
                         const std::vector<int32_t>& start, bool repeat = false) {
        SCOPED_TRACE("attention T,H,Hkv,hd,window,S " + dims({T, H, Hkv, hd, window, S}));
        const int64_t B = static_cast<int64_t>(start.size()), row = Hkv * hd;
        const auto q = normal(B * T * H * hd, 1.5), k = normal(B * T * row, 1.5),
                   v = normal(B * T * row), kc = normal(B * std::max<int64_t>(S, 1) * row, 1.5),
                   vc = normal(B * std::max<int64_t>(S, 1) * row);
        std::vector<float> results[2];
        int i = 0;
        for (Backend* be : {static_cast<Backend*>(&vk()), &cpu()}) {
            Tensor qt = up(*be, q, {B, T, H, hd}), kt = up(*be, k, {B, T, Hkv, hd}),
                   vt = up(*be, v, {B, T, Hkv, hd}), out = output(*be, {B, T, H, hd});
            if (S > 0)
                be->attention_cached(qt, kt, vt, up(*be, kc, {B, S, Hkv, hd}),
                                     up(*be, vc, {B, S, Hkv, hd}), up_ids(*be, start, {B}), out,
                                     window);
            else
                be->attention(qt, kt, vt, out, window);
            results[i++] = down(*be, out);
            if (repeat && be == &vk()) {
                Tensor again = output(*be, {B, T, H, hd});
                if (S > 0)
                    be->attention_cached(qt, kt, vt, up(*be, kc, {B, S, Hkv, hd}),
                                         up(*be, vc, {B, S, Hkv, hd}), up_ids(*be, start, {B}),
                                         again, window);
                else
                    be->attention(qt, kt, vt, again, window);
                EXPECT_TRUE(BitwiseEqual(down(*be, again), results[0])) << "a second run";
            }
        }
        const int64_t keys = window ? window : S + T;
        EXPECT_TRUE(Close(results[0], results[1], reduction_tol(std::max(hd, keys))));
    }

    // rope_attention_cached_store (a decode step's attention: RoPE on q and k, attention
    // against the cache, the chunk stored in it) against the CPU's sequence of those ops: the
    // output and both caches after the store. Starts as check_attention's, positions from them.
    void check_rope_attention_store(int64_t T, int64_t H, int64_t Hkv, int64_t hd, int64_t window,
                                    int64_t S, const std::vector<int32_t>& start) {
        SCOPED_TRACE("rope_attention_cached_store T,H,Hkv,hd,window,S " +
                     dims({T, H, Hkv, hd, window, S}));
        const int64_t B = static_cast<int64_t>(start.size()), row = Hkv * hd;
        const auto q = normal(B * T * H * hd, 1.5), k = normal(B * T * row, 1.5),
                   v = normal(B * T * row), kc = normal(B * S * row, 1.5), vc = normal(B * S * row);
        std::vector<int32_t> positions;
        for (int32_t p : start)
            for (int64_t t = 0; t < T; ++t) positions.push_back(p + static_cast<int32_t>(t));
        std::array<std::vector<float>, 2> out, k_cache, v_cache;
        int i = 0;
        for (Backend* be : {static_cast<Backend*>(&vk()), &cpu()}) {
            Tensor kct = up(*be, kc, {B, S, Hkv, hd}), vct = up(*be, vc, {B, S, Hkv, hd}),
                   o = output(*be, {B, T, H, hd});
            be->rope_attention_cached_store(up(*be, q, {B, T, H, hd}), up(*be, k, {B, T, Hkv, hd}),
                                            up(*be, v, {B, T, Hkv, hd}),
                                            up_ids(*be, positions, {B * T}), 10000.0, kct, vct,
                                            up_ids(*be, start, {B}), o, window);
            out[i] = down(*be, o);
            k_cache[i] = down(*be, kct);
            v_cache[i++] = down(*be, vct);
        }
        const int64_t keys = window ? window : S + T;
        EXPECT_TRUE(Close(out[0], out[1], reduction_tol(std::max(hd, keys)))) << "out";
        EXPECT_TRUE(Close(k_cache[0], k_cache[1], 1e-5)) << "k_cache";
        EXPECT_TRUE(BitwiseEqual(v_cache[0], v_cache[1])) << "v_cache";
    }

    // The prefill attention forms' cases: causal with and without a window, plain and after a
    // rolling cache (wrapped, and holding the window or all of the past), GQA groups of 4 and 1,
    // head_dim 64, 40, 24, 128 and 32, partial query and key tiles, more queries than any tile;
    // each result the same bits when run again.
    void check_prefill_attention_forms() {
        check_attention(37, 8, 2, 64, 16, 0, {0, 0}, true);
        check_attention(37, 4, 4, 40, 0, 0, {0, 0}, true);
        check_attention(21, 8, 2, 24, 16, 16, {5, 70}, true);
        check_attention(33, 4, 1, 64, 0, 48, {100, 7}, true);
        check_attention(17, 2, 1, 128, 9, 9, {0, 30}, true);
        check_attention(150, 2, 1, 32, 100, 0, {0}, true);
    }
};

// Tiled dense matmul (M > 16 rows): M, N, K past no tile's multiple, every layout, with bias;
// accumulating; K within one slice and K a whole number of slices; and linear().
TEST_F(VulkanVariants, Matmul) {
    SCOPED_TRACE(trace());
    for_each_variant(vk::Kernel::Matmul, [&] {
        for (bool ta : {false, true})
            for (bool tb : {false, true}) check_matmul(37, 70, 45, ta, tb, false);
        check_matmul(37, 70, 45, true, false, true);
        check_matmul(37, 70, 7, false, true, false);
        check_matmul(64, 64, 64, true, false, false);
        check_linear(33, 70, 45);
        // Few tiles and a long k: split along k (a weight gradient's shape, accumulated).
        check_matmul(40, 70, 2100, true, false, true);
        check_matmul(37, 33, 1500, false, true, false);
    });
}

// A product of few tiles and a long k runs as partial products split along k and their sum (two
// dispatches), the same bits every run; one with many tiles or a short k as one dispatch.
TEST_F(VulkanVariants, FewTilesOfALongDepthSplitAlongK) {
    SCOPED_TRACE(trace());
    const auto dispatches = [&](int64_t M, int64_t N, int64_t K) {
        const auto a = normal(K * M), b = normal(K * N);
        Tensor ta = up(vk(), a, {K, M}), tb = up(vk(), b, {K, N});
        std::array<std::vector<float>, 2> runs;
        const uint64_t before = vk().counters().dispatches;
        for (auto& r : runs) {
            Tensor out = output(vk(), {M, N});
            vk().matmul(ta, tb, out, {.trans_a = true});
            r = down(vk(), out);
        }
        EXPECT_TRUE(BitwiseEqual(runs[0], runs[1])) << "M,N,K " << dims({M, N, K});
        return (vk().counters().dispatches - before) / 2;
    };
    EXPECT_EQ(dispatches(64, 64, 4096), 2u);
    EXPECT_EQ(dispatches(64, 64, 512), 1u);
    EXPECT_EQ(dispatches(32, 4608, 1024), 1u);  // 144 of the default's 16 x 64 tiles
}

// The tiled dense matmul reading each weight format, at a word's start and half-way into one,
// and x off a 16-byte boundary (prefill's products read the fp16 copies so).
TEST_F(VulkanVariants, MatmulWeightFormats) {
    SCOPED_TRACE(trace());
    for_each_variant(vk::Kernel::Matmul, [&] {
        for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0}) {
            const int64_t half_word = t == DType::Q8_0 ? kQ8_0BlockValues : 1;
            check_linear_stored(t, half_word, 1, 37, 70, 64);
            if (t != DType::Q8_0) check_linear_stored(t, 0, 0, 33, 70, 45);
        }
    });
}

// The dense matrix-vector kernel (M <= 16: one pass of 4 rows, or several): K a multiple of 4
// (the vectorised reads) or not, both layouts of b (and of a), and linear().
TEST_F(VulkanVariants, MatmulGemv) {
    SCOPED_TRACE(trace());
    for_each_variant(vk::Kernel::MatmulGemv, [&] {
        for (int64_t M : {1, 3, 16})
            for (int64_t K : {44, 45}) {
                for (bool tb : {false, true}) {
                    check_matmul(M, 37, K, false, tb, false);
                    check_matmul(M, 37, K, true, tb, M == 3);
                }
                check_linear(M, 37, K);
            }
    });
}

// norm_linear at the dense matrix-vector kernel's rows, its norm run in the product's dispatch:
// both norms; one row, part of a block of 4 and a whole one (the prologue's most rows, 4), and
// more rows, where the norm is a dispatch of its own; K read 4 at a time or not; each
// weight format at a word's start and half-way into one; x, or only the norm's operands, off a
// 16-byte boundary.
TEST_F(VulkanVariants, NormLinearGemv) {
    SCOPED_TRACE(trace());
    // Every candidate with LayerNorm (mean and variance: the whole prologue) at every row count
    // and both read widths; every fifth (a spread of workgroup sizes, columns per workgroup
    // and both reductions) also with RMSNorm and each stored format. Each (candidate, format, norm)
    // is a pipeline compiled at each of lavapipe's three widths: so few, the suite stays short.
    int index = 0;
    for_each_variant(vk::Kernel::MatmulGemv, [&] {
        for (int64_t M : {1, 3, 4})
            for (int64_t K : {44, 45})
                check_norm_linear(NormType::LayerNorm, DType::F32, 0, 0, 0, M, 37, K);
        if (index++ % 5 != 0) return;
        check_norm_linear(NormType::LayerNorm, DType::F32, 0, 0, 0, 16, 37, 44);
        for (int64_t K : {44, 45})
            check_norm_linear(NormType::RmsNorm, DType::F32, 0, 0, 0, 3, 37, K);
        check_norm_linear(NormType::RmsNorm, DType::F32, 0, 0, 1, 4, 37, 64);
        for (DType t : {DType::F16, DType::BF16, DType::Q8_0}) {
            const NormType type = t == DType::BF16 ? NormType::LayerNorm : NormType::RmsNorm;
            const int64_t half_word = t == DType::Q8_0 ? kQ8_0BlockValues : 1;
            check_norm_linear(type, t, 0, 0, 0, 4, 37, 64);
            check_norm_linear(type, t, half_word, 1, 1, 3, 37, 64);
        }
    });
}

// The dense matrix-vector kernel reading each weight format, at a word's start and half-way
// into one, and x off a 16-byte boundary: K a multiple of 4 (Q8_0: of its 32-value blocks) and
// not.
TEST_F(VulkanVariants, MatmulGemvWeightFormats) {
    SCOPED_TRACE(trace());
    for_each_variant(vk::Kernel::MatmulGemv, [&] {
        for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0}) {
            const int64_t half_word = t == DType::Q8_0 ? kQ8_0BlockValues : 1;
            for (int64_t w_lead : {int64_t{0}, half_word}) {
                check_linear_stored(t, w_lead, 0, 3, 37, 64);
                check_linear_stored(t, w_lead, 1, 1, 37, 64);
                if (t != DType::Q8_0) check_linear_stored(t, w_lead, 0, 5, 37, 45);
            }
        }
    });
}

// The grouped matrix-vector kernel likewise.
TEST_F(VulkanVariants, GroupedMatmulGemvWeightFormats) {
    SCOPED_TRACE(trace());
    for_each_variant(vk::Kernel::GroupedMatmulGemv, [&] {
        for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0}) {
            const int64_t half_word = t == DType::Q8_0 ? kQ8_0BlockValues : 1;
            for (int64_t w_lead : {int64_t{0}, half_word}) {
                check_grouped_stored(t, w_lead, 0, {4, 0, 3}, 33, 64);
                check_grouped_stored(t, w_lead, 1, {1, 2}, 33, 64);
                if (t != DType::Q8_0) check_grouped_stored(t, w_lead, 0, {4, 0, 3}, 33, 45);
            }
        }
    });
}

// Where the device sums through subgroup shuffles, the matrix-vector families' candidates hold
// the variants that do (".sg1"), each workgroup at least a subgroup; the others are refused
// saying why. At lavapipe's three widths this checks subgroups of 4, 8 and 16.
TEST_F(VulkanVariants, SubgroupCandidatesAreTriedWhereTheDeviceHasThem) {
    SCOPED_TRACE(trace());
    const vk::DeviceInfo& d = vk().context().info();
    for (vk::Kernel k : {vk::Kernel::MatmulGemv, vk::Kernel::GroupedMatmulGemv}) {
        SCOPED_TRACE(vk::kernel_name(k));
        const std::vector<vk::Variant> all = vk::candidates(k, d);
        const auto subgroup = std::count_if(all.begin(), all.end(),
                                            [](const vk::Variant& v) { return v.spec[2] == 1; });
        if (!d.subgroup_shuffle) {
            EXPECT_EQ(subgroup, 0);
            EXPECT_NE(vk::invalid_reason(k, *vk::parse_variant(k, "wg64.nr4.sg1"), d)
                          .find("subgroup shuffles"),
                      std::string::npos);
            continue;
        }
        EXPECT_GT(subgroup, 0) << "subgroups of " << d.subgroup_size;
        for (const vk::Variant& v : all)
            if (v.spec[2] == 1) {
                EXPECT_GE(v.spec[0], d.subgroup_size) << v.name(k);
            }
    }
}

// Tiled grouped matmul (more than 32 slots): uneven experts, one without slots; each weight
// format half-way into a word, x off a 16-byte boundary.
TEST_F(VulkanVariants, GroupedMatmul) {
    SCOPED_TRACE(trace());
    for_each_variant(vk::Kernel::GroupedMatmul, [&] {
        for (bool with_bias : {false, true}) check_grouped({40, 0, 30}, 33, 20, with_bias);
        check_grouped({40, 0, 30}, 33, 21, true);
        for (DType t : {DType::F16, DType::BF16, DType::Q8_0})
            check_grouped_stored(t, t == DType::Q8_0 ? kQ8_0BlockValues : 1, 1, {40, 0, 30}, 33,
                                 64);
    });
}

// The ".cm" variants on a device with NV cooperative matrices (shaders/matmul_tile_coopmat.glsl):
// linear() and grouped_matmul reading fp16 weights run the cooperative modules and keep fp32's
// tolerance (a split into two fp16 halves), on partial tiles, k no multiple of 16, split along
// k, with bias; the same variant's other calls (fp32 weights) run its tile in fp32. (The suites
// above run them too, in every weight format.) Lavapipe has no cooperative matrices: only a
// GPU runs this.
TEST_F(VulkanVariants, CooperativeMatrixFormForFp16Weights) {
    SCOPED_TRACE(trace());
    if (vk().context().info().coopmat_columns == 0)
        GTEST_SKIP() << "this Vulkan device has no usable VK_NV_cooperative_matrix (NVIDIA GPUs "
                        "have it; lavapipe does not)";
    const auto coop = [](const vk::Variant& v) { return v.spec[6] == vk::kTiledCoopmat; };
    // Which modules ran `body` (where the device can time commands: the profile names them).
    const auto modules = [&](const std::function<void()>& body) {
        std::set<std::string> names;
        if (!vk().can_profile()) {
            body();
            return names;
        }
        vk().begin_profile();
        body();
        for (const Backend::ProfiledCommands& p : vk().end_profile()) names.insert(p.name);
        return names;
    };
    for_each_variant(
        vk::Kernel::Matmul,
        [&] {
            const std::set<std::string> ran = modules([&] {
                check_linear_stored(DType::F16, 1, 1, 37, 70, 64);
                check_linear_stored(DType::F16, 0, 0, 130, 70, 45);
                check_linear_stored(DType::F16, 0, 0, 40, 70, 2100);  // split along k
            });
            if (vk().can_profile()) {
                EXPECT_TRUE(ran.count("matmul_cm_f16w"));
                EXPECT_FALSE(ran.count("matmul_f16w"));
            }
            const std::set<std::string> fp32 = modules([&] { check_linear(33, 70, 45); });
            if (vk().can_profile()) {
                EXPECT_FALSE(fp32.count("matmul_cm_f16w"));
            }
        },
        coop);
    for_each_variant(
        vk::Kernel::GroupedMatmul,
        [&] {
            const std::set<std::string> ran = modules([&] {
                check_grouped_stored(DType::F16, 1, 1, {40, 0, 30}, 33, 64);
                check_grouped_stored(DType::F16, 0, 0, {100, 3, 0, 57}, 70, 45);
            });
            if (vk().can_profile()) {
                EXPECT_TRUE(ran.count("grouped_matmul_cm_f16w"));
            }
        },
        coop);
}

// The grouped matrix-vector kernel (up to 32 slots): an expert's slots 4 at a time.
TEST_F(VulkanVariants, GroupedMatmulGemv) {
    SCOPED_TRACE(trace());
    for_each_variant(vk::Kernel::GroupedMatmulGemv, [&] {
        for (bool with_bias : {false, true}) check_grouped({4, 0, 3}, 33, 20, with_bias);
        check_grouped({4, 0, 3}, 33, 21, true);
    });
}

// grouped_ffn_up at the grouped matrix-vector kernel's sizes: one dispatch of it (the products
// with w1, and w3 for SwiGLU, then the activation), with every candidate, in every weight
// format (half-way into a word), x off a 16-byte boundary, K a multiple of 4 or not.
TEST_F(VulkanVariants, GroupedFfnUpGemv) {
    SCOPED_TRACE(trace());
    const int64_t Nout = 33;
    const auto check = [&](DType t, int64_t w_lead, int64_t x_lead,
                           const std::vector<int32_t>& counts, int64_t K, bool swiglu) {
        const int64_t E = static_cast<int64_t>(counts.size());
        const std::vector<int32_t> offsets = expert_offsets(counts);
        const int64_t S = offsets[E];
        SCOPED_TRACE(std::string("grouped_ffn_up ") + (swiglu ? "swiglu " : "gelu ") +
                     to_string(t) + " S,E,Nout,K " + dims({S, E, Nout, K}) + " w lead " +
                     std::to_string(w_lead) + " x lead " + std::to_string(x_lead));
        const std::array<Tensor, 2> w1 = stored(t, {E, Nout, K}, w_lead),
                                    w3 = stored(t, {E, Nout, K}, w_lead);
        const auto x = normal(S * K), b1 = normal(E * Nout), b3 = normal(E * Nout);
        std::array<std::vector<float>, 2> pre, upv, out;
        int i = 0;
        for (Backend* be : {static_cast<Backend*>(&vk()), &cpu()}) {
            Tensor p = output(*be, {S, Nout}), u = swiglu ? output(*be, {S, Nout}) : Tensor{},
                   o = output(*be, {S, Nout});
            const Tensor xt = offset(*be, x, x_lead, {S, K}), b1t = up(*be, b1, {E, Nout}),
                         b3t = swiglu ? up(*be, b3, {E, Nout}) : Tensor{},
                         offsets_t = up_ids(*be, offsets, {E + 1});
            const uint64_t dispatches = vk().counters().dispatches;
            be->grouped_ffn_up(xt, w1[i], b1t, swiglu ? w3[i] : Tensor{}, b3t, offsets_t,
                               Activation::Gelu, p, u, o);
            if (be == &vk()) {
                EXPECT_EQ(vk().counters().dispatches - dispatches, 1u);
            }
            pre[i] = down(*be, p);
            if (swiglu) upv[i] = down(*be, u);
            out[i++] = down(*be, o);
        }
        EXPECT_TRUE(Close(pre[0], pre[1], reduction_tol(K))) << "pre";
        EXPECT_TRUE(Close(upv[0], upv[1], reduction_tol(K))) << "up";
        EXPECT_TRUE(Close(out[0], out[1], 4 * reduction_tol(K))) << "out";
    };
    for_each_variant(vk::Kernel::GroupedMatmulGemv, [&] {
        for (bool swiglu : {false, true}) {
            for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0}) {
                const int64_t half_word = t == DType::Q8_0 ? kQ8_0BlockValues : 1;
                check(t, half_word, 0, {4, 0, 3}, 64, swiglu);
                check(t, 0, 1, {1, 2}, 64, swiglu);
                if (t != DType::Q8_0) check(t, 0, 0, {4, 0, 3}, 45, swiglu);
            }
            check(DType::F32, 0, 0, {9, 12, 0, 11}, 32, swiglu);  // 32 slots, the most
        }
    });
}

// grouped_ffn_down for one token (the grouped matrix-vector kernel's combine epilogue, one
// dispatch): its k slots in other experts (or two in one), with every candidate, in every
// weight format (half-way into a word), x off a 16-byte boundary, K a multiple of 4 or not.
TEST_F(VulkanVariants, GroupedFfnDownGemv) {
    SCOPED_TRACE(trace());
    const int64_t Nout = 33, E = 4;
    // experts: token 0's choices (slots sorted by expert: offsets from their counts).
    const auto check = [&](DType t, int64_t w_lead, int64_t x_lead,
                           const std::vector<int32_t>& experts, int64_t K) {
        const int64_t k = static_cast<int64_t>(experts.size());
        std::vector<int32_t> counts(E, 0), slot_of;
        for (int32_t e : experts) ++counts[e];
        const std::vector<int32_t> offsets = expert_offsets(counts);
        std::vector<int32_t> next(offsets.begin(), offsets.end());
        for (int32_t e : experts) slot_of.push_back(next[e]++);
        SCOPED_TRACE("grouped_ffn_down " + std::string(to_string(t)) + " k,K " + dims({k, K}) +
                     " w lead " + std::to_string(w_lead) + " x lead " + std::to_string(x_lead));
        const std::array<Tensor, 2> w2 = stored(t, {E, Nout, K}, w_lead);
        const auto x = normal(k * K), b2 = normal(E * Nout), gates = normal(k), h = normal(Nout);
        std::array<std::vector<float>, 2> ys, out;
        int i = 0;
        for (Backend* be : {static_cast<Backend*>(&vk()), &cpu()}) {
            Tensor y = output(*be, {k, Nout}), o = up(*be, h, {1, Nout});
            const uint64_t dispatches = vk().counters().dispatches;
            be->grouped_ffn_down(offset(*be, x, x_lead, {k, K}), w2[i], up(*be, b2, {E, Nout}),
                                 up_ids(*be, offsets, {E + 1}), up_ids(*be, slot_of, {k}),
                                 up(*be, gates, {1, k}), y, o);
            if (be == &vk()) {
                EXPECT_EQ(vk().counters().dispatches - dispatches, 1u);
            }
            ys[i] = down(*be, y);
            out[i++] = down(*be, o);
        }
        EXPECT_TRUE(Close(ys[0], ys[1], reduction_tol(K))) << "ys";
        EXPECT_TRUE(Close(out[0], out[1], reduction_tol(K))) << "out";
    };
    for_each_variant(vk::Kernel::GroupedMatmulGemv, [&] {
        for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0}) {
            const int64_t half_word = t == DType::Q8_0 ? kQ8_0BlockValues : 1;
            check(t, half_word, 0, {3, 1}, 64);
            check(t, 0, 1, {2, 2, 0, 3}, 64);
            if (t != DType::Q8_0) check(t, 0, 0, {1}, 45);
        }
    });
}

// The backward's d_x kernel (its d_w kernel at its default): both gradients checked.
TEST_F(VulkanVariants, GroupedMatmulBackwardDx) {
    SCOPED_TRACE(trace());
    for_each_variant(vk::Kernel::GroupedMatmulDx, [&] {
        check_grouped_backward({40, 0, 30}, 33, 20);
    });
}

// The backward's d_w kernel (its d_x kernel at its default), an expert without slots included.
TEST_F(VulkanVariants, GroupedMatmulBackwardDw) {
    SCOPED_TRACE(trace());
    for_each_variant(vk::Kernel::GroupedMatmulDw, [&] {
        check_grouped_backward({40, 0, 30}, 33, 20);
    });
}

// Prefill attention (16 queries or more, head_dim up to 128), the variants that reduce
// through shared memory (the subgroup ones: AttentionTiledSubgroup, below, so that no pipeline
// is compiled by both): partial query and key tiles, with and without a window, plain and after
// a filled (wrapped) rolling cache, head_dim 128.
TEST_F(VulkanVariants, AttentionTiled) {
    SCOPED_TRACE(trace());
    for_each_variant(
        vk::Kernel::AttentionTiled,
        [&] {
            check_attention(37, 4, 2, 24, 16, 0, {0, 0});
            check_attention(37, 4, 1, 64, 0, 0, {0, 0});
            check_attention(21, 4, 2, 24, 16, 16, {5, 70});
            check_attention(17, 2, 1, 128, 9, 9, {0, 30});
        },
        [](const vk::Variant& v) { return v.spec[3] == 0; });
}

// The prefill attention variants holding a query's row in registers (".sg1"), each, at
// check_prefill_attention_forms' shapes.
TEST_F(VulkanVariants, AttentionTiledSubgroup) {
    SCOPED_TRACE(trace());
    if (!vk().context().info().subgroup_shuffle) GTEST_SKIP() << "no subgroup shuffles";
    for_each_variant(
        vk::Kernel::AttentionTiled, [&] { check_prefill_attention_forms(); },
        [](const vk::Variant& v) { return v.spec[3] == 1; });
}

// The register-blocked prefill attention variants (".rb4"), each, at
// check_prefill_attention_forms' shapes (tiles sized for 32 to 128 channels, channels past
// head_dim).
TEST_F(VulkanVariants, AttentionTiledBlocked) {
    SCOPED_TRACE(trace());
    for_each_variant(
        vk::Kernel::AttentionTiled, [&] { check_prefill_attention_forms(); },
        [](const vk::Variant& v) { return v.spec[3] == vk::kAttentionBlocked; });
}

// Decoding's attention (a few queries), every shape: a wrapped cache with a window longer than
// several slices and sequences whose windows leave slices empty, GQA groups of 4 and 1 (a
// group's heads sharing one read of each key), head_dim 64 and 24, 1 and 3 queries a sequence,
// plain attention of 2 tokens; each result the same bits when run again. Head_dim 6, no
// multiple of 4, which the ".v4" shapes leave to the first form's shader. With RoPE and the
// cache write (rope_attention_cached_store), whose q and chunk keys the split rotates.
TEST_F(VulkanVariants, AttentionSplit) {
    SCOPED_TRACE(trace());
    for_each_variant(vk::Kernel::AttentionSplit, [&] {
        check_attention(1, 8, 2, 64, 300, 400, {1234, 100, 0}, true);
        check_attention(3, 4, 4, 24, 0, 90, {50, 7}, true);
        check_attention(2, 8, 2, 64, 40, 0, {0}, true);
        check_attention(1, 2, 1, 6, 0, 20, {9}, true);
        check_rope_attention_store(2, 8, 2, 32, 48, 64, {130, 5});
    });
}

// Where the device has subgroup shuffles, the attention candidates hold variants of SG 1 whose
// invocations per query divide its subgroup, in whole subgroups; one whose do not is refused
// saying why. At lavapipe's three widths this checks subgroups of 4, 8 and 16.
TEST_F(VulkanVariants, AttentionSubgroupCandidatesFitTheSubgroup) {
    SCOPED_TRACE(trace());
    const vk::DeviceInfo& d = vk().context().info();
    const vk::Kernel k = vk::Kernel::AttentionTiled;
    const std::vector<vk::Variant> all = vk::candidates(k, d);
    const auto subgroup =
        std::count_if(all.begin(), all.end(), [](const vk::Variant& v) { return v.spec[3] == 1; });
    if (!d.subgroup_shuffle) {
        EXPECT_EQ(subgroup, 0);
        EXPECT_NE(vk::invalid_reason(k, *vk::parse_variant(k, "wg64.bq16.bk32.sg1"), d)
                      .find("subgroup shuffles"),
                  std::string::npos);
        return;
    }
    EXPECT_GT(subgroup, 0) << "subgroups of " << d.subgroup_size;
    for (const vk::Variant& v : all) {
        if (v.spec[3] != 1) continue;
        EXPECT_EQ(d.subgroup_size % (v.spec[0] / v.spec[1]), 0u) << v.name(k);
        EXPECT_EQ(v.spec[0] % d.subgroup_size, 0u) << v.name(k);
    }
    const vk::Variant wide = *vk::parse_variant(k, "wg512.bq2.bk16.sg1");  // 256 per query
    EXPECT_NE(vk::invalid_reason(k, wide, d).find("do not divide a subgroup"), std::string::npos)
        << "subgroups of " << d.subgroup_size;
}

// TMX_VULKAN_FORCE_VARIANT, read when a backend starts: a valid list forces its variants; a
// wrong one stops the backend, naming the variable.
TEST_F(VulkanVariants, ForcedVariantFromTheEnvironment) {
    SCOPED_TRACE(trace());
    constexpr const char* kEnv = "TMX_VULKAN_FORCE_VARIANT";
    const char* saved = std::getenv(kEnv);
    const std::string saved_value = saved ? saved : "";
    const vk::VulkanOptions options{.fp16_weights = false};

    const std::string forced = "bm32.bn32.bk16.tm2.tn2";
    setenv(kEnv, ("matmul=" + forced).c_str(), 1);
    {
        VulkanBackend forced_vk(options);
        EXPECT_EQ(forced_vk.tuning_table()
                      .choose(vk::Kernel::Matmul, 37, 70, 45, 0)
                      .name(vk::Kernel::Matmul),
                  forced);
        const int64_t M = 37, N = 70, K = 45;
        const auto a = normal(M * K), b = normal(K * N);
        std::vector<float> results[2];
        int i = 0;
        for (Backend* be : {static_cast<Backend*>(&forced_vk), &cpu()}) {
            Tensor out = output(*be, {M, N});
            be->matmul(up(*be, a, {M, K}), up(*be, b, {K, N}), out);
            results[i++] = down(*be, out);
        }
        EXPECT_TRUE(Close(results[0], results[1], reduction_tol(K)));
    }

    for (const char* bad : {"matmul=nonsense", "nokernel=bm64.bn64.bk16.tm4.tn4"}) {
        SCOPED_TRACE(std::string(kEnv) + "=" + bad);
        setenv(kEnv, bad, 1);
        try {
            VulkanBackend refused(options);
            ADD_FAILURE() << "the backend started";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(kEnv), std::string::npos) << e.what();
        }
    }

    if (saved)
        setenv(kEnv, saved_value.c_str(), 1);
    else
        unsetenv(kEnv);
}

}  // namespace
}  // namespace tmx::test

#endif  // TMX_HAS_VULKAN

// The fused forward ops (Backend::norm_linear, rope_attention_cached_store, moe_route,
// grouped_ffn_up, grouped_ffn_down) on every backend besides the CPU, against the CPU, which runs
// each as the sequence of ops its contract names. A backend that fuses one (Vulkan, at decoding's
// few rows) must give that sequence's results within the ops' own tolerances, at the sizes that
// take its fused path and those that do not, in every weight format it holds, and the same bits
// again on a second run.
//
// f32 weights are compared in training mode, where every backend multiplies them exactly
// (Vulkan's inference-only fp16 copies are off); one case per op runs in inference mode, where
// a backend may read those copies (fp16: 2^-11 relative per weight, so kFp16WeightTol). Stored
// formats as in weight_formats_test.cpp: the CPU runs on the decoded weights.
#include <cstring>
#include <optional>

#include "engine/compute/weight_format.h"
#include "tests/backends/backend_pair_fixture.h"

namespace tmx::test {
namespace {

// A weight read as fp16 (relative 2^-11 each) in a sum of K random products: far below 5e-3
// of the output's scale, far above fp32's rounding; a wrong index or scale is off by O(1).
constexpr double kFp16WeightTol = 5e-3;

std::vector<float> as_floats(const std::vector<int32_t>& v) {
    return std::vector<float>(v.begin(), v.end());  // small ids: exact
}

class FusedOps : public BackendPairTest {
  protected:
    // A weight of `shape` in format t on backend b: its decoded values on the CPU, its stored
    // bytes elsewhere. `values` are the f32 values to encode; the decoded ones go to *decoded
    // (the same call for both backends passes the same values).
    Tensor weight_on(Backend& b, DType t, const std::vector<float>& values, Shape shape) {
        if (t == DType::F32 || &b == &cpu() || !b.supports_weight_format(t)) {
            std::vector<float> decoded(values.size());
            if (t == DType::F32) {
                decoded = values;
            } else {
                std::vector<uint8_t> bytes(
                    static_cast<size_t>(dtype_bytes(t, static_cast<int64_t>(values.size()))));
                encode_weights(t, values.data(), static_cast<int64_t>(values.size()), bytes.data());
                decode_weights(t, bytes.data(), static_cast<int64_t>(values.size()),
                               decoded.data());
            }
            return up(b, decoded, std::move(shape));
        }
        std::vector<uint8_t> bytes(
            static_cast<size_t>(dtype_bytes(t, static_cast<int64_t>(values.size()))));
        encode_weights(t, values.data(), static_cast<int64_t>(values.size()), bytes.data());
        Tensor w = b.alloc(std::move(shape), t);
        b.upload(w, bytes.data());
        return w;
    }
    // The formats to test: f32, and those the backend under test holds.
    std::vector<DType> formats() {
        std::vector<DType> f = {DType::F32};
        for (DType t : {DType::BF16, DType::F16, DType::Q8_0})
            if (be().supports_weight_format(t)) f.push_back(t);
        return f;
    }
};

TEST_P(FusedOps, NormLinearIsTheNormThenTheLinear) {
    SCOPED_TRACE(trace());
    const int64_t out = 70;  // no multiple of a tile
    // d 96: whole Q8_0 blocks, and rows read 4 values at a time where a backend can; d 45: one
    // at a time. N up to 16 takes Vulkan's matrix-vector path (the norm in the product's
    // dispatch): 1 row, part of a block of 4, more than one block, the most; 17 and 40 the
    // tiled one (the sequence).
    for (int64_t d : {96, 45}) {
        for (NormType type : {NormType::LayerNorm, NormType::RmsNorm}) {
            for (bool training : {true, false}) {
                for (DType t : formats()) {
                    // Inference mode once per norm, with f32 weights (the fp16 copies' path).
                    if (!training && t != DType::F32) continue;
                    if (t == DType::Q8_0 && d % kQ8_0BlockValues != 0) continue;
                    for (int64_t N : {1, 2, 5, 16, 17, 40}) {
                        for (bool with_bias : {false, true}) {
                            SCOPED_TRACE(
                                std::string(type == NormType::LayerNorm ? "layernorm" : "rmsnorm") +
                                (training ? " training " : " inference ") + to_string(t) + " N " +
                                std::to_string(N) + " d " + std::to_string(d) +
                                (with_bias ? " bias" : ""));
                            Backend::ModeScope mode(be(), {.training = training});
                            const auto x = normal(N * d, 2.0), g = normal(d), beta = normal(d),
                                       w = normal(out * d, 0.3), bias = normal(out);
                            const double y_tol = training ? reduction_tol(d) : kFp16WeightTol;
                            expect_matches_cpu([&](Backend& b) {
                                Tensor normed = poisoned(b, {N, d}), y = poisoned(b, {N, out});
                                b.norm_linear(
                                    type, up(b, x, {N, d}), up(b, g, {d}),
                                    type == NormType::LayerNorm ? up(b, beta, {d}) : Tensor{},
                                    1e-5f, normed, weight_on(b, t, w, {out, d}),
                                    with_bias ? up(b, bias, {out}) : Tensor{}, y);
                                return Outputs{{"normed", down(b, normed), reduction_tol(d)},
                                               {"y", down(b, y), y_tol}};
                            });
                        }
                    }
                }
            }
        }
    }
}

TEST_P(FusedOps, RopeAttentionCachedStoreRotatesAttendsThenStoresTheChunk) {
    SCOPED_TRACE(trace());
    const int64_t B = 2, H = 4, hd = 16;
    struct Case {
        int64_t T, S, window, Hkv;
    };
    // One token and a few (Vulkan: the split path, whose merge stores the chunk; T <= 4 by
    // default), a chunk between the paths and a prefill's (the sequence); a window shorter
    // than the cache, and none (the cache then holds every earlier position); positions before
    // and after the cache wraps; chunks longer than the cache (only their last S positions
    // stay); as many kv heads as query heads (as many cache elements to write as outputs).
    for (const Case c : {Case{1, 8, 6, 2}, Case{3, 8, 6, 2}, Case{1, 40, 0, 2}, Case{4, 40, 0, 2},
                         Case{4, 2, 3, 2}, Case{3, 2, 0, 2}, Case{4, 3, 4, 4}, Case{2, 40, 0, 4},
                         Case{8, 40, 0, 2}, Case{16, 8, 6, 2}, Case{16, 40, 0, 4}}) {
        const int64_t Hkv = c.Hkv;
        for (int rep = 0; rep < 3; ++rep) {
            // Without a window the cache must hold every earlier position: start <= S (and
            // start + T <= S when the chunk fits, as decoding keeps it).
            const int32_t max_start = static_cast<int32_t>(c.window > 0 ? 30
                                                           : c.T > c.S  ? c.S
                                                                        : c.S - c.T);
            const std::vector<int32_t> start = ints(B, 0, max_start + 1);
            SCOPED_TRACE("T " + std::to_string(c.T) + " S " + std::to_string(c.S) + " window " +
                         std::to_string(c.window) + " Hkv " + std::to_string(Hkv) + " start " +
                         std::to_string(start[0]) + ", " + std::to_string(start[1]));
            const auto q = normal(B * c.T * H * hd), k = normal(B * c.T * Hkv * hd),
                       v = normal(B * c.T * Hkv * hd), kc = normal(B * c.S * Hkv * hd),
                       vc = normal(B * c.S * Hkv * hd);
            // Any positions (decoding's are start + t): RoPE and the cache slots are apart.
            const std::vector<int32_t> positions = ints(B * c.T, 0, 5000);
            const double theta = rep == 2 ? 1e6 : 10000.0;
            const int64_t keys = c.window > 0 ? c.window : c.S + c.T;
            expect_matches_cpu([&](Backend& b) {
                Tensor k_cache = up(b, kc, {B, c.S, Hkv, hd}),
                       v_cache = up(b, vc, {B, c.S, Hkv, hd});
                Tensor o = poisoned(b, {B, c.T, H, hd});
                b.rope_attention_cached_store(
                    up(b, q, {B, c.T, H, hd}), up(b, k, {B, c.T, Hkv, hd}),
                    up(b, v, {B, c.T, Hkv, hd}), up_ids(b, positions, {B * c.T}), theta, k_cache,
                    v_cache, up_ids(b, start, {B}), o, c.window);
                // The stored keys are rotated (RoPE's elementwise tolerance); the values and the
                // cache's other slots keep their bits.
                return Outputs{{"out", down(b, o), reduction_tol(keys * hd)},
                               {"k_cache", down(b, k_cache), kElementwiseTol},
                               {"v_cache", down(b, v_cache), 0.0}};
            });
        }
    }
}

TEST_P(FusedOps, MoeRouteIsTopKThenGroupThenGather) {
    SCOPED_TRACE(trace());
    const int64_t d = 40;
    struct Case {
        int64_t N, E, k;
    };
    // Decoding's few rows (Vulkan: one workgroup for N <= 64 rows and N * k <= 512 slots) and
    // a prefill's; each limit exactly and one past it; many experts; every expert chosen
    // (k = E); one expert.
    for (const Case c :
         {Case{1, 8, 2}, Case{3, 8, 2}, Case{8, 4, 1}, Case{16, 8, 2}, Case{37, 8, 2},
          Case{200, 16, 4}, Case{64, 8, 2}, Case{65, 8, 2}, Case{64, 8, 8}, Case{57, 16, 9},
          Case{4, 1024, 8}, Case{3, 6, 6}, Case{5, 1, 1}}) {
        // Random logits, and logits of a few values, tied within every row (ties go to the
        // lower index; tied gates are equal).
        for (bool tied : {false, true}) {
            SCOPED_TRACE("N " + std::to_string(c.N) + " E " + std::to_string(c.E) + " k " +
                         std::to_string(c.k) + (tied ? " tied" : ""));
            std::vector<float> logits = normal(c.N * c.E);
            if (tied) logits = as_floats(ints(c.N * c.E, -1, 2));
            const auto x = normal(c.N * d);
            expect_matches_cpu([&](Backend& b) {
                const int64_t slots = c.N * c.k;
                Tensor idx = poisoned_ids(b, {c.N, c.k}), gates = poisoned(b, {c.N, c.k});
                Tensor offsets = poisoned_ids(b, {c.E + 1}), rows = poisoned_ids(b, {slots}),
                       slot_of = poisoned_ids(b, {slots}), xs = poisoned(b, {slots, d});
                b.moe_route(up(b, logits, {c.N, c.E}), up(b, x, {c.N, d}), idx, gates, offsets,
                            rows, slot_of, xs);
                return Outputs{{"indices", as_floats(down_ids(b, idx)), 0.0},
                               {"gates", down(b, gates), kElementwiseTol},
                               {"offsets", as_floats(down_ids(b, offsets)), 0.0},
                               {"slot_rows", as_floats(down_ids(b, rows)), 0.0},
                               {"slot_of", as_floats(down_ids(b, slot_of)), 0.0},
                               {"xs", down(b, xs), 0.0}};
            });
        }
    }
}

// Per element, 1 where a and b differ in any bit, else 0.
std::vector<float> bits_differ(const std::vector<float>& a, const std::vector<float>& b) {
    std::vector<float> d(a.size(), 1.0f);
    for (size_t i = 0; i < a.size() && i < b.size(); ++i)
        d[i] = std::memcmp(&a[i], &b[i], sizeof(float)) == 0 ? 0.0f : 1.0f;
    return d;
}

TEST_P(FusedOps, GroupedFfnUpIsTheProductsThenTheActivation) {
    SCOPED_TRACE(trace());
    const int64_t Nout = 37;
    struct Case {
        std::vector<int32_t> counts;
        int64_t K;
    };
    // Decoding's few slots (an expert with none among them); the most slots of Vulkan's
    // matrix-vector path (32) and one more; K a multiple of 4 (the 4-wide reads) or not (Q8_0,
    // whose rows are whole blocks, only at the first); and a prefill's many.
    for (const Case& c :
         {Case{{1, 0, 1, 0}, 64}, Case{{3, 0, 6, 1}, 64}, Case{{2, 5}, 45}, Case{{8, 0, 16, 8}, 64},
          Case{{9, 0, 16, 8}, 64}, Case{{30, 0, 25, 9}, 64}}) {
        const int64_t E = static_cast<int64_t>(c.counts.size()), K = c.K;
        const std::vector<int32_t> offsets = expert_offsets(c.counts);
        const int64_t S = offsets.back();
        for (bool swiglu : {false, true}) {
            for (Activation act :
                 swiglu ? std::vector<Activation>{Activation::Silu}
                        : std::vector<Activation>{Activation::Gelu, Activation::Silu,
                                                  Activation::Relu, Activation::Relu2}) {
                for (bool training : {true, false}) {
                    for (DType t : formats()) {
                        if (!training && t != DType::F32) continue;
                        if (t == DType::Q8_0 && K % kQ8_0BlockValues != 0) continue;
                        SCOPED_TRACE(std::string(swiglu ? "swiglu" : "activation ") +
                                     std::to_string(static_cast<int>(act)) +
                                     (training ? " training " : " inference ") + to_string(t) +
                                     " S " + std::to_string(S) + " K " + std::to_string(K));
                        Backend::ModeScope mode(be(), {.training = training});
                        const auto x = normal(S * K), w1 = normal(E * Nout * K, 0.2),
                                   w3 = normal(E * Nout * K, 0.2), b1 = normal(E * Nout),
                                   b3 = normal(E * Nout);
                        const double tol = training ? reduction_tol(K) : kFp16WeightTol;
                        const bool with_bias = S % 2 == 0;
                        expect_matches_cpu([&](Backend& b) {
                            Tensor pre = poisoned(b, {S, Nout}), out = poisoned(b, {S, Nout});
                            Tensor upv = swiglu ? poisoned(b, {S, Nout}) : Tensor{};
                            b.grouped_ffn_up(up(b, x, {S, K}), weight_on(b, t, w1, {E, Nout, K}),
                                             with_bias ? up(b, b1, {E, Nout}) : Tensor{},
                                             swiglu ? weight_on(b, t, w3, {E, Nout, K}) : Tensor{},
                                             swiglu && with_bias ? up(b, b3, {E, Nout}) : Tensor{},
                                             up_ids(b, offsets, {E + 1}), act, pre, upv, out);
                            // out is the backend's own activation (or swiglu) of its pre (and
                            // up), bit for bit: the backward recomputes it from pre so.
                            Tensor again = poisoned(b, {S, Nout});
                            if (swiglu)
                                b.swiglu(pre, upv, again);
                            else
                                b.activation(act, pre, again);
                            const std::vector<float> got = down(b, out);
                            Outputs o{{"pre", down(b, pre), tol}};
                            if (swiglu) o.push_back({"up", down(b, upv), tol});
                            // The activation of a value within tol has a slope of at most
                            // ~2|x| (relu2) on these scales: a few tol of the output's scale.
                            o.push_back({"out", got, 4 * tol});
                            o.push_back({"out's bits unlike activation(pre)'s",
                                         bits_differ(got, down(b, again)), 0.0});
                            return o;
                        });
                    }
                }
            }
        }
    }
}

TEST_P(FusedOps, GroupedFfnDownIsTheProductThenTheCombine) {
    SCOPED_TRACE(trace());
    const int64_t Nout = 37, E = 5;
    struct Case {
        int64_t N, k, K;
    };
    // One token (Vulkan's fused path) of 1, 2 and 4 choices, K a multiple of 4 or not; then
    // tokens that take the sequence (2, and 3 of 2 choices) and more choices than the fused
    // path holds (5).
    for (const Case& c : {Case{1, 2, 64}, Case{1, 1, 64}, Case{1, 4, 64}, Case{1, 2, 45},
                          Case{2, 2, 64}, Case{3, 2, 64}, Case{1, 5, 64}}) {
        const int64_t S = c.N * c.k, K = c.K;
        // Each token's choices among the experts (distinct, as top-k picks them, or not: the
        // op does not care); slots sorted by expert, then by token and choice.
        std::vector<int32_t> expert_of(static_cast<size_t>(S));
        for (int64_t i = 0; i < S; ++i) expert_of[i] = ints(1, 0, static_cast<int32_t>(E))[0];
        std::vector<int32_t> counts(static_cast<size_t>(E), 0);
        for (int32_t e : expert_of) ++counts[e];
        const std::vector<int32_t> offsets = expert_offsets(counts);
        std::vector<int32_t> slot_of(static_cast<size_t>(S)), next(offsets.begin(), offsets.end());
        for (int64_t i = 0; i < S; ++i) slot_of[i] = next[expert_of[i]]++;
        for (bool training : {true, false}) {
            for (DType t : formats()) {
                if (!training && t != DType::F32) continue;
                if (t == DType::Q8_0 && K % kQ8_0BlockValues != 0) continue;
                SCOPED_TRACE(std::string(training ? "training " : "inference ") + to_string(t) +
                             " N " + std::to_string(c.N) + " k " + std::to_string(c.k) + " K " +
                             std::to_string(K));
                Backend::ModeScope mode(be(), {.training = training});
                const auto x = normal(S * K), w2 = normal(E * Nout * K, 0.2), b2 = normal(E * Nout),
                           gates = normal(S, 0.5), h = normal(c.N * Nout);
                const double tol = training ? reduction_tol(K) : kFp16WeightTol;
                const bool with_bias = c.k != 4;
                expect_matches_cpu([&](Backend& b) {
                    Tensor ys = poisoned(b, {S, Nout}), out = up(b, h, {c.N, Nout});
                    b.grouped_ffn_down(up(b, x, {S, K}), weight_on(b, t, w2, {E, Nout, K}),
                                       with_bias ? up(b, b2, {E, Nout}) : Tensor{},
                                       up_ids(b, offsets, {E + 1}), up_ids(b, slot_of, {S}),
                                       up(b, gates, {c.N, c.k}), ys, out);
                    return Outputs{{"ys", down(b, ys), tol}, {"out", down(b, out), tol}};
                });
            }
        }
    }
}

}  // namespace

INSTANTIATE_TEST_SUITE_P(Backends, FusedOps, ::testing::ValuesIn(non_cpu_backend_names()),
                         backend_param_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(FusedOps);

}  // namespace tmx::test

// The backward and optimizer ops of every training backend other than the CPU, against the CPU
// backend on the same random inputs (the CPU's own backward ops are checked against finite
// differences in tests/backends/cpu/backward_fd_test.cpp, so agreeing with it is agreeing with
// the math). Each op also runs twice on the backend under test and must give the same bits both
// times: training is reproducible only if no op depends on scheduling (no float atomics,
// reductions in a fixed order).
//
// The suite is instantiated over the backends of this build other than "cpu"; one that cannot be
// made on this machine (no device), or that does not train (Vulkan), skips, saying why.
//
// Accumulated outputs start from the same random non-zero values on both backends; outputs an
// op writes (cross_entropy_backward, sum_squares) are poisoned with NaN. Tolerances are those of
// backend_pair_fixture.h: kElementwiseTol for an elementwise op, reduction_tol(L) for an output
// that sums L terms. Sizes are chosen to be multiples of no tile, warp or vector width (1, 3,
// 17, 37, 130, 515 ...), with a few at training scale, where blocked and multi-pass reductions
// take over.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "backends/registry.h"
#include "engine/compute/backend.h"
#include "engine/model/config.h"  // to_string(Activation)
#include "tests/backends/backend_pair_fixture.h"
#include "tests/backends/reference_ops.h"
#include "tests/test_util.h"

namespace tmx::test {
namespace {

std::string dims(std::initializer_list<int64_t> d) {
    std::string s;
    for (int64_t x : d) s += (s.empty() ? "" : "x") + std::to_string(x);
    return s;
}

constexpr Activation kActivations[] = {Activation::Gelu, Activation::Silu, Activation::Relu,
                                       Activation::Relu2};

// Values where naive formulas go wrong: exp(-x) overflowing for x << 0 (inf * 0 = NaN in a
// derivative), saturation, and 0 itself (relu's derivative there is the CPU's: 0).
const std::vector<float> kExtremes = {0.0f,   -0.0f, 1e-6f,  -1e-6f, 5.0f,   -5.0f,  20.0f,
                                      -20.0f, 50.0f, -50.0f, 88.0f,  -88.0f, 100.0f, -100.0f};

class BackwardOps : public BackendPairTest {
  protected:
    bool needs_training() const override { return true; }

    // Expert choices and gates as router_topk makes them: k distinct experts per row, in
    // descending logit order, gates the softmax of the chosen logits.
    ref::TopK routes(const std::vector<float>& logits, int64_t N, int64_t E, int64_t k) {
        return ref::router_topk(ref::to_double(logits), N, E, k);
    }

    // A tensor of `shape` at element `offset` of a buffer (numel + offset + 3 elements) whose
    // other elements are random filler: a view at any offset, as the engine's views into the
    // flat parameter and gradient tensors are.
    struct Placed {
        std::vector<float> whole;
        int64_t offset;
        Shape shape;
    };
    Placed placed(Shape shape, int64_t offset, bool accumulated = false) {
        const int64_t n = shape_numel(shape) + offset + 3;
        return {accumulated ? accum_init(n) : normal(n), offset, std::move(shape)};
    }
    // Uploads the whole buffer to b; returns the view, and the buffer in *buffer when given.
    static Tensor view(Backend& b, const Placed& p, Tensor* buffer = nullptr) {
        Tensor whole = up(b, p.whole, {static_cast<int64_t>(p.whole.size())});
        if (buffer) *buffer = whole;
        return whole.slice(p.offset, p.shape);
    }
};

// ---------------------------------------------------------------- gather_rows (the embedding)

TEST_P(BackwardOps, GatherRowsBackward) {
    SCOPED_TRACE(trace());
    struct Case {
        int64_t N, d, S;
        bool hot;  // nine slots in ten take the same row: one row sums thousands of terms
    };
    // Embedding shapes (a table of N rows, S tokens) and expert gathers (more slots than rows).
    // Random rows repeat; N = 5 with S = 4096 adds ~800 slots into each row.
    for (Case c : {Case{1, 1, 1, false}, Case{1, 5, 40, false}, Case{1, 17, 5, false},
                   Case{17, 3, 33, false}, Case{65, 33, 130, false}, Case{1000, 64, 65, false},
                   Case{97, 130, 2000, false}, Case{300, 130, 600, false}, Case{5, 64, 4096, false},
                   Case{50, 33, 3001, true}}) {
        SCOPED_TRACE("N,d,S = " + dims({c.N, c.d, c.S}) + (c.hot ? ", one hot row" : ""));
        std::vector<int32_t> rows = ints(c.S, 0, static_cast<int32_t>(c.N));
        if (c.hot)
            for (int64_t s = 0; s < c.S; ++s)
                if (s % 10 != 0) rows[s] = 7;
        rows[0] = static_cast<int32_t>(c.N - 1);  // the last row is reachable
        if (c.S > 2) rows[2] = rows[1];           // a repeat, whatever the draw
        const std::vector<float> d_out = normal(c.S * c.d), init = accum_init(c.N * c.d);
        expect_matches_cpu([&](Backend& b) {
            Tensor d_x = up(b, init, {c.N, c.d});
            b.gather_rows_backward(up_ids(b, rows, {c.S}), up(b, d_out, {c.S, c.d}), d_x);
            return Outputs{{"d_x", down(b, d_x), reduction_tol(c.S)}};
        });
    }
}

// ---------------------------------------------------------------- norms, bias

// d_x sums over the row (d terms); d_weight and d_bias over the rows (N terms), of products with
// the normalised x, whose statistics sum over d.
TEST_P(BackwardOps, NormBackward) {
    SCOPED_TRACE(trace());
    struct Case {
        int64_t N, d;
    };
    // Not d = 1 or 2: layernorm of two values is +-1 whatever their spread (rmsnorm of one
    // value likewise), so d_x is O(eps) and what fp32 computes for it is cancellation noise.
    for (NormType type : {NormType::LayerNorm, NormType::RmsNorm})
        for (Case c : {Case{1, 3}, Case{5, 17}, Case{37, 64}, Case{300, 130}, Case{2100, 515}}) {
            const bool layernorm = type == NormType::LayerNorm;
            SCOPED_TRACE(std::string(layernorm ? "layernorm" : "rmsnorm") +
                         ", N,d = " + dims({c.N, c.d}));
            std::vector<float> x = normal(c.N * c.d, 1.5), w = normal(c.d);
            for (float& v : x) v += 0.7f;  // a non-zero mean
            for (float& v : w) v += 1.0f;
            const std::vector<float> g = normal(c.N * c.d), init_x = accum_init(c.N * c.d),
                                     init_w = accum_init(c.d), init_b = accum_init(c.d);
            const float eps = 1e-5f;
            expect_matches_cpu([&](Backend& b) {
                Tensor d_x = up(b, init_x, {c.N, c.d}), d_w = up(b, init_w, {c.d});
                Tensor d_b = layernorm ? up(b, init_b, {c.d}) : Tensor{};
                b.norm_backward(type, up(b, x, {c.N, c.d}), up(b, w, {c.d}), up(b, g, {c.N, c.d}),
                                eps, d_x, d_w, d_b);
                Outputs out{{"d_x", down(b, d_x), reduction_tol(c.d)},
                            {"d_weight", down(b, d_w), reduction_tol(c.N + c.d)}};
                if (layernorm) out.push_back({"d_bias", down(b, d_b), reduction_tol(c.N)});
                return out;
            });
        }
}

// Rows of the form 1000 + N(0, 1): statistics taken as E[x^2] - E[x]^2 in fp32 lose every digit
// of the variance (E[x^2] ~ 1e6 has spacing 0.06 against a variance of 1), so rstd, and every
// gradient, would be off by percents. A correct backend still carries the mean's rounding:
// even held as a float, as the CPU holds it, the mean is off by up to ulp(1000)/2 ~ 3e-5, and a
// fp32 tree sum of 515 values of ~1000 by ~1e-4; x - mean then shifts by that much in units
// of the unit spread. So 1e-3 here: ten times that, a hundred times below the unstable formula.
TEST_P(BackwardOps, LayerNormBackwardIsStableUnderLargeMean) {
    SCOPED_TRACE(trace());
    struct Case {
        int64_t N, d;
    };
    for (Case c : {Case{3, 17}, Case{17, 64}, Case{4, 515}, Case{300, 130}}) {
        SCOPED_TRACE("N,d = " + dims({c.N, c.d}));
        std::vector<float> x = normal(c.N * c.d), w = normal(c.d);
        for (float& v : x) v += 1000.0f;
        for (float& v : w) v += 1.0f;
        const std::vector<float> g = normal(c.N * c.d), init_x = accum_init(c.N * c.d),
                                 init_w = accum_init(c.d), init_b = accum_init(c.d);
        expect_matches_cpu([&](Backend& b) {
            Tensor d_x = up(b, init_x, {c.N, c.d}), d_w = up(b, init_w, {c.d}),
                   d_b = up(b, init_b, {c.d});
            b.norm_backward(NormType::LayerNorm, up(b, x, {c.N, c.d}), up(b, w, {c.d}),
                            up(b, g, {c.N, c.d}), 1e-5f, d_x, d_w, d_b);
            return Outputs{{"d_x", down(b, d_x), 1e-3},
                           {"d_weight", down(b, d_w), 1e-3},
                           {"d_bias", down(b, d_b), reduction_tol(c.N)}};
        });
    }
}

TEST_P(BackwardOps, BiasBackward) {
    SCOPED_TRACE(trace());
    struct Case {
        int64_t M, N;
    };
    // M = 2500 and 5000: more rows than one block sums (multi-pass column sums).
    for (Case c : {Case{1, 1}, Case{37, 3}, Case{130, 65}, Case{2500, 33}, Case{5000, 257}}) {
        SCOPED_TRACE("M,N = " + dims({c.M, c.N}));
        const std::vector<float> d_out = normal(c.M * c.N), init = accum_init(c.N);
        expect_matches_cpu([&](Backend& b) {
            Tensor d_bias = up(b, init, {c.N});
            b.bias_backward(up(b, d_out, {c.M, c.N}), d_bias);
            return Outputs{{"d_bias", down(b, d_bias), reduction_tol(c.M)}};
        });
    }
}

// linear_backward: d_x += d_y w (out terms), d_w += d_y^T x (rows), d_b += column sums (rows).
TEST_P(BackwardOps, LinearBackward) {
    SCOPED_TRACE(trace());
    struct Case {
        int64_t N, out, in;
    };
    for (Case c : {Case{1, 65, 33}, Case{37, 17, 130}, Case{300, 70, 65}})
        for (bool bias : {false, true}) {
            SCOPED_TRACE("N,out,in = " + dims({c.N, c.out, c.in}) + " bias " +
                         std::to_string(bias));
            const std::vector<float> x = normal(c.N * c.in), w = normal(c.out * c.in);
            const std::vector<float> d_y = normal(c.N * c.out);
            const std::vector<float> dx0 = accum_init(c.N * c.in), dw0 = accum_init(c.out * c.in);
            const std::vector<float> db0 = accum_init(c.out);
            expect_matches_cpu([&](Backend& b) {
                Tensor d_x = up(b, dx0, {c.N, c.in}), d_w = up(b, dw0, {c.out, c.in});
                Tensor d_b = bias ? up(b, db0, {c.out}) : Tensor{};
                b.linear_backward(up(b, x, {c.N, c.in}), up(b, w, {c.out, c.in}),
                                  up(b, d_y, {c.N, c.out}), d_x, d_w, d_b);
                Outputs o{{"d_x", down(b, d_x), reduction_tol(c.out)},
                          {"d_w", down(b, d_w), reduction_tol(c.N)}};
                if (bias) o.push_back({"d_b", down(b, d_b), reduction_tol(c.N)});
                return o;
            });
        }
}

// ---------------------------------------------------------------- attention

// Each gradient chains a score (hd terms), the softmax over the query's keys and a sum over
// keys (d_q) or over the queries of every head of the group (d_k, d_v): hd + group * keys
// terms bound the length of any reduction.
TEST_P(BackwardOps, AttentionBackward) {
    SCOPED_TRACE(trace());
    struct Case {
        int64_t B, T, H, Hkv, hd, window;
    };
    const Case cases[] = {
        {1, 1, 4, 4, 16, 0},      // one token, group size 1
        {2, 1, 8, 2, 8, 3},       // one token, group size 4, window longer than T
        {2, 37, 4, 4, 16, 0},     // unlimited window
        {2, 37, 8, 2, 32, 5},     // window shorter than T, group size 4
        {1, 37, 4, 1, 8, 1},      // window 1: each query sees itself only
        {3, 20, 6, 2, 8, 8},      // group size 3 (test-tiny-swiglu's heads), window 8
        {1, 50, 4, 2, 32, 80},    // window longer than T
        {1, 200, 8, 8, 32, 200},  // window equal to T
        {1, 130, 8, 2, 64, 50},   // several query and key tiles, window shorter than T
        {2, 130, 4, 4, 64, 0},    // several tiles, unlimited
    };
    for (const Case& c : cases) {
        SCOPED_TRACE("B,T,H,Hkv,hd = " + dims({c.B, c.T, c.H, c.Hkv, c.hd}) + ", window " +
                     std::to_string(c.window));
        const Shape qs{c.B, c.T, c.H, c.hd}, ks{c.B, c.T, c.Hkv, c.hd};
        const int64_t nq = shape_numel(qs), nk = shape_numel(ks);
        const std::vector<float> q = normal(nq), k = normal(nk), v = normal(nk), d_out = normal(nq);
        const std::vector<float> init_q = accum_init(nq), init_k = accum_init(nk),
                                 init_v = accum_init(nk);
        const int64_t keys = c.window > 0 ? std::min(c.window, c.T) : c.T;
        const double tol = reduction_tol(c.hd + (c.H / c.Hkv) * keys);
        expect_matches_cpu([&](Backend& b) {
            Tensor d_q = up(b, init_q, qs), d_k = up(b, init_k, ks), d_v = up(b, init_v, ks);
            b.attention_backward(up(b, q, qs), up(b, k, ks), up(b, v, ks), up(b, d_out, qs), d_q,
                                 d_k, d_v, c.window);
            return Outputs{
                {"d_q", down(b, d_q), tol}, {"d_k", down(b, d_k), tol}, {"d_v", down(b, d_v), tol}};
        });
    }
}

// ---------------------------------------------------------------- router, MoE

TEST_P(BackwardOps, RouterBackward) {
    SCOPED_TRACE(trace());
    // The aux term's gradient is p (dprob - <p, dprob>) with dprob_e = aux_weight E f_e / N,
    // ~aux_weight k / N: tiny at a realistic weight (0.02) and many tokens. kStrong makes it of
    // order 0.01 .. 1 (aux_weight = 8 N / k), and with d_gates 0 it is all the op computes.
    enum AuxKind { kNoAux, kRealistic, kStrong };
    struct Case {
        int64_t N, E, k;
        AuxKind aux;
        bool zero_d_gates;
    };
    const Case cases[] = {
        {1, 1, 1, kRealistic, false},     // one expert: every gradient is 0
        {1, 4, 2, kNoAux, false},         // one token
        {37, 4, 2, kRealistic, false},    // the gate and aux terms together
        {37, 8, 2, kStrong, true},        // the aux term alone
        {130, 5, 3, kRealistic, false},   // test-tiny-swiglu's router
        {130, 8, 8, kStrong, false},      // k = E
        {2500, 8, 2, kRealistic, false},  // many tokens: the aux term's counts span blocks
        {2500, 16, 4, kStrong, true},     // the aux term alone, many tokens
    };
    for (const Case& c : cases) {
        const float aux_weight = c.aux == kNoAux       ? 0.0f
                                 : c.aux == kRealistic ? 0.02f
                                                       : static_cast<float>(8.0 * c.N / c.k);
        SCOPED_TRACE("N,E,k = " + dims({c.N, c.E, c.k}) + ", aux_weight " +
                     std::to_string(aux_weight) + (c.zero_d_gates ? ", d_gates 0" : ""));
        const std::vector<float> logits = normal(c.N * c.E, 1.5);
        const ref::TopK route = routes(logits, c.N, c.E, c.k);
        const std::vector<float> gates(route.gates.begin(), route.gates.end());
        const std::vector<float> d_gates =
            c.zero_d_gates ? std::vector<float>(c.N * c.k, 0.0f) : normal(c.N * c.k);
        const std::vector<float> init = accum_init(c.N * c.E);
        expect_matches_cpu([&](Backend& b) {
            Tensor d_logits = up(b, init, {c.N, c.E});
            b.router_backward(up(b, logits, {c.N, c.E}), up_ids(b, route.indices, {c.N, c.k}),
                              up(b, gates, {c.N, c.k}), up(b, d_gates, {c.N, c.k}), aux_weight,
                              d_logits);
            return Outputs{{"d_logits", down(b, d_logits), reduction_tol(c.E + c.k)}};
        });
    }
}

// d_x sums over Nout; d_w and d_bias over an expert's slots (at most S).
TEST_P(BackwardOps, GroupedMatmulBackward) {
    SCOPED_TRACE(trace());
    struct Case {
        int64_t K, Nout;
        std::vector<int32_t> counts;  // slots per expert
    };
    const Case cases[] = {
        {1, 1, {1}},                           // S = 1
        {7, 1, {1, 0, 36}},                    // S = 37, an expert without slots in the middle
        {33, 17, {37, 0, 0}},                  // one expert receives every slot, two none
        {37, 65, {0, 20, 0, 17}},              // empty experts first and inside
        {129, 77, {64, 0, 1, 65}},             // S = 130: 64 slots, 1 slot, 65 slots
        {1, 9, {0, 0, 0, 130}},                // K = 1, everything in the last expert
        {255, 193, {300, 0, 511, 190, 1, 0}},  // S = 1002, the last expert empty
        {16, 40, {256, 1, 257, 0, 512}},       // ranges at and one past whole chunks of rows
    };
    for (const Case& c : cases)
        for (bool with_bias : {false, true}) {
            const int64_t E = static_cast<int64_t>(c.counts.size());
            const std::vector<int32_t> offsets = expert_offsets(c.counts);
            const int64_t S = offsets[E], K = c.K, Nout = c.Nout;
            SCOPED_TRACE("S,K,E,Nout = " + dims({S, K, E, Nout}) +
                         (with_bias ? ", d_bias" : ", no bias"));
            const std::vector<float> x = normal(S * K), w = normal(E * Nout * K),
                                     d_out = normal(S * Nout);
            const std::vector<float> init_x = accum_init(S * K), init_w = accum_init(E * Nout * K),
                                     init_b = accum_init(E * Nout);
            expect_matches_cpu([&](Backend& b) {
                Tensor d_x = up(b, init_x, {S, K}), d_w = up(b, init_w, {E, Nout, K});
                Tensor d_b = with_bias ? up(b, init_b, {E, Nout}) : Tensor{};
                b.grouped_matmul_backward(up(b, x, {S, K}), up(b, w, {E, Nout, K}),
                                          up_ids(b, offsets, {E + 1}), up(b, d_out, {S, Nout}), d_x,
                                          d_w, d_b);
                Outputs out{{"d_x", down(b, d_x), reduction_tol(Nout)},
                            {"d_w", down(b, d_w), reduction_tol(S)}};
                if (with_bias) out.push_back({"d_bias", down(b, d_b), reduction_tol(S)});
                // An expert without slots keeps its d_w and d_bias exactly as they were.
                for (int64_t e = 0; e < E; ++e) {
                    if (c.counts[e] != 0) continue;
                    const auto slice = [e](const std::vector<float>& v, int64_t per) {
                        return std::vector<float>(v.begin() + e * per, v.begin() + (e + 1) * per);
                    };
                    EXPECT_TRUE(
                        BitwiseEqual(slice(out[1].values, Nout * K), slice(init_w, Nout * K)))
                        << b.name() << ": d_w of expert " << e << ", which has no slot";
                    if (with_bias) {
                        EXPECT_TRUE(BitwiseEqual(slice(out[2].values, Nout), slice(init_b, Nout)))
                            << b.name() << ": d_bias of expert " << e << ", which has no slot";
                    }
                }
                return out;
            });
        }
}

// d_expert_out is one multiply-add per element (each slot is one (token, choice)); d_gates sums
// over d.
TEST_P(BackwardOps, MoeCombineBackward) {
    SCOPED_TRACE(trace());
    struct Case {
        int64_t N, k, d, E;
    };
    for (Case c : {Case{1, 1, 1, 1}, Case{37, 2, 33, 8}, Case{130, 3, 65, 5}, Case{5, 8, 257, 8},
                   Case{1000, 2, 130, 4}}) {
        SCOPED_TRACE("N,k,d,E = " + dims({c.N, c.k, c.d, c.E}));
        const ref::TopK route = routes(normal(c.N * c.E), c.N, c.E, c.k);
        const std::vector<int32_t> slot_of = ref::moe_group(route.indices, c.N, c.k, c.E).slot_of;
        const std::vector<float> y = normal(c.N * c.k * c.d), gates = normal(c.N * c.k),
                                 d_out = normal(c.N * c.d);
        const std::vector<float> init_y = accum_init(c.N * c.k * c.d),
                                 init_g = accum_init(c.N * c.k);
        expect_matches_cpu([&](Backend& b) {
            Tensor d_y = up(b, init_y, {c.N * c.k, c.d}), d_g = up(b, init_g, {c.N, c.k});
            b.moe_combine_backward(up(b, y, {c.N * c.k, c.d}), up_ids(b, slot_of, {c.N * c.k}),
                                   up(b, gates, {c.N, c.k}), up(b, d_out, {c.N, c.d}), d_y, d_g);
            return Outputs{{"d_expert_out", down(b, d_y), kElementwiseTol},
                           {"d_gates", down(b, d_g), reduction_tol(c.d)}};
        });
    }
}

// ---------------------------------------------------------------- elementwise

TEST_P(BackwardOps, ActivationBackward) {
    SCOPED_TRACE(trace());
    for (Activation act : kActivations) {
        for (const Shape& s : {Shape{1}, Shape{17, 33}, Shape{3, 5, 7}, Shape{65, 129}}) {
            SCOPED_TRACE(std::string(to_string(act)) + " " + shape_string(s));
            const int64_t n = shape_numel(s);
            const std::vector<float> x = normal(n, 3.0), d_out = normal(n), init = accum_init(n);
            expect_matches_cpu([&](Backend& b) {
                Tensor d_x = up(b, init, s);
                b.activation_backward(act, up(b, x, s), up(b, d_out, s), d_x);
                return Outputs{{"d_x", down(b, d_x), kElementwiseTol}};
            });
        }
        // Extremes one by one, so that a large derivative does not hide a small one's error.
        for (float v : kExtremes) {
            SCOPED_TRACE(std::string(to_string(act)) + " at " + std::to_string(v));
            const std::vector<float> init = accum_init(1);
            expect_matches_cpu([&](Backend& b) {
                Tensor d_x = up(b, init, {1});
                b.activation_backward(act, up(b, {v}, {1}), up(b, {1.7f}, {1}), d_x);
                return Outputs{{"d_x", down(b, d_x), kElementwiseTol}};
            });
        }
    }
}

TEST_P(BackwardOps, SwigluBackward) {
    SCOPED_TRACE(trace());
    for (const Shape& s : {Shape{1}, Shape{17, 33}, Shape{65, 129}}) {
        SCOPED_TRACE(shape_string(s));
        const int64_t n = shape_numel(s);
        const std::vector<float> gate = normal(n, 3.0), upv = normal(n), d_out = normal(n);
        const std::vector<float> init_g = accum_init(n), init_u = accum_init(n);
        expect_matches_cpu([&](Backend& b) {
            Tensor d_gate = up(b, init_g, s), d_up = up(b, init_u, s);
            b.swiglu_backward(up(b, gate, s), up(b, upv, s), up(b, d_out, s), d_gate, d_up);
            return Outputs{{"d_gate", down(b, d_gate), kElementwiseTol},
                           {"d_up", down(b, d_up), kElementwiseTol}};
        });
    }
    for (float g : kExtremes) {
        SCOPED_TRACE("gate " + std::to_string(g));
        const std::vector<float> init = accum_init(2);
        expect_matches_cpu([&](Backend& b) {
            Tensor d_gate = up(b, {init[0]}, {1}), d_up = up(b, {init[1]}, {1});
            b.swiglu_backward(up(b, {g}, {1}), up(b, {-2.5f}, {1}), up(b, {1.3f}, {1}), d_gate,
                              d_up);
            return Outputs{{"d_gate", down(b, d_gate), kElementwiseTol},
                           {"d_up", down(b, d_up), kElementwiseTol}};
        });
    }
}

// ---------------------------------------------------------------- cross-entropy

// d_logits = scale * (softmax - onehot) is written, not accumulated (the output starts as NaN).
// Entries are bounded by |scale|, so errors are measured against it (the floor of Close());
// the softmax's denominator sums V terms.
TEST_P(BackwardOps, CrossEntropyBackward) {
    SCOPED_TRACE(trace());
    struct Case {
        int64_t N, V;
        double logit_scale;
        float scale;
    };
    const Case cases[] = {
        {1, 1, 1.0, 1.0f},           // one class: the gradient is 0
        {3, 17, 1.0, 0.37f},         // the first row ignored (target -1)
        {17, 33, 3.0, -0.8f},        // a negative scale
        {33, 1000, 2.0, 2.5f},       // rows longer than a warp's stride
        {5, 65, 0.0, 1.0f},          // all logits equal
        {64, 2048, 1.0, 1.0f / 64},  // the demo model's vocabulary, the mean's scale
        {8, 5001, 1.0, 1.0f},        // rows longer than a block
        {6, 40, 1.0, 0.0f},          // scale 0: all zero
    };
    for (const Case& c : cases) {
        SCOPED_TRACE("N,V = " + dims({c.N, c.V}) + ", logit scale " +
                     std::to_string(c.logit_scale) + ", scale " + std::to_string(c.scale));
        const std::vector<float> logits = normal(c.N * c.V, c.logit_scale);
        std::vector<int32_t> targets = ints(c.N, -1, static_cast<int32_t>(c.V));  // with -1
        targets[c.N - 1] = static_cast<int32_t>(c.V - 1);  // the last class is reachable
        if (c.N > 1) targets[0] = -1;
        expect_matches_cpu([&](Backend& b) {
            Tensor d_logits = poisoned(b, {c.N, c.V});
            b.cross_entropy_backward(up(b, logits, {c.N, c.V}), up_ids(b, targets, {c.N}), c.scale,
                                     d_logits);
            std::vector<float> got = down(b, d_logits);
            for (int64_t n = 0; n < c.N; ++n) {
                if (targets[n] != -1) continue;
                for (int64_t v = 0; v < c.V; ++v)
                    if (got[n * c.V + v] != 0.0f) {
                        ADD_FAILURE() << b.name() << ": row " << n << " (target -1), column " << v
                                      << " is " << got[n * c.V + v] << ", not 0";
                        break;
                    }
            }
            return Outputs{{"d_logits", std::move(got), reduction_tol(c.V), std::abs(c.scale)}};
        });
    }
}

// Logits of +-80 and beyond: exp overflows fp32 unless the row's maximum is subtracted first.
TEST_P(BackwardOps, CrossEntropyBackwardWithLargeLogits) {
    SCOPED_TRACE(trace());
    const int64_t N = 6, V = 33;
    std::vector<float> logits(N * V);
    for (float& l : logits) l = static_cast<float>((rng_.uniform() * 2.0 - 1.0) * 80.0);
    for (int64_t v = 0; v < V; ++v) logits[1 * V + v] = 100.0f;  // all equal, large
    for (int64_t v = 0; v < V; ++v) logits[2 * V + v] = v % 2 ? 90.0f : -90.0f;
    logits[3 * V + 5] = 120.0f;  // one dominant
    const std::vector<int32_t> targets = {0, 7, 4, 5, -1, 12};
    expect_matches_cpu([&](Backend& b) {
        Tensor d_logits = poisoned(b, {N, V});
        b.cross_entropy_backward(up(b, logits, {N, V}), up_ids(b, targets, {N}), 0.5f, d_logits);
        return Outputs{{"d_logits", down(b, d_logits), reduction_tol(V)}};
    });
}

// ---------------------------------------------------------------- optimizer support

// The contract accumulates in double where the backend can (a GPU can): the result is then the
// exact sum rounded once to fp32 on both sides, and 1e-6 (~16 ulp) separates that from a lost
// or doubled element, or a sum of x rather than x^2, by orders of magnitude.
TEST_P(BackwardOps, SumSquares) {
    SCOPED_TRACE(trace());
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{16385}, int64_t{262147},
                      int64_t{(1 << 22) + 5}}) {
        SCOPED_TRACE("n = " + std::to_string(n));
        const std::vector<float> x = normal(n, 1.7);
        expect_matches_cpu([&](Backend& b) {
            Tensor out = poisoned(b, {1});
            b.sum_squares(up(b, x, {n}), out);
            return Outputs{{"sum of squares", down(b, out), 1e-6}};
        });
    }
}

// One correctly rounded fp32 multiply per element: exact on both sides.
TEST_P(BackwardOps, Scale) {
    SCOPED_TRACE(trace());
    for (int64_t n : {int64_t{1}, int64_t{53}, int64_t{100003}})
        for (float s : {-0.37f, 0.0f, 3.5f, 1.0f}) {
            SCOPED_TRACE("n = " + std::to_string(n) + ", s = " + std::to_string(s));
            const std::vector<float> x = normal(n);
            expect_matches_cpu([&](Backend& b) {
                Tensor t = up(b, x, {n});
                b.scale(t, s);
                return Outputs{{"x", down(b, t), 0.0}};
            });
        }
}

// Several AdamW steps with fresh gradients each, elements with and without weight decay (two
// calls on views, as a model steps; the split at an odd offset), an all-zero gradient element
// (moments decay, no NaN) and a tiny one (1e-7, where eps's placement in the denominator
// matters). The update is a few elementwise operations with the bias corrections
// derived per step on the host: both backends agree to a few ulp per step. Each output is
// measured against its own scale (floor 0): parameters drawn as at initialisation (std 0.05)
// move by ~lr per step, so 1e-5 of their scale is ~1% of a step at lr 3e-4, while a missing
// bias correction, decay or eps changes a step by 10% .. 10x.
TEST_P(BackwardOps, AdamW) {
    SCOPED_TRACE(trace());
    struct Case {
        float lr, beta1, beta2, eps, weight_decay;
    };
    const int steps = 6;
    for (int64_t n : {int64_t{57}, int64_t{100003}})
        for (Case c :
             {Case{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f}, Case{3e-4f, 0.9f, 0.999f, 1e-8f, 0.0f},
              Case{5e-2f, 0.8f, 0.99f, 1e-6f, 0.5f}}) {
            SCOPED_TRACE("n " + std::to_string(n) + ", lr " + std::to_string(c.lr) + ", betas " +
                         std::to_string(c.beta1) + "/" + std::to_string(c.beta2) + ", eps " +
                         std::to_string(c.eps) + ", wd " + std::to_string(c.weight_decay));
            const std::vector<float> p = normal(n, 0.05);
            const int64_t decayed = (n / 2) | 1;  // elements [0, decayed) have weight decay
            std::vector<std::vector<float>> grads;
            for (int t = 0; t < steps; ++t) {
                grads.push_back(normal(n, 0.3));
                grads.back()[2] = 0.0f;
                grads.back()[3] = 1e-7f;
            }
            expect_matches_cpu([&](Backend& b) {
                Tensor tp = up(b, p, {n}), tm = b.alloc({n}), tv = b.alloc({n});
                Tensor tg = b.alloc({n});
                b.fill(tm, 0.0f);
                b.fill(tv, 0.0f);
                Outputs out;
                for (int t = 0; t < steps; ++t) {
                    b.upload(tg, grads[t].data());
                    for (const bool decay : {true, false}) {
                        const int64_t begin = decay ? 0 : decayed, end = decay ? decayed : n;
                        const auto part = [&](const Tensor& x) {
                            return x.slice(begin, {end - begin});
                        };
                        b.adamw(
                            part(tp), part(tg), part(tm), part(tv),
                            {c.lr, c.beta1, c.beta2, c.eps, decay ? c.weight_decay : 0.0f, t + 1});
                    }
                    const std::string at = " after step " + std::to_string(t + 1);
                    out.push_back({"params" + at, down(b, tp), kElementwiseTol, 0.0});
                    out.push_back({"m" + at, down(b, tm), kElementwiseTol, 0.0});
                    out.push_back({"v" + at, down(b, tv), kElementwiseTol, 0.0});
                }
                return out;
            });
        }
}

// grad_scale (the clip factor) gives the same bits as scaling the gradient first: one fp32
// multiply per element either way. On every training backend, the CPU included.
class AdamWGradScale : public BackendPairTest {
  protected:
    bool needs_training() const override { return true; }
};

TEST_P(AdamWGradScale, EqualsScalingTheGradientFirst) {
    SCOPED_TRACE(trace());
    const int64_t n = 5003;
    const std::vector<float> p = normal(n, 0.05), g = normal(n, 0.3);
    const float s = 0.3713f;  // no power of two: the multiply rounds
    enum class Mode { ScaleFirst, GradScale, Unscaled };
    // params, m, v after three steps, and the gradient tensor as the steps left it.
    const auto run = [&](Mode mode) {
        Tensor tp = up(be(), p, {n}), tg = up(be(), g, {n}), tm = be().alloc({n}),
               tv = be().alloc({n});
        be().fill(tm, 0.0f);
        be().fill(tv, 0.0f);
        for (int t = 1; t <= 3; ++t) {
            Backend::AdamWParams hp{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, t};
            if (mode == Mode::ScaleFirst) {
                be().upload(tg, g.data());
                be().scale(tg, s);
            } else if (mode == Mode::GradScale) {
                hp.grad_scale = s;
            }
            be().adamw(tp, tg, tm, tv, hp);
        }
        return std::vector<std::vector<float>>{down(be(), tp), down(be(), tm), down(be(), tv),
                                               down(be(), tg)};
    };
    const auto scaled_first = run(Mode::ScaleFirst), in_adamw = run(Mode::GradScale);
    const char* names[] = {"params", "m", "v"};
    for (int k = 0; k < 3; ++k) EXPECT_TRUE(BitwiseEqual(in_adamw[k], scaled_first[k])) << names[k];
    EXPECT_TRUE(BitwiseEqual(in_adamw[3], g)) << "the gradient must be left as it was";
    EXPECT_FALSE(BitwiseEqual(run(Mode::Unscaled)[1], in_adamw[1])) << "grad_scale was ignored";
}

INSTANTIATE_TEST_SUITE_P(Backends, AdamWGradScale, ::testing::ValuesIn(backend_names()),
                         backend_param_name);

// ---------------------------------------------------------------- views

// Every input and output below is a view at an odd element offset into a larger buffer of
// random values, as the engine's views into its flat parameter and gradient tensors may be
// (only 4-byte alignment is guaranteed: a kernel that assumes 16-byte-aligned rows for vector
// loads fails here). Row lengths are multiples of 4, so that such a kernel's vector path is
// the one taken. The whole buffers are compared, so elements outside an output's view must
// stay as they were.
TEST_P(BackwardOps, OpsHonourViewsAtOddOffsets) {
    SCOPED_TRACE(trace());
    const int64_t N = 37, d = 64;

    {
        SCOPED_TRACE("gather_rows_backward into an embedding table");
        const int64_t V = 20;
        const std::vector<int32_t> ids = ints(N, 0, static_cast<int32_t>(V));
        const Placed g = placed({N, d}, 1), dt = placed({V, d}, 3, true);
        expect_matches_cpu([&](Backend& b) {
            Tensor dt_buf;
            b.gather_rows_backward(up_ids(b, ids, {N}), view(b, g), view(b, dt, &dt_buf));
            return Outputs{{"d_table buffer", down(b, dt_buf), reduction_tol(N)}};
        });
    }
    {
        SCOPED_TRACE("norm_backward");
        const Placed x = placed({N, d}, 1), w = placed({d}, 5), g = placed({N, d}, 3);
        const Placed dx = placed({N, d}, 1, true), dw = placed({d}, 3, true),
                     db = placed({d}, 7, true);
        expect_matches_cpu([&](Backend& b) {
            Tensor dx_buf, dw_buf, db_buf;
            b.norm_backward(NormType::LayerNorm, view(b, x), view(b, w), view(b, g), 1e-5f,
                            view(b, dx, &dx_buf), view(b, dw, &dw_buf), view(b, db, &db_buf));
            return Outputs{{"d_x buffer", down(b, dx_buf), reduction_tol(d)},
                           {"d_weight buffer", down(b, dw_buf), reduction_tol(N + d)},
                           {"d_bias buffer", down(b, db_buf), reduction_tol(N)}};
        });
    }
    {
        SCOPED_TRACE("bias_backward");
        const Placed g = placed({N, d}, 3), db = placed({d}, 1, true);
        expect_matches_cpu([&](Backend& b) {
            Tensor db_buf;
            b.bias_backward(view(b, g), view(b, db, &db_buf));
            return Outputs{{"d_bias buffer", down(b, db_buf), reduction_tol(N)}};
        });
    }
    {
        SCOPED_TRACE("attention_backward");
        const Shape qs{2, 9, 4, 16}, ks{2, 9, 2, 16};
        const Placed q = placed(qs, 1), k = placed(ks, 3), v = placed(ks, 5), g = placed(qs, 7);
        const Placed dq = placed(qs, 3, true), dk = placed(ks, 1, true), dv = placed(ks, 7, true);
        expect_matches_cpu([&](Backend& b) {
            Tensor dq_buf, dk_buf, dv_buf;
            b.attention_backward(view(b, q), view(b, k), view(b, v), view(b, g),
                                 view(b, dq, &dq_buf), view(b, dk, &dk_buf), view(b, dv, &dv_buf),
                                 4);
            const double tol = reduction_tol(16 + 2 * 4);
            return Outputs{{"d_q buffer", down(b, dq_buf), tol},
                           {"d_k buffer", down(b, dk_buf), tol},
                           {"d_v buffer", down(b, dv_buf), tol}};
        });
    }
    {
        SCOPED_TRACE("router_backward");
        const int64_t E = 8, k = 2;
        const Placed logits = placed({N, E}, 1);
        const std::vector<float> logits_host(logits.whole.begin() + 1,
                                             logits.whole.begin() + 1 + N * E);
        const ref::TopK route = routes(logits_host, N, E, k);
        Placed gates{std::vector<float>(3, 0.5f), 3, {N, k}};
        gates.whole.insert(gates.whole.end(), route.gates.begin(), route.gates.end());
        gates.whole.push_back(0.25f);
        const Placed dg = placed({N, k}, 5), dl = placed({N, E}, 3, true);
        expect_matches_cpu([&](Backend& b) {
            Tensor dl_buf;
            b.router_backward(view(b, logits), up_ids(b, route.indices, {N, k}), view(b, gates),
                              view(b, dg), 0.02f, view(b, dl, &dl_buf));
            return Outputs{{"d_logits buffer", down(b, dl_buf), reduction_tol(E + k)}};
        });
    }
    {
        SCOPED_TRACE("gather_rows_backward and moe_combine_backward");
        const int64_t E = 4, k = 2;
        const ref::TopK route = routes(normal(N * E), N, E, k);
        const ref::Grouping group = ref::moe_group(route.indices, N, k, E);
        const Placed g = placed({N * k, d}, 1), dx = placed({N, d}, 3, true);
        const Placed y = placed({N * k, d}, 5), gates = placed({N, k}, 1), gc = placed({N, d}, 3);
        const Placed dy = placed({N * k, d}, 7, true), dgates = placed({N, k}, 1, true);
        expect_matches_cpu([&](Backend& b) {
            Tensor dx_buf, dy_buf, dgates_buf;
            b.gather_rows_backward(up_ids(b, group.slot_rows, {N * k}), view(b, g),
                                   view(b, dx, &dx_buf));
            b.moe_combine_backward(view(b, y), up_ids(b, group.slot_of, {N * k}), view(b, gates),
                                   view(b, gc), view(b, dy, &dy_buf), view(b, dgates, &dgates_buf));
            return Outputs{{"gather_rows d_x buffer", down(b, dx_buf), reduction_tol(k)},
                           {"d_expert_out buffer", down(b, dy_buf), kElementwiseTol},
                           {"d_gates buffer", down(b, dgates_buf), reduction_tol(d)}};
        });
    }
    {
        SCOPED_TRACE("grouped_matmul_backward");
        const std::vector<int32_t> offsets = expert_offsets({12, 0, 25});
        const int64_t S = 37, E = 3, K = 32, Nout = 20;
        const Placed x = placed({S, K}, 1), w = placed({E, Nout, K}, 3), g = placed({S, Nout}, 5);
        const Placed dx = placed({S, K}, 7, true), dw = placed({E, Nout, K}, 1, true),
                     db = placed({E, Nout}, 3, true);
        expect_matches_cpu([&](Backend& b) {
            Tensor dx_buf, dw_buf, db_buf;
            b.grouped_matmul_backward(view(b, x), view(b, w), up_ids(b, offsets, {E + 1}),
                                      view(b, g), view(b, dx, &dx_buf), view(b, dw, &dw_buf),
                                      view(b, db, &db_buf));
            return Outputs{{"d_x buffer", down(b, dx_buf), reduction_tol(Nout)},
                           {"d_w buffer", down(b, dw_buf), reduction_tol(S)},
                           {"d_bias buffer", down(b, db_buf), reduction_tol(S)}};
        });
    }
    {
        SCOPED_TRACE("activation_backward and swiglu_backward");
        const Placed x = placed({N, d}, 1), g = placed({N, d}, 3), u = placed({N, d}, 5);
        const Placed dx = placed({N, d}, 7, true), dgate = placed({N, d}, 1, true),
                     dup = placed({N, d}, 3, true);
        expect_matches_cpu([&](Backend& b) {
            Tensor dx_buf, dgate_buf, dup_buf;
            b.activation_backward(Activation::Gelu, view(b, x), view(b, g), view(b, dx, &dx_buf));
            b.swiglu_backward(view(b, x), view(b, u), view(b, g), view(b, dgate, &dgate_buf),
                              view(b, dup, &dup_buf));
            return Outputs{{"activation d_x buffer", down(b, dx_buf), kElementwiseTol},
                           {"d_gate buffer", down(b, dgate_buf), kElementwiseTol},
                           {"d_up buffer", down(b, dup_buf), kElementwiseTol}};
        });
    }
    {
        SCOPED_TRACE("cross_entropy_backward");
        const int64_t V = 100;
        const std::vector<int32_t> targets = ints(N, -1, static_cast<int32_t>(V));
        const Placed logits = placed({N, V}, 3), dl = placed({N, V}, 1);
        expect_matches_cpu([&](Backend& b) {
            Tensor dl_buf;
            b.cross_entropy_backward(view(b, logits), up_ids(b, targets, {N}), 0.25f,
                                     view(b, dl, &dl_buf));
            return Outputs{{"d_logits buffer", down(b, dl_buf), reduction_tol(V)}};
        });
    }
    {
        SCOPED_TRACE("sum_squares, scale and adamw");
        const int64_t n = 1000;
        const Placed x = placed({n}, 1), out = placed({1}, 1);
        const Placed p = placed({n}, 3), g = placed({n}, 5), m = placed({n}, 7), v = placed({n}, 1);
        Placed v_nonneg = v;
        for (float& f : v_nonneg.whole) f = f * f;  // second moments are >= 0
        expect_matches_cpu([&](Backend& b) {
            Tensor x_buf, out_buf, p_buf, m_buf, v_buf;
            Tensor xt = view(b, x, &x_buf);
            b.sum_squares(xt, view(b, out, &out_buf));
            b.scale(xt, -1.5f);
            b.adamw(view(b, p, &p_buf), view(b, g), view(b, m, &m_buf), view(b, v_nonneg, &v_buf),
                    {1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 3});
            return Outputs{{"sum_squares out buffer", down(b, out_buf), 1e-6},
                           {"scaled x buffer", down(b, x_buf), 0.0},
                           {"params buffer", down(b, p_buf), kElementwiseTol},
                           {"m buffer", down(b, m_buf), kElementwiseTol},
                           {"v buffer", down(b, v_buf), kElementwiseTol}};
        });
    }
}

// ---------------------------------------------------------------- reproducibility at scale

// The ops at sizes of a training step (the demo model's widths, thousands of tokens), three
// runs each, against the CPU and bit for bit against each other. Large sizes are where a
// backend splits reductions over blocks, and where float atomics (whose order changes from
// run to run) would show: many tokens adding into one embedding row, many slots into one
// expert's d_w, many rows into d_weight and d_bias, many queries into one key's d_k.
TEST_P(BackwardOps, BackwardResultsAreBitwiseReproducibleAtTrainingSizes) {
    SCOPED_TRACE(trace());
    constexpr int kRuns = 3;
    const int64_t N = 4096, d = 192;
    {
        SCOPED_TRACE("gather_rows_backward into an embedding table");
        const int64_t V = 2048;
        std::vector<int32_t> ids = ints(N, 0, static_cast<int32_t>(V));
        for (int64_t n = 0; n < N; n += 2) ids[n] = 1;  // half the tokens: one hot id
        const std::vector<float> g = normal(N * d), init = accum_init(V * d);
        expect_matches_cpu(
            [&](Backend& b) {
                Tensor dt = up(b, init, {V, d});
                b.gather_rows_backward(up_ids(b, ids, {N}), up(b, g, {N, d}), dt);
                return Outputs{{"d_table", down(b, dt), reduction_tol(N)}};
            },
            kRuns);
    }
    {
        SCOPED_TRACE("norm_backward and bias_backward");
        const std::vector<float> x = normal(N * d, 1.5), w = normal(d), g = normal(N * d);
        const std::vector<float> init_x = accum_init(N * d), init_w = accum_init(d),
                                 init_b = accum_init(d), init_bias = accum_init(d);
        expect_matches_cpu(
            [&](Backend& b) {
                Tensor dx = up(b, init_x, {N, d}), dw = up(b, init_w, {d}), db = up(b, init_b, {d}),
                       dbias = up(b, init_bias, {d});
                Tensor gt = up(b, g, {N, d});
                b.norm_backward(NormType::LayerNorm, up(b, x, {N, d}), up(b, w, {d}), gt, 1e-5f, dx,
                                dw, db);
                b.bias_backward(gt, dbias);
                return Outputs{{"d_x", down(b, dx), reduction_tol(d)},
                               {"d_weight", down(b, dw), reduction_tol(N + d)},
                               {"d_bias (norm)", down(b, db), reduction_tol(N)},
                               {"d_bias (linear)", down(b, dbias), reduction_tol(N)}};
            },
            kRuns);
    }
    {
        SCOPED_TRACE("attention_backward");
        struct Case {
            int64_t B, T, H, Hkv, hd, window;
        };
        for (Case c : {Case{4, 256, 6, 2, 32, 128}, Case{1, 512, 8, 2, 64, 0}}) {
            SCOPED_TRACE("B,T,H,Hkv,hd = " + dims({c.B, c.T, c.H, c.Hkv, c.hd}) + ", window " +
                         std::to_string(c.window));
            const Shape qs{c.B, c.T, c.H, c.hd}, ks{c.B, c.T, c.Hkv, c.hd};
            const int64_t nq = shape_numel(qs), nk = shape_numel(ks);
            const std::vector<float> q = normal(nq), k = normal(nk), v = normal(nk), g = normal(nq);
            const std::vector<float> iq = accum_init(nq), ik = accum_init(nk), iv = accum_init(nk);
            const int64_t keys = c.window > 0 ? std::min(c.window, c.T) : c.T;
            const double tol = reduction_tol(c.hd + (c.H / c.Hkv) * keys);
            expect_matches_cpu(
                [&](Backend& b) {
                    Tensor dq = up(b, iq, qs), dk = up(b, ik, ks), dv = up(b, iv, ks);
                    b.attention_backward(up(b, q, qs), up(b, k, ks), up(b, v, ks), up(b, g, qs), dq,
                                         dk, dv, c.window);
                    return Outputs{{"d_q", down(b, dq), tol},
                                   {"d_k", down(b, dk), tol},
                                   {"d_v", down(b, dv), tol}};
                },
                kRuns);
        }
    }
    {
        SCOPED_TRACE("router_backward, gather_rows_backward, moe_combine_backward");
        const int64_t E = 8, k = 2;
        const std::vector<float> logits = normal(N * E, 1.5);
        const ref::TopK route = routes(logits, N, E, k);
        const ref::Grouping group = ref::moe_group(route.indices, N, k, E);
        const std::vector<float> gates(route.gates.begin(), route.gates.end());
        const std::vector<float> dgates = normal(N * k), y = normal(N * k * d), g = normal(N * d),
                                 gs = normal(N * k * d);
        const std::vector<float> init_l = accum_init(N * E), init_x = accum_init(N * d),
                                 init_y = accum_init(N * k * d), init_g = accum_init(N * k);
        expect_matches_cpu(
            [&](Backend& b) {
                Tensor dl = up(b, init_l, {N, E}), dx = up(b, init_x, {N, d}),
                       dy = up(b, init_y, {N * k, d}), dg = up(b, init_g, {N, k});
                Tensor gates_t = up(b, gates, {N, k});
                b.router_backward(up(b, logits, {N, E}), up_ids(b, route.indices, {N, k}), gates_t,
                                  up(b, dgates, {N, k}), 0.02f, dl);
                b.gather_rows_backward(up_ids(b, group.slot_rows, {N * k}), up(b, gs, {N * k, d}),
                                       dx);
                b.moe_combine_backward(up(b, y, {N * k, d}), up_ids(b, group.slot_of, {N * k}),
                                       gates_t, up(b, g, {N, d}), dy, dg);
                return Outputs{{"d_logits", down(b, dl), reduction_tol(E + k)},
                               {"gather_rows d_x", down(b, dx), reduction_tol(k)},
                               {"d_expert_out", down(b, dy), kElementwiseTol},
                               {"d_gates", down(b, dg), reduction_tol(d)}};
            },
            kRuns);
    }
    {
        SCOPED_TRACE("grouped_matmul_backward");
        const std::vector<int32_t> counts = {1500, 0, 700, 1200, 3, 690, 3, 0};  // 4096 slots
        const std::vector<int32_t> offsets = expert_offsets(counts);
        const int64_t S = offsets.back(), E = static_cast<int64_t>(counts.size()), K = d,
                      Nout = 2 * d;
        const std::vector<float> x = normal(S * K), w = normal(E * Nout * K), g = normal(S * Nout);
        const std::vector<float> init_x = accum_init(S * K), init_w = accum_init(E * Nout * K),
                                 init_b = accum_init(E * Nout);
        expect_matches_cpu(
            [&](Backend& b) {
                Tensor dx = up(b, init_x, {S, K}), dw = up(b, init_w, {E, Nout, K}),
                       db = up(b, init_b, {E, Nout});
                b.grouped_matmul_backward(up(b, x, {S, K}), up(b, w, {E, Nout, K}),
                                          up_ids(b, offsets, {E + 1}), up(b, g, {S, Nout}), dx, dw,
                                          db);
                return Outputs{{"d_x", down(b, dx), reduction_tol(Nout)},
                               {"d_w", down(b, dw), reduction_tol(S)},
                               {"d_bias", down(b, db), reduction_tol(S)}};
            },
            kRuns);
    }
    {
        SCOPED_TRACE("cross_entropy_backward and sum_squares");
        const int64_t rows = 512, V = 2048, n = 3 * (1 << 20) + 7;
        const std::vector<float> logits = normal(rows * V, 2.0), x = normal(n);
        const std::vector<int32_t> targets = ints(rows, -1, static_cast<int32_t>(V));
        expect_matches_cpu(
            [&](Backend& b) {
                Tensor dl = poisoned(b, {rows, V}), out = poisoned(b, {1});
                b.cross_entropy_backward(up(b, logits, {rows, V}), up_ids(b, targets, {rows}),
                                         1.0f / rows, dl);
                b.sum_squares(up(b, x, {n}), out);
                return Outputs{{"d_logits", down(b, dl), reduction_tol(V), 1.0 / rows},
                               {"sum of squares", down(b, out), 1e-6}};
            },
            kRuns);
    }
}

INSTANTIATE_TEST_SUITE_P(Backends, BackwardOps, ::testing::ValuesIn(non_cpu_backend_names()),
                         backend_param_name);
// A build with no backend besides the CPU has nothing to instantiate this suite with.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(BackwardOps);

}  // namespace
}  // namespace tmx::test

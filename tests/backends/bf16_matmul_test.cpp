// The matmuls in bf16 precision (a Backend::ModeScope's), on every backend that has it: the CPU
// (which CI runs) and CUDA (on a GPU). The contract is exact enough to test against
// double precision: every operand element rounded to bf16 (round_to_bf16), the products of
// those values (exact in fp32: 8-bit significands) summed in fp32, fp32 results, biases and
// accumulated outputs not rounded, d_bias from the unrounded gradient. So each backend's result
// must be within the fp32 summation tolerance (reduction_tol) of a double-precision reference
// on the rounded operands, and far further from the reference on the unrounded ones (the
// rounding happened). A backend under test is also compared with the CPU at training sizes,
// and must give the same bits twice.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "backends/registry.h"
#include "engine/compute/backend.h"
#include "engine/compute/precision.h"
#include "tests/backends/backend_pair_fixture.h"
#include "tests/backends/matmul_cases.h"
#include "tests/backends/reference_ops.h"

namespace tmx::test {
namespace {

using ref::Ids;
using ref::Vec;

std::vector<float> rounded(const std::vector<float>& v) {
    std::vector<float> r(v.size());
    std::transform(v.begin(), v.end(), r.begin(), round_to_bf16);
    return r;
}

// The double reference on the bf16-rounded operands.
Vec rounded_d(const std::vector<float>& v) {
    return ref::to_double(rounded(v));
}

std::string dims(std::initializer_list<int64_t> d) {
    std::string s;
    for (int64_t x : d) s += (s.empty() ? "" : "x") + std::to_string(x);
    return s;
}

Ids expert_offsets(const std::vector<int32_t>& counts) {
    Ids offsets(counts.size() + 1, 0);
    for (size_t e = 0; e < counts.size(); ++e) offsets[e + 1] = offsets[e] + counts[e];
    return offsets;
}

// A double reference as floats, for Close() (half an fp32 ulp: far below every tolerance).
std::vector<float> as_float(const Vec& v) {
    return std::vector<float>(v.begin(), v.end());
}

// max|got - want| / max(1, max|want|), as Close() measures.
double relative_error(const std::vector<float>& got, const Vec& want) {
    double scale = 1.0, worst = 0.0;
    for (double w : want) scale = std::max(scale, std::abs(w));
    for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]));
    return worst / scale;
}

class Bf16Matmuls : public BackendPairTest {
  protected:
    bool needs_training() const override { return true; }  // the backward products too
    void SetUp() override {
        BackendPairTest::SetUp();
        if (IsSkipped() || HasFatalFailure()) return;
        if (!be().supports_precision(Precision::BF16))
            GTEST_SKIP() << "backend " << backend_name() << " has no bf16 matmuls";
        bf16_.emplace(be(), Backend::Mode{.precision = Precision::BF16});
        cpu_bf16_.emplace(cpu(), Backend::Mode{.precision = Precision::BF16});
    }
    std::optional<Backend::ModeScope> bf16_, cpu_bf16_;  // every test of the suite
};

TEST_P(Bf16Matmuls, DenseMultipliesTheRoundedOperandsInFp32) {
    SCOPED_TRACE(trace());
    for_each_matmul_variant(
        {{1, 1, 1}, {3, 17, 33}, {33, 65, 17}, {64, 64, 64}, {130, 7, 257}, {2, 300, 129}},
        [&](const MatmulVariant& v) {
            const auto a = normal(v.M * v.K), b = normal(v.K * v.N);
            const auto bias = normal(v.N), init = normal(v.M * v.N);
            Tensor out = v.accumulate ? up(be(), init, {v.M, v.N}) : poisoned(be(), {v.M, v.N});
            be().matmul(up(be(), a, v.trans_a ? Shape{v.K, v.M} : Shape{v.M, v.K}),
                        up(be(), b, v.trans_b ? Shape{v.N, v.K} : Shape{v.K, v.N}), out,
                        {.trans_a = v.trans_a, .trans_b = v.trans_b, .accumulate = v.accumulate},
                        v.bias ? up(be(), bias, {v.N}) : Tensor{});
            const Vec bias_d = ref::to_double(bias), init_d = ref::to_double(init);
            const Vec want =
                ref::matmul(rounded_d(a), rounded_d(b), v.M, v.N, v.K, v.trans_a, v.trans_b,
                            v.bias ? &bias_d : nullptr, v.accumulate ? &init_d : nullptr);
            EXPECT_TRUE(Close(down(be(), out), as_float(want), reduction_tol(v.K)));
        });
}

// Against both references at a depth where bf16's rounding (relative 2^-9 per operand) is far
// above fp32's summation error: the result must be near the rounded one and not the other.
TEST_P(Bf16Matmuls, TheOperandsAreReallyRounded) {
    SCOPED_TRACE(trace());
    const int64_t M = 48, N = 40, K = 512;
    const auto a = normal(M * K), b = normal(N * K);
    Tensor out = poisoned(be(), {M, N});
    be().matmul(up(be(), a, {M, K}), up(be(), b, {N, K}), out, {.trans_b = true});
    const std::vector<float> got = down(be(), out);
    const double to_rounded = relative_error(
        got, ref::matmul(rounded_d(a), rounded_d(b), M, N, K, false, true, nullptr, nullptr));
    const double to_exact = relative_error(got, ref::matmul(ref::to_double(a), ref::to_double(b), M,
                                                            N, K, false, true, nullptr, nullptr));
    EXPECT_LT(to_rounded * 10, to_exact) << "dense: " << to_rounded << " vs " << to_exact;

    const Ids offsets = expert_offsets({20, 0, 28});
    const auto w = normal(3 * N * K);
    Tensor gout = poisoned(be(), {M, N});
    be().grouped_matmul(up(be(), a, {M, K}), up(be(), w, {3, N, K}), Tensor{},
                        up_ids(be(), offsets, {4}), gout);
    const std::vector<float> ggot = down(be(), gout);
    const double g_rounded = relative_error(
        ggot, ref::grouped_matmul(rounded_d(a), M, K, rounded_d(w), 3, N, nullptr, offsets));
    const double g_exact = relative_error(
        ggot,
        ref::grouped_matmul(ref::to_double(a), M, K, ref::to_double(w), 3, N, nullptr, offsets));
    EXPECT_LT(g_rounded * 10, g_exact) << "grouped: " << g_rounded << " vs " << g_exact;
}

TEST_P(Bf16Matmuls, GroupedMultipliesTheRoundedOperandsInFp32) {
    SCOPED_TRACE(trace());
    struct Case {
        int64_t K, Nout;
        std::vector<int32_t> counts;  // rows per expert
    };
    const Case cases[] = {
        {1, 1, {1}},
        {17, 33, {0, 5, 0, 0, 2, 1, 0, 0}},  // 8 slots: the decode path on CUDA
        {33, 17, {20, 0, 0}},                // everything in the first expert
        {3, 65, {0, 0, 0, 7}},               // everything in the last expert
        {65, 3, {4, 9, 1, 6, 2}},
        {128, 96, {0, 31, 33, 0, 1, 0, 64, 0}},
        {512, 260, {300, 0, 7, 200}},  // several tiles per expert, rows read as vectors
        // >= 256 slots an expert, rows of a multiple of 8: one cuBLASLt matmul per expert on CUDA
        {64, 40, {700, 0, 1, 600}},
        {24, 16, {513, 511}},
    };
    for (const Case& c : cases)
        for (int with_bias : {0, 1, 2}) {  // none, a tensor of its own, a view at an odd offset
            const int64_t E = static_cast<int64_t>(c.counts.size());
            const Ids offsets = expert_offsets(c.counts);
            const int64_t S = offsets[E];
            SCOPED_TRACE("S,K,E,Nout = " + dims({S, c.K, E, c.Nout}) +
                         " bias=" + std::to_string(with_bias));
            const auto x = normal(S * c.K), w = normal(E * c.Nout * c.K), bias = normal(E * c.Nout);
            Tensor out = poisoned(be(), {S, c.Nout});
            auto padded_bias = bias;  // with a first element outside the odd view
            padded_bias.insert(padded_bias.begin(), 1.0f);
            const Tensor bias_t =
                with_bias == 0   ? Tensor{}
                : with_bias == 1 ? up(be(), bias, {E, c.Nout})
                                 : up(be(), padded_bias, {E * c.Nout + 1}).slice(1, {E, c.Nout});
            be().grouped_matmul(up(be(), x, {S, c.K}), up(be(), w, {E, c.Nout, c.K}), bias_t,
                                up_ids(be(), offsets, {E + 1}), out);
            const Vec bias_d = ref::to_double(bias);
            const Vec want = ref::grouped_matmul(rounded_d(x), S, c.K, rounded_d(w), E, c.Nout,
                                                 with_bias ? &bias_d : nullptr, offsets);
            EXPECT_TRUE(Close(down(be(), out), as_float(want), reduction_tol(c.K)));
        }
}

TEST_P(Bf16Matmuls, GroupedBackwardMultipliesTheRoundedOperandsInFp32) {
    SCOPED_TRACE(trace());
    struct Case {
        int64_t K, Nout;
        std::vector<int32_t> counts;  // slots per expert
    };
    const Case cases[] = {
        {1, 1, {1}},
        {7, 1, {1, 0, 36}},
        {33, 17, {37, 0, 0}},
        {37, 65, {0, 20, 0, 17}},
        {129, 77, {64, 0, 1, 65}},
        {255, 193, {300, 0, 511, 190, 1, 0}},
        {256, 136, {150, 0, 300}},   // rows read as vectors
        {64, 40, {700, 0, 1, 600}},  // one cuBLASLt matmul per expert on CUDA (as above)
    };
    for (const Case& c : cases) {
        const int64_t E = static_cast<int64_t>(c.counts.size());
        const Ids offsets = expert_offsets(c.counts);
        const int64_t S = offsets[E], K = c.K, Nout = c.Nout;
        SCOPED_TRACE("S,K,E,Nout = " + dims({S, K, E, Nout}));
        const auto x = normal(S * K), w = normal(E * Nout * K), dy = normal(S * Nout);
        const auto init_x = accum_init(S * K), init_w = accum_init(E * Nout * K),
                   init_b = accum_init(E * Nout);
        Tensor d_x = up(be(), init_x, {S, K}), d_w = up(be(), init_w, {E, Nout, K}),
               d_b = up(be(), init_b, {E, Nout});
        be().grouped_matmul_backward(up(be(), x, {S, K}), up(be(), w, {E, Nout, K}),
                                     up_ids(be(), offsets, {E + 1}), up(be(), dy, {S, Nout}), d_x,
                                     d_w, d_b);
        // The reference, straight from the contract.
        const Vec xr = rounded_d(x), wr = rounded_d(w), dyr = rounded_d(dy);
        Vec want_x = ref::to_double(init_x), want_w = ref::to_double(init_w),
            want_b = ref::to_double(init_b);
        for (int64_t e = 0; e < E; ++e)
            for (int64_t s = offsets[e]; s < offsets[e + 1]; ++s)
                for (int64_t n = 0; n < Nout; ++n) {
                    const double g = dyr[s * Nout + n];
                    want_b[e * Nout + n] += dy[s * Nout + n];  // the unrounded gradient
                    for (int64_t k = 0; k < K; ++k) {
                        want_x[s * K + k] += g * wr[(e * Nout + n) * K + k];
                        want_w[(e * Nout + n) * K + k] += g * xr[s * K + k];
                    }
                }
        EXPECT_TRUE(Close(down(be(), d_x), as_float(want_x), reduction_tol(Nout))) << "d_x";
        EXPECT_TRUE(Close(down(be(), d_w), as_float(want_w), reduction_tol(S))) << "d_w";
        EXPECT_TRUE(Close(down(be(), d_b), as_float(want_b), reduction_tol(S))) << "d_bias";
    }
}

// At the model's sizes (tiny-mixtral's d_model 512 and a 1024-wide expert layer, 4096 slots),
// against the CPU in bf16, and the same bits on a second run.
TEST_P(Bf16Matmuls, AtTrainingSizesTheBackendMatchesTheCpuAndRepeatsItself) {
    if (backend_name() == "cpu") GTEST_SKIP() << "the CPU is the reference here";
    SCOPED_TRACE(trace());
    const std::vector<int32_t> counts = {1500, 0, 700, 1200, 3, 690, 3, 0};  // 4096 slots
    const Ids offsets = expert_offsets(counts);
    const int64_t S = offsets.back(), E = static_cast<int64_t>(counts.size()), K = 512, Nout = 1024;
    const auto x = normal(S * K), w = normal(E * Nout * K), bias = normal(E * Nout),
               dy = normal(S * Nout), lm = normal(Nout * K);
    const auto init_x = accum_init(S * K), init_w = accum_init(E * Nout * K),
               init_b = accum_init(E * Nout), init_lm = accum_init(Nout * K);
    expect_matches_cpu([&](Backend& b) {
        Tensor xt = up(b, x, {S, K}), wt = up(b, w, {E, Nout, K}),
               off = up_ids(b, offsets, {E + 1});
        Tensor out = poisoned(b, {S, Nout}), dense = poisoned(b, {S, Nout});
        b.grouped_matmul(xt, wt, up(b, bias, {E, Nout}), off, out);
        Tensor d_x = up(b, init_x, {S, K}), d_w = up(b, init_w, {E, Nout, K}),
               d_b = up(b, init_b, {E, Nout});
        b.grouped_matmul_backward(xt, wt, off, up(b, dy, {S, Nout}), d_x, d_w, d_b);
        // A dense linear layer and its weight gradient (trans_a, accumulate).
        Tensor lmt = up(b, lm, {Nout, K}), d_lm = up(b, init_lm, {Nout, K});
        b.matmul(xt, lmt, dense, {.trans_b = true});
        b.matmul(up(b, dy, {S, Nout}), xt, d_lm, {.trans_a = true, .accumulate = true});
        return Outputs{{"grouped out", down(b, out), reduction_tol(K)},
                       {"d_x", down(b, d_x), reduction_tol(Nout)},
                       {"d_w", down(b, d_w), reduction_tol(S)},
                       {"d_bias", down(b, d_b), reduction_tol(S)},
                       {"dense out", down(b, dense), reduction_tol(K)},
                       {"dense d_w", down(b, d_lm), reduction_tol(S)}};
    });
}

INSTANTIATE_TEST_SUITE_P(Backends, Bf16Matmuls, ::testing::ValuesIn(backend_names()),
                         backend_param_name);

}  // namespace
}  // namespace tmx::test

// attention() and attention_backward() in bf16 precision (a Backend::ModeScope's, and the
// contract in engine/compute/backend.h), on every backend that has it: the CPU (which CI runs) and
// CUDA (on a GPU). Each backend is compared with a double-precision reference of the contract
// (ref::attention, ref::attention_backward with Precision::BF16), so meeting it on CUDA is also
// agreeing with the CPU. Also: the rounding really happens (bf16 lands far from the same
// backend's fp32), the weights, P and dS are rounded (nearer the contract than to unrounded ones,
// which the tolerances below cannot tell apart), and heads longer than kBf16AttentionMaxHeadDim
// keep fp32 attention.
//
// Tolerances. Write u_bf = 2^-8, bf16's unit roundoff: a rounded value is within a relative u_bf
// of the exact one, and two roundings of the same value (the contract's, and a GPU's against a
// running max) differ by at most one bf16 ulp.
// - out = sum_j w_j v^_j / l: weights off by a relative u_bf on average move out by at most
//   u_bf max|v^|; the test allows that plus fp32's error (reduction_tol over the hd terms of a
//   score and the keys of a sum, relative to max(1, max|out|)). The CPU's own weights are the
//   contract's up to fp32 noise: they round differently only within noise of a rounding midpoint.
// - d_q, d_k, d_v sum bf16(dS) k^, bf16(dS) q^ and bf16(P) dO^ over keys or queries. A backend
//   recomputes P and dS in fp32 as the contract does (no running max), so its roundings of them
//   differ from the reference's only near midpoints, by one ulp (at most 2^-7 of the value); the
//   test allows 2^-7 of the largest contribution to that gradient (every term one ulp off, unless
//   the terms of an element cancel), plus fp32's error over hd + group * keys terms.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "backends/registry.h"
#include "engine/compute/backend.h"
#include "engine/compute/precision.h"
#include "tests/backends/backend_pair_fixture.h"
#include "tests/backends/reference_ops.h"

namespace tmx::test {
namespace {

using ref::Vec;

constexpr double kBf16UnitRoundoff = 1.0 / 256;  // 2^-8
constexpr double kBf16Ulp = 1.0 / 128;           // 2^-7: one ulp, relative, at most

// q and k with this standard deviation give scores q . k / sqrt(hd) of standard deviation
// 1.5^2: a spread of a few units, as a trained model's, so that no single key takes all the
// weight and none is negligible.
constexpr double kQkScale = 1.5;

struct Case {
    int64_t B, T, H, Hkv, hd, window;
};

std::string describe(const Case& c) {
    std::string s = "B,T,H,Hkv,hd,window = ";
    for (int64_t x : {c.B, c.T, c.H, c.Hkv, c.hd, c.window})
        s += (s.back() == ' ' ? "" : ",") + std::to_string(x);
    return s;
}

int64_t keys_per_query(const Case& c) {
    return c.window > 0 ? std::min(c.window, c.T) : c.T;
}

// Sizes that are multiples of no tile (16, 64): one token, GQA groups 1 .. 4, windows shorter
// and longer than T, head dims 16 .. 128 (the bf16 limit), and the training size (T 300,
// window 256).
const Case kCases[] = {
    {1, 1, 2, 1, 64, 0},     {2, 37, 4, 2, 40, 0},    {1, 70, 8, 2, 64, 16},
    {2, 130, 4, 1, 32, 200}, {1, 200, 8, 2, 128, 64}, {1, 300, 8, 2, 64, 256},
    {2, 45, 4, 4, 16, 7},
};

double max_abs(const std::vector<float>& v) {
    double m = 0.0;
    for (float x : v) m = std::max(m, std::abs(static_cast<double>(x)));
    return m;
}
double max_abs(const Vec& v) {
    double m = 0.0;
    for (double x : v) m = std::max(m, std::abs(x));
    return m;
}
double max_abs_diff(const std::vector<float>& got, const Vec& want) {
    double worst = 0.0;
    for (size_t i = 0; i < got.size(); ++i)
        worst = std::max(worst, std::abs(static_cast<double>(got[i]) - want[i]));
    return worst;
}
std::vector<float> rounded(const std::vector<float>& v) {
    std::vector<float> r(v.size());
    std::transform(v.begin(), v.end(), r.begin(), round_to_bf16);
    return r;
}

// got within tol of want (absolute); on failure, the worst error and its ratio to tol. Keeps the
// largest ratio seen in worst_ratio, for the report.
::testing::AssertionResult Within(const std::vector<float>& got, const Vec& want, double tol,
                                  double& worst_ratio) {
    if (got.size() != want.size())
        return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
    for (size_t i = 0; i < got.size(); ++i)
        if (!std::isfinite(got[i]))
            return ::testing::AssertionFailure() << "element " << i << " is " << got[i];
    const double worst = max_abs_diff(got, want);
    worst_ratio = std::max(worst_ratio, worst / tol);
    if (worst <= tol) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << "worst error " << worst << " > tolerance " << tol << " (" << worst / tol << " of it)";
}

Vec plus(const std::vector<float>& init, const Vec& delta) {
    Vec r(delta.size());
    for (size_t i = 0; i < r.size(); ++i) r[i] = init[i] + delta[i];
    return r;
}

class Bf16Attention : public BackendPairTest {
  protected:
    bool needs_training() const override { return true; }  // the backward too
    void SetUp() override {
        BackendPairTest::SetUp();
        if (IsSkipped() || HasFatalFailure()) return;
        if (!be().supports_precision(Precision::BF16))
            GTEST_SKIP() << "backend " << backend_name() << " has no bf16 precision";
        bf16_.emplace(be(), Backend::Mode{.precision = Precision::BF16});
    }
    std::optional<Backend::ModeScope> bf16_;  // every test of the suite

    struct Inputs {
        Shape qs, ks;
        std::vector<float> q, k, v, d_out, init_q, init_k, init_v;
    };
    Inputs inputs(const Case& c) {
        Inputs in{{c.B, c.T, c.H, c.hd}, {c.B, c.T, c.Hkv, c.hd}};
        const int64_t nq = shape_numel(in.qs), nk = shape_numel(in.ks);
        in.q = normal(nq, kQkScale);
        in.k = normal(nk, kQkScale);
        in.v = normal(nk);
        in.d_out = normal(nq);
        in.init_q = accum_init(nq);
        in.init_k = accum_init(nk);
        in.init_v = accum_init(nk);
        return in;
    }

    struct Results {
        std::vector<float> out, d_q, d_k, d_v;
    };
    // The forward and the backward of `in` on the backend under test, in precision p.
    Results run(const Case& c, const Inputs& in, Precision p) {
        Backend& b = be();
        Backend::ModeScope mode(b, {.precision = p});
        Tensor q = up(b, in.q, in.qs), k = up(b, in.k, in.ks), v = up(b, in.v, in.ks);
        Tensor out = poisoned(b, in.qs);
        b.attention(q, k, v, out, c.window);
        Tensor d_q = up(b, in.init_q, in.qs), d_k = up(b, in.init_k, in.ks),
               d_v = up(b, in.init_v, in.ks);
        b.attention_backward(q, k, v, up(b, in.d_out, in.qs), d_q, d_k, d_v, c.window);
        return {down(b, out), down(b, d_q), down(b, d_k), down(b, d_v)};
    }
};

TEST_P(Bf16Attention, ForwardAndBackwardFollowTheContract) {
    SCOPED_TRACE(trace());
    double worst_out = 0.0, worst_grad = 0.0;  // the largest error / tolerance over the cases
    for (const Case& c : kCases) {
        SCOPED_TRACE(describe(c));
        ASSERT_TRUE(attention_in_bf16(Precision::BF16, c.hd));
        const Inputs in = inputs(c);
        const Results got = run(c, in, Precision::BF16);
        const int64_t keys = keys_per_query(c);
        const Vec q = ref::to_double(in.q), k = ref::to_double(in.k), v = ref::to_double(in.v);

        const Vec want =
            ref::attention(q, k, v, c.B, c.T, c.H, c.Hkv, c.hd, c.window, Precision::BF16);
        const double out_tol = kBf16UnitRoundoff * max_abs(rounded(in.v)) +
                               reduction_tol(c.hd + keys) * std::max(1.0, max_abs(want));
        EXPECT_TRUE(Within(got.out, want, out_tol, worst_out)) << "out";

        const ref::AttentionGrads g =
            ref::attention_backward(q, k, v, ref::to_double(in.d_out), c.B, c.T, c.H, c.Hkv, c.hd,
                                    c.window, Precision::BF16);
        const int64_t length = c.hd + (c.H / c.Hkv) * keys;
        auto grad_tol = [&](const Vec& delta, const Vec& total) {
            return kBf16Ulp * max_abs(delta) +
                   reduction_tol(length) * std::max(1.0, max_abs(total));
        };
        const Vec want_q = plus(in.init_q, g.d_q), want_k = plus(in.init_k, g.d_k),
                  want_v = plus(in.init_v, g.d_v);
        EXPECT_TRUE(Within(got.d_q, want_q, grad_tol(g.d_q, want_q), worst_grad)) << "d_q";
        EXPECT_TRUE(Within(got.d_k, want_k, grad_tol(g.d_k, want_k), worst_grad)) << "d_k";
        EXPECT_TRUE(Within(got.d_v, want_v, grad_tol(g.d_v, want_v), worst_grad)) << "d_v";
    }
    RecordProperty("worst_out_error_over_tolerance", std::to_string(worst_out));
    RecordProperty("worst_gradient_error_over_tolerance", std::to_string(worst_grad));
}

// bf16 against the same backend's fp32 at the training size: the outputs and d_q must differ by
// far more than fp32's own error, or the operands were not rounded. Here fp32 is within ~1e-6
// (relative to max(1, max|x|), as Close() measures) of the exact result (the CPU: 5e-7 .. 9e-7),
// below kElementwiseTol; bf16's roundings (2^-9 relative per operand) move out and d_q by ~5e-3.
// The test asks for 100 kElementwiseTol.
TEST_P(Bf16Attention, TheRoundingHappens) {
    SCOPED_TRACE(trace());
    const Case c{1, 300, 8, 2, 64, 256};
    const Inputs in = inputs(c);
    const Results bf16 = run(c, in, Precision::BF16), fp32 = run(c, in, Precision::F32);
    auto relative_gap = [](const std::vector<float>& a, const std::vector<float>& b) {
        return max_abs_diff(a, ref::to_double(b)) / std::max(1.0, max_abs(b));
    };
    const double out_gap = relative_gap(bf16.out, fp32.out);
    const double d_q_gap = relative_gap(bf16.d_q, fp32.d_q);
    EXPECT_GT(out_gap, 100 * kElementwiseTol) << "out";
    EXPECT_GT(d_q_gap, 100 * kElementwiseTol) << "d_q";
    RecordProperty("out_bf16_vs_fp32", std::to_string(out_gap));
    RecordProperty("d_q_bf16_vs_fp32", std::to_string(d_q_gap));
}

// The tolerances above allow more than leaving the weights, P and dS unrounded would change
// (a relative 2^-9 on average), so this test tells the two apart: in root mean square, which a
// rare rounding across a midpoint hardly moves, the results must be 3 times nearer the contract
// (the CPU, over 60 seeds: 11 .. 29000 times) than the same products of the rounded q, k, v and
// d_out with unrounded weights, P and dS (an implementation that leaves them unrounded is nearer
// the latter). T is 16, one key tile on any GPU, so a running max is the row's max and a GPU rounds
// the weights as the contract does.
TEST_P(Bf16Attention, TheWeightsAndGradientsAreRoundedBeforeTheirProducts) {
    SCOPED_TRACE(trace());
    const Case c{8, 16, 32, 8, 64, 0};  // many rows: one rounding across a midpoint weighs little
    const Inputs in = inputs(c);
    const Results got = run(c, in, Precision::BF16);
    const Vec q = ref::to_double(in.q), k = ref::to_double(in.k), v = ref::to_double(in.v),
              d_out = ref::to_double(in.d_out);
    const Vec qr = ref::to_double(rounded(in.q)), kr = ref::to_double(rounded(in.k)),
              vr = ref::to_double(rounded(in.v)), d_outr = ref::to_double(rounded(in.d_out));
    const Vec want = ref::attention(q, k, v, c.B, c.T, c.H, c.Hkv, c.hd, c.window, Precision::BF16);
    const Vec unrounded = ref::attention(qr, kr, vr, c.B, c.T, c.H, c.Hkv, c.hd, c.window);
    const ref::AttentionGrads g = ref::attention_backward(q, k, v, d_out, c.B, c.T, c.H, c.Hkv,
                                                          c.hd, c.window, Precision::BF16);
    const ref::AttentionGrads gu =
        ref::attention_backward(qr, kr, vr, d_outr, c.B, c.T, c.H, c.Hkv, c.hd, c.window);
    auto expect_nearer = [](const char* what, const std::vector<float>& got,
                            const std::vector<float>& init, const Vec& rounded_products,
                            const Vec& unrounded_products) {
        double to_rounded = 0.0, to_unrounded = 0.0;
        for (size_t i = 0; i < got.size(); ++i) {
            const double x = static_cast<double>(got[i]) - (init.empty() ? 0.0 : init[i]);
            to_rounded += (x - rounded_products[i]) * (x - rounded_products[i]);
            to_unrounded += (x - unrounded_products[i]) * (x - unrounded_products[i]);
        }
        RecordProperty(std::string(what) + "_rms_to_unrounded_over_rms_to_contract",
                       std::to_string(std::sqrt(to_unrounded / to_rounded)));
        EXPECT_LT(std::sqrt(to_rounded) * 3, std::sqrt(to_unrounded))
            << what << ": rms distance to the contract " << std::sqrt(to_rounded / got.size())
            << ", to unrounded weights " << std::sqrt(to_unrounded / got.size());
    };
    expect_nearer("out", got.out, {}, want, unrounded);
    expect_nearer("d_q", got.d_q, in.init_q, g.d_q, gu.d_q);
    expect_nearer("d_k", got.d_k, in.init_k, g.d_k, gu.d_k);
    expect_nearer("d_v", got.d_v, in.init_v, g.d_v, gu.d_v);
}

// q, k, v and out as F32 views at odd element offsets into larger buffers (the engine's views
// are only 4-byte aligned; a kernel storing pairs of floats as one 8-byte store would fault on
// out): the same results, bit for bit, as fresh tensors, and the elements around the output view
// as they were.
TEST_P(Bf16Attention, ViewsAtOddOffsetsGiveTheSameResults) {
    SCOPED_TRACE(trace());
    const Case c{2, 37, 4, 2, 64, 16};
    const Inputs in = inputs(c);
    const Results fresh = run(c, in, Precision::BF16);
    Backend& b = be();
    const int64_t nq = shape_numel(in.qs);
    // A buffer of `pad` random values, then `host`, then 3 more; the view of host within it.
    auto view_at = [&](const std::vector<float>& host, const Shape& shape, int64_t pad,
                       Tensor& buffer) {
        std::vector<float> whole = normal(pad);
        whole.insert(whole.end(), host.begin(), host.end());
        const std::vector<float> tail = normal(3);
        whole.insert(whole.end(), tail.begin(), tail.end());
        buffer = up(b, whole, {static_cast<int64_t>(whole.size())});
        return buffer.slice(pad, shape);
    };
    Tensor q_buf, k_buf, v_buf, out_buf;
    const Tensor q = view_at(in.q, in.qs, 1, q_buf), k = view_at(in.k, in.ks, 3, k_buf);
    const Tensor v = view_at(in.v, in.ks, 5, v_buf);
    const std::vector<float> out_init = normal(nq);
    const Tensor out = view_at(out_init, in.qs, 1, out_buf);
    const std::vector<float> out_before = down(b, out_buf);
    b.attention(q, k, v, out, c.window);
    const std::vector<float> after = down(b, out_buf);
    const std::vector<float> got(after.begin() + 1, after.begin() + 1 + nq);
    EXPECT_TRUE(got == fresh.out) << "the output through views differs from fresh tensors'";
    EXPECT_EQ(after.front(), out_before.front()) << "the element before the view was written";
    EXPECT_TRUE(std::equal(after.end() - 3, after.end(), out_before.end() - 3))
        << "an element after the view was written";
}

// Past kBf16AttentionMaxHeadDim, BF16 precision leaves attention in fp32: the same result as the
// fp32 run, within fp32's tolerance.
TEST_P(Bf16Attention, LongerHeadsKeepFp32) {
    SCOPED_TRACE(trace());
    const Case c{2, 45, 4, 2, kBf16AttentionMaxHeadDim + 2, 16};
    ASSERT_FALSE(attention_in_bf16(Precision::BF16, c.hd));
    const Inputs in = inputs(c);
    const Results bf16 = run(c, in, Precision::BF16), fp32 = run(c, in, Precision::F32);
    const int64_t keys = keys_per_query(c);
    const double out_tol = reduction_tol(c.hd + keys);
    const double grad_tol = reduction_tol(c.hd + (c.H / c.Hkv) * keys);
    EXPECT_TRUE(Close(bf16.out, fp32.out, out_tol)) << "out";
    EXPECT_TRUE(Close(bf16.d_q, fp32.d_q, grad_tol)) << "d_q";
    EXPECT_TRUE(Close(bf16.d_k, fp32.d_k, grad_tol)) << "d_k";
    EXPECT_TRUE(Close(bf16.d_v, fp32.d_v, grad_tol)) << "d_v";
}

INSTANTIATE_TEST_SUITE_P(Backends, Bf16Attention, ::testing::ValuesIn(backend_names()),
                         backend_param_name);

}  // namespace
}  // namespace tmx::test

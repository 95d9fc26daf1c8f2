// The CPU backend's backward ops against central finite differences in double precision, and
// its optimizer-support ops (sum_squares, scale, adamw) against double-precision references.
//
// Method. For an op y = f(X) we draw a random upstream gradient G (never zeros) and define the
// scalar L(X) = sum(G * f(X)), evaluated with a double-precision forward (reference_ops.h, or a
// few lines written here from the contract in engine/compute/backend.h). The numerical gradient is
// dL/dX_i = (L(X + h e_i) - L(X - h e_i)) / 2h with h = 1e-5: with inputs of order 1 the
// truncation error is O(h^2) ~ 1e-10 and the rounding error O(u_double * |L| / h) ~ 1e-10, so
// the numerical gradient is good to ~1e-9. The analytic gradient comes from the backend in
// fp32 (the inputs are the same fp32 values, widened), so the comparison is
// max|analytic - numeric| / max|numeric| <= 1e-3: fp32 rounding of these short reductions is
// ~1e-6, while a wrong sign, index, missed term or factor gives errors of order 1.
//
// Accumulation. Every op whose gradients accumulate is run twice: into zero-initialised
// gradient tensors, and into tensors pre-filled with random values R (the analytic gradient is
// then the download minus R). cross_entropy_backward writes: it is pre-filled too and must
// ignore what was there.
//
// Each test draws a fresh seed (printed via SCOPED_TRACE; TMX_TEST_SEED=<seed> replays it).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iomanip>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "backends/registry.h"
#include "engine/compute/backend.h"
#include "engine/core/threads.h"
#include "tests/backends/reference_ops.h"
#include "tests/backends/tensor_io.h"
#include "tests/test_util.h"

namespace tmx {
namespace {

using ref::Ids;
using ref::Vec;

constexpr double kFdStep = 1e-5;
constexpr double kGradTol = 1e-3;

// Central differences of the scalar function L at x, one coordinate at a time.
template <typename Fn>
Vec numeric_grad(Vec x, Fn&& L, double h = kFdStep) {
    Vec g(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
        const double xi = x[i];
        x[i] = xi + h;
        const double lp = L(x);
        x[i] = xi - h;
        const double lm = L(x);
        x[i] = xi;
        g[i] = (lp - lm) / (2.0 * h);
    }
    return g;
}

// Exact for values that came from floats (the upstream gradients are drawn as floats).
std::vector<float> to_float(const Vec& v) {
    return std::vector<float>(v.begin(), v.end());
}

double dot(const Vec& a, const Vec& b) {
    double s = 0.0;
    for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
    return s;
}

// analytic against numeric, relative to max|numeric|, or to `floor` when that is larger (for
// gradients that can be vanishingly small next to the op's natural scale), or absolute when the
// gradient is all zero.
::testing::AssertionResult GradClose(const Vec& analytic, const Vec& numeric, double tol = kGradTol,
                                     double floor = 0.0) {
    if (analytic.size() != numeric.size())
        return ::testing::AssertionFailure()
               << "size " << analytic.size() << " vs numeric " << numeric.size();
    double scale = floor;
    for (double v : numeric) scale = std::max(scale, std::abs(v));
    if (scale == 0.0) scale = 1.0;
    double worst = 0.0;
    size_t at = 0;
    for (size_t i = 0; i < analytic.size(); ++i) {
        if (!std::isfinite(analytic[i]))
            return ::testing::AssertionFailure()
                   << "element " << i << " is " << analytic[i] << " (numeric " << numeric[i] << ")";
        const double err = std::abs(analytic[i] - numeric[i]);
        if (err > worst) {
            worst = err;
            at = i;
        }
    }
    const double rel = worst / scale;
    if (rel <= tol) return ::testing::AssertionSuccess();
    std::ostringstream os;
    os << std::setprecision(9) << "relative error " << rel << " > " << tol << "; worst element "
       << at << ": analytic " << analytic[at] << ", numeric " << numeric[at] << " (scale " << scale
       << ")";
    return ::testing::AssertionFailure() << os.str();
}

// got against want (doubles), relative to max|want| (absolute below 1e-30).
::testing::AssertionResult RelClose(const std::vector<float>& got, const Vec& want, double tol) {
    if (got.size() != want.size())
        return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
    double scale = 0.0;
    for (double v : want) scale = std::max(scale, std::abs(v));
    if (scale < 1e-30) scale = 1.0;
    double worst = 0.0;
    size_t at = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        const double err = std::abs(static_cast<double>(got[i]) - want[i]);
        if (!(err <= worst)) {  // NaN-safe
            worst = err;
            at = i;
        }
    }
    if (worst / scale <= tol) return ::testing::AssertionSuccess();
    std::ostringstream os;
    os << std::setprecision(12) << "relative error " << worst / scale << " > " << tol
       << "; worst element " << at << ": got " << got[at] << ", want " << want[at] << " (scale "
       << scale << ")";
    return ::testing::AssertionFailure() << os.str();
}

std::string dims(std::initializer_list<int64_t> d) {
    std::ostringstream os;
    const char* sep = "";
    for (int64_t x : d) {
        os << sep << x;
        sep = "x";
    }
    return os.str();
}

class BackwardFiniteDiff : public ::testing::Test, protected test::OneBackendIo {
  protected:
    BackwardFiniteDiff() : seed_(test::fresh_seed()), rng_(seed_), backend_(make_backend("cpu")) {}

    std::string trace() const {
        return "seed " + std::to_string(seed_) +
               " (replay with TMX_TEST_SEED=" + std::to_string(seed_) + ")";
    }

    Backend& be() override { return *backend_; }

    std::vector<float> normal(int64_t n, double scale = 1.0) {
        return test::random_normal(rng_, static_cast<size_t>(n), scale);
    }
    Ids ints(int64_t n, int32_t lo, int32_t hi) {
        return test::random_ints(rng_, static_cast<size_t>(n), lo, hi);
    }

    // A gradient tensor: zeros, or random values (to check that the op adds rather than
    // overwrites). analytic() is what the op contributed.
    struct Grad {
        Tensor t;
        std::vector<float> init;
    };
    Grad grad(Shape shape, bool prefill) {
        const int64_t n = shape_numel(shape);
        std::vector<float> init =
            prefill ? normal(n, 0.5) : std::vector<float>(static_cast<size_t>(n), 0.0f);
        return Grad{up(init, std::move(shape)), init};
    }
    Vec analytic(const Grad& g) {
        std::vector<float> got = down(g.t);
        Vec out(got.size());
        for (size_t i = 0; i < got.size(); ++i)
            out[i] = static_cast<double>(got[i]) - static_cast<double>(g.init[i]);
        return out;
    }

    uint64_t seed_;
    Rng rng_;
    std::unique_ptr<Backend> backend_;
};

using ref::to_double;

const char* mode_name(bool prefill) {
    return prefill ? "accumulate onto random" : "zero-init";
}

// ---------------------------------------------------------------- gather_rows (the embedding)

TEST_F(BackwardFiniteDiff, GatherRowsBackward) {
    SCOPED_TRACE(trace());
    struct Case {
        int64_t N, d, S;
    };
    // An embedding's shape (more rows than tokens) and an expert gather's (more slots than rows).
    for (const Case c : {Case{11, 5, 7}, Case{5, 4, 7}}) {
        for (bool prefill : {false, true}) {
            SCOPED_TRACE("N,d,S = " + dims({c.N, c.d, c.S}) + ", " + mode_name(prefill));
            auto x = normal(c.N * c.d);
            // Row N-1 is never used (gradient 0); one row is gathered three times (its
            // contributions add up).
            Ids rows = ints(c.S, 0, static_cast<int32_t>(c.N - 1));
            rows[1] = rows[0];
            rows[4] = rows[0];
            rows[3] = static_cast<int32_t>(c.N - 2);
            const Vec G = to_double(normal(c.S * c.d));
            Grad d_x = grad({c.N, c.d}, prefill);
            be().gather_rows_backward(up_ids(rows, {c.S}), up(to_float(G), {c.S, c.d}), d_x.t);
            const Vec num = numeric_grad(to_double(x), [&](const Vec& xv) {
                return dot(G, ref::gather_rows(xv, c.N, c.d, rows));
            });
            EXPECT_TRUE(GradClose(analytic(d_x), num));
        }
    }
}

// ---------------------------------------------------------------- norms

TEST_F(BackwardFiniteDiff, LayerNormBackward) {
    SCOPED_TRACE(trace());
    const float eps = 1e-5f;
    struct Case {
        int64_t N, d;
    };
    // Not d = 2: layernorm of two values is +-1 whatever their spread (up to eps), so d_x is
    // O(eps) and what fp32 computes for it is cancellation noise; likewise rmsnorm with d = 1.
    for (Case c : {Case{5, 12}, Case{1, 7}, Case{3, 3}}) {
        for (bool prefill : {false, true}) {
            SCOPED_TRACE("N,d = " + dims({c.N, c.d}) + ", " + mode_name(prefill));
            const int64_t N = c.N, d = c.d;
            auto x = normal(N * d, 1.5);
            for (auto& v : x) v += 0.7f;  // a non-zero mean
            auto w = normal(d);
            auto b = normal(d);
            const Vec G = to_double(normal(N * d));
            Grad d_x = grad({N, d}, prefill), d_w = grad({d}, prefill), d_b = grad({d}, prefill);
            be().norm_backward(NormType::LayerNorm, up(x, {N, d}), up(w, {d}),
                               up(to_float(G), {N, d}), eps, d_x.t, d_w.t, d_b.t);
            const Vec X = to_double(x), W = to_double(w), Bv = to_double(b);
            const double e = eps;
            EXPECT_TRUE(GradClose(
                analytic(d_x),
                numeric_grad(
                    X, [&](const Vec& v) { return dot(G, ref::layernorm(v, N, d, W, Bv, e)); })))
                << "d_x";
            EXPECT_TRUE(GradClose(
                analytic(d_w),
                numeric_grad(
                    W, [&](const Vec& v) { return dot(G, ref::layernorm(X, N, d, v, Bv, e)); })))
                << "d_weight";
            EXPECT_TRUE(GradClose(
                analytic(d_b),
                numeric_grad(
                    Bv, [&](const Vec& v) { return dot(G, ref::layernorm(X, N, d, W, v, e)); })))
                << "d_bias";
        }
    }
}

TEST_F(BackwardFiniteDiff, RmsNormBackward) {
    SCOPED_TRACE(trace());
    const float eps = 1e-5f;
    struct Case {
        int64_t N, d;
    };
    for (Case c : {Case{5, 12}, Case{1, 7}, Case{3, 2}}) {
        for (bool prefill : {false, true}) {
            SCOPED_TRACE("N,d = " + dims({c.N, c.d}) + ", " + mode_name(prefill));
            const int64_t N = c.N, d = c.d;
            auto x = normal(N * d, 1.5);
            for (auto& v : x) v += 0.7f;  // rmsnorm does not centre: the mean matters
            auto w = normal(d);
            const Vec G = to_double(normal(N * d));
            Grad d_x = grad({N, d}, prefill), d_w = grad({d}, prefill);
            be().norm_backward(NormType::RmsNorm, up(x, {N, d}), up(w, {d}),
                               up(to_float(G), {N, d}), eps, d_x.t, d_w.t, Tensor{});
            const Vec X = to_double(x), W = to_double(w);
            const double e = eps;
            EXPECT_TRUE(GradClose(
                analytic(d_x),
                numeric_grad(X, [&](const Vec& v) { return dot(G, ref::rmsnorm(v, N, d, W, e)); })))
                << "d_x";
            EXPECT_TRUE(GradClose(
                analytic(d_w),
                numeric_grad(W, [&](const Vec& v) { return dot(G, ref::rmsnorm(X, N, d, v, e)); })))
                << "d_weight";
        }
    }
}

// ---------------------------------------------------------------- linear layers

TEST_F(BackwardFiniteDiff, BiasBackward) {
    SCOPED_TRACE(trace());
    const int64_t M = 6, N = 5;
    for (bool prefill : {false, true}) {
        SCOPED_TRACE(mode_name(prefill));
        // y = z + b broadcast over rows; L = sum G * y.
        auto z = normal(M * N), b = normal(N);
        const Vec G = to_double(normal(M * N));
        Grad d_b = grad({N}, prefill);
        be().bias_backward(up(to_float(G), {M, N}), d_b.t);
        const Vec Z = to_double(z);
        const Vec num = numeric_grad(to_double(b), [&](const Vec& bv) {
            Vec y = Z;
            for (int64_t m = 0; m < M; ++m)
                for (int64_t n = 0; n < N; ++n) y[m * N + n] += bv[n];
            return dot(G, y);
        });
        EXPECT_TRUE(GradClose(analytic(d_b), num));
    }
}

// The engine's linear-layer backward: dX += dY W, dW += dY^T X (matmul with trans_a and
// accumulate), d_b += column sums of dY; checked against FD of y = x W^T + b.
TEST_F(BackwardFiniteDiff, MatmulLinearBackward) {
    SCOPED_TRACE(trace());
    struct Case {
        int64_t M, K, N;
    };
    for (Case c : {Case{5, 7, 3}, Case{1, 4, 6}, Case{6, 1, 2}}) {
        for (bool prefill : {false, true}) {
            SCOPED_TRACE("M,K,N = " + dims({c.M, c.K, c.N}) + ", " + mode_name(prefill));
            const int64_t M = c.M, K = c.K, N = c.N;
            auto x = normal(M * K), w = normal(N * K), b = normal(N);
            const Vec G = to_double(normal(M * N));
            Tensor tx = up(x, {M, K}), tw = up(w, {N, K}), tg = up(to_float(G), {M, N});
            Grad d_x = grad({M, K}, prefill), d_w = grad({N, K}, prefill), d_b = grad({N}, prefill);
            be().matmul(tg, tw, d_x.t, {.accumulate = true});
            be().matmul(tg, tx, d_w.t, {.trans_a = true, .accumulate = true});
            be().bias_backward(tg, d_b.t);
            const Vec X = to_double(x), W = to_double(w), Bv = to_double(b);
            auto f = [&](const Vec& xv, const Vec& wv, const Vec& bv) {
                return dot(G, ref::matmul(xv, wv, M, N, K, false, true, &bv));
            };
            EXPECT_TRUE(GradClose(analytic(d_x),
                                  numeric_grad(X, [&](const Vec& v) { return f(v, W, Bv); })))
                << "d_x";
            EXPECT_TRUE(GradClose(analytic(d_w),
                                  numeric_grad(W, [&](const Vec& v) { return f(X, v, Bv); })))
                << "d_w";
            EXPECT_TRUE(GradClose(analytic(d_b),
                                  numeric_grad(Bv, [&](const Vec& v) { return f(X, W, v); })))
                << "d_bias";
        }
    }
}

// ---------------------------------------------------------------- rope

TEST_F(BackwardFiniteDiff, RopeInverseIsBackward) {
    SCOPED_TRACE(trace());
    struct Case {
        int64_t N, H, hd;
        double theta;
    };
    for (Case c : {Case{7, 2, 6, 10000.0}, Case{5, 3, 8, 100.0}, Case{1, 1, 2, 10000.0}}) {
        SCOPED_TRACE("N,H,hd = " + dims({c.N, c.H, c.hd}) + ", theta " + std::to_string(c.theta));
        const int64_t N = c.N, H = c.H, hd = c.hd;
        auto x = normal(N * H * hd);
        Ids pos = ints(N, 0, 600);
        pos[0] = 0;  // the identity rotation
        const Vec G = to_double(normal(N * H * hd));
        // Backward of L = sum G * rope(x): rope(G, inverse).
        Tensor tg = up(to_float(G), {N, H, hd});
        Tensor tpos = up_ids(pos, {N});
        be().rope(tg, tpos, c.theta, /*inverse=*/true);
        std::vector<float> got = down(tg);
        const Vec num = numeric_grad(to_double(x), [&](const Vec& xv) {
            return dot(G, ref::rope(xv, N, H, hd, pos, c.theta));
        });
        EXPECT_TRUE(GradClose(to_double(got), num));

        // rope then inverse rope is the identity (two fp32 rotations: a few ulp).
        Tensor tx = up(x, {N, H, hd});
        be().rope(tx, tpos, c.theta);
        be().rope(tx, tpos, c.theta, /*inverse=*/true);
        EXPECT_TRUE(RelClose(down(tx), to_double(x), 2e-6)) << "rope then inverse rope";
    }
}

// ---------------------------------------------------------------- attention

TEST_F(BackwardFiniteDiff, AttentionBackward) {
    SCOPED_TRACE(trace());
    struct Case {
        int64_t B, T, H, Hkv, hd, window;
    };
    for (Case c : {Case{1, 6, 2, 2, 4, 0},     // full causal
                   Case{1, 6, 2, 2, 4, 3},     // window < T
                   Case{1, 5, 4, 2, 3, 0},     // GQA group 2
                   Case{2, 5, 4, 2, 4, 2},     // B = 2, GQA, window
                   Case{2, 4, 2, 1, 4, 9},     // window > T: same as unlimited
                   Case{2, 1, 2, 1, 4, 0},     // T = 1: out = v
                   Case{1, 6, 2, 1, 4, 1}}) {  // window 1: each query sees itself only
        for (bool prefill : {false, true}) {
            SCOPED_TRACE("B,T,H,Hkv,hd,window = " + dims({c.B, c.T, c.H, c.Hkv, c.hd, c.window}) +
                         ", " + mode_name(prefill));
            const int64_t B = c.B, T = c.T, H = c.H, Hkv = c.Hkv, hd = c.hd, W = c.window;
            auto q = normal(B * T * H * hd), k = normal(B * T * Hkv * hd),
                 v = normal(B * T * Hkv * hd);
            const Vec G = to_double(normal(B * T * H * hd));
            Grad d_q = grad({B, T, H, hd}, prefill), d_k = grad({B, T, Hkv, hd}, prefill),
                 d_v = grad({B, T, Hkv, hd}, prefill);
            be().attention_backward(up(q, {B, T, H, hd}), up(k, {B, T, Hkv, hd}),
                                    up(v, {B, T, Hkv, hd}), up(to_float(G), {B, T, H, hd}), d_q.t,
                                    d_k.t, d_v.t, W);
            const Vec Q = to_double(q), K = to_double(k), Vv = to_double(v);
            auto f = [&](const Vec& qv, const Vec& kv, const Vec& vv) {
                return dot(G, ref::attention(qv, kv, vv, B, T, H, Hkv, hd, W));
            };
            EXPECT_TRUE(GradClose(analytic(d_q),
                                  numeric_grad(Q, [&](const Vec& x) { return f(x, K, Vv); })))
                << "d_q";
            EXPECT_TRUE(GradClose(analytic(d_k),
                                  numeric_grad(K, [&](const Vec& x) { return f(Q, x, Vv); })))
                << "d_k";
            EXPECT_TRUE(GradClose(analytic(d_v),
                                  numeric_grad(Vv, [&](const Vec& x) { return f(Q, K, x); })))
                << "d_v";
        }
    }
}

// ---------------------------------------------------------------- router

// Gates of a fixed selection: softmax over logits[n, indices[n, :]] (the top-k held fixed, as
// the backward treats it: the selection is piecewise constant in the logits).
Vec fixed_gates(const Vec& logits, int64_t N, int64_t E, const Ids& indices, int64_t k) {
    Vec g(static_cast<size_t>(N * k));
    for (int64_t n = 0; n < N; ++n) {
        double m = -INFINITY;
        for (int64_t j = 0; j < k; ++j) m = std::max(m, logits[n * E + indices[n * k + j]]);
        double z = 0.0;
        for (int64_t j = 0; j < k; ++j) z += std::exp(logits[n * E + indices[n * k + j]] - m);
        for (int64_t j = 0; j < k; ++j)
            g[n * k + j] = std::exp(logits[n * E + indices[n * k + j]] - m) / z;
    }
    return g;
}

// aux = E * sum_e f_e * P_e with f_e counted from the fixed indices, P_e the mean softmax.
double aux_fixed_f(const Vec& logits, int64_t N, int64_t E, const Ids& indices, int64_t k) {
    Vec f(static_cast<size_t>(E), 0.0), P(static_cast<size_t>(E), 0.0);
    for (int64_t s = 0; s < N * k; ++s) f[indices[s]] += 1.0 / static_cast<double>(N);
    for (int64_t n = 0; n < N; ++n) {
        double m = -INFINITY;
        for (int64_t e = 0; e < E; ++e) m = std::max(m, logits[n * E + e]);
        double z = 0.0;
        for (int64_t e = 0; e < E; ++e) z += std::exp(logits[n * E + e] - m);
        for (int64_t e = 0; e < E; ++e)
            P[e] += std::exp(logits[n * E + e] - m) / z / static_cast<double>(N);
    }
    double s = 0.0;
    for (int64_t e = 0; e < E; ++e) s += f[e] * P[e];
    return static_cast<double>(E) * s;
}

TEST_F(BackwardFiniteDiff, RouterBackward) {
    SCOPED_TRACE(trace());
    struct Case {
        int64_t N, E, k;
        float aux_weight;
        bool zero_d_gates;  // isolates the aux path
    };
    for (Case c : {Case{6, 5, 2, 0.0f, false},   // gate softmax only
                   Case{6, 5, 2, 0.25f, false},  // both paths
                   Case{7, 4, 2, 0.1f, true},    // aux path only
                   Case{7, 4, 1, 0.0f, false},   // k = 1: gates are 1, no gradient
                   Case{7, 4, 1, 0.3f, false},   // k = 1 with aux
                   Case{3, 4, 4, 0.2f, false},   // k = E
                   Case{1, 3, 2, 0.5f, false}}) {
        for (bool prefill : {false, true}) {
            SCOPED_TRACE("N,E,k = " + dims({c.N, c.E, c.k}) + ", aux_weight " +
                         std::to_string(c.aux_weight) + (c.zero_d_gates ? ", d_gates 0" : "") +
                         ", " + mode_name(prefill));
            const int64_t N = c.N, E = c.E, k = c.k;
            auto logits = normal(N * E, 1.5);
            Tensor tl = up(logits, {N, E});
            Tensor tidx = be().alloc({N, k}, DType::I32);
            Tensor tgates = be().alloc({N, k});
            be().router_topk(tl, tidx, tgates);
            const Ids idx = down_ids(tidx);
            const Vec L0 = to_double(logits);
            // The forward pieces agree with the reference at the unperturbed point.
            ASSERT_EQ(idx, ref::router_topk(L0, N, E, k).indices);
            ASSERT_NEAR(aux_fixed_f(L0, N, E, idx, k), ref::router_aux_loss(L0, N, E, idx, k),
                        1e-12);

            const Vec dG =
                c.zero_d_gates ? Vec(static_cast<size_t>(N * k), 0.0) : to_double(normal(N * k));
            Grad d_logits = grad({N, E}, prefill);
            be().router_backward(tl, tidx, tgates, up(to_float(dG), {N, k}), c.aux_weight,
                                 d_logits.t);
            // The top-k selection and the counts f are held at their unperturbed values (h is
            // far below any gap between logits, so the selection would not change anyway).
            const double aw = c.aux_weight;
            const Vec num = numeric_grad(L0, [&](const Vec& lv) {
                double L = dot(dG, fixed_gates(lv, N, E, idx, k));
                if (aw > 0.0) L += aw * aux_fixed_f(lv, N, E, idx, k);
                return L;
            });
            EXPECT_TRUE(GradClose(analytic(d_logits), num));
        }
    }
}

// ---------------------------------------------------------------- grouped matmul, combine

TEST_F(BackwardFiniteDiff, GroupedMatmulBackward) {
    SCOPED_TRACE(trace());
    struct Case {
        std::vector<int32_t> counts;  // rows per expert
        bool with_bias;
    };
    // Experts 1 and 4 have no rows (a middle one and the last): their gradients stay zero.
    for (const Case& c :
         {Case{{2, 0, 3, 2, 0}, true}, Case{{0, 4, 1}, false}, Case{{1, 1, 1, 1}, true}}) {
        for (bool prefill : {false, true}) {
            const int64_t E = static_cast<int64_t>(c.counts.size()), K = 5, Nout = 3;
            Ids offsets(static_cast<size_t>(E + 1), 0);
            for (int64_t e = 0; e < E; ++e) offsets[e + 1] = offsets[e] + c.counts[e];
            const int64_t S = offsets[E];
            SCOPED_TRACE("E,S,K,Nout = " + dims({E, S, K, Nout}) +
                         (c.with_bias ? ", bias" : ", no bias") + ", " + mode_name(prefill));
            auto x = normal(S * K), w = normal(E * Nout * K), b = normal(E * Nout);
            const Vec G = to_double(normal(S * Nout));
            Grad d_x = grad({S, K}, prefill), d_w = grad({E, Nout, K}, prefill);
            Grad d_b = grad({E, Nout}, prefill);
            be().grouped_matmul_backward(up(x, {S, K}), up(w, {E, Nout, K}),
                                         up_ids(offsets, {E + 1}), up(to_float(G), {S, Nout}),
                                         d_x.t, d_w.t, c.with_bias ? d_b.t : Tensor{});
            const Vec X = to_double(x), Wv = to_double(w), Bv = to_double(b);
            auto f = [&](const Vec& xv, const Vec& wv, const Vec& bv) {
                return dot(G, ref::grouped_matmul(xv, S, K, wv, E, Nout,
                                                  c.with_bias ? &bv : nullptr, offsets));
            };
            EXPECT_TRUE(GradClose(analytic(d_x),
                                  numeric_grad(X, [&](const Vec& v) { return f(v, Wv, Bv); })))
                << "d_x";
            const Vec gw = analytic(d_w);
            EXPECT_TRUE(GradClose(gw, numeric_grad(Wv, [&](const Vec& v) { return f(X, v, Bv); })))
                << "d_w";
            const Vec gb = analytic(d_b);
            if (c.with_bias) {
                EXPECT_TRUE(
                    GradClose(gb, numeric_grad(Bv, [&](const Vec& v) { return f(X, Wv, v); })))
                    << "d_bias";
            }
            // An expert without rows gets exactly zero gradient (its slice is left untouched).
            for (int64_t e = 0; e < E; ++e) {
                if (c.counts[e] != 0) continue;
                for (int64_t i = e * Nout * K; i < (e + 1) * Nout * K; ++i)
                    EXPECT_EQ(gw[i], 0.0) << "d_w of empty expert " << e << ", element " << i;
                for (int64_t i = e * Nout; i < (e + 1) * Nout; ++i)
                    EXPECT_EQ(gb[i], 0.0) << "d_bias of empty expert " << e;
            }
        }
    }
}

TEST_F(BackwardFiniteDiff, MoeCombineBackward) {
    SCOPED_TRACE(trace());
    struct Case {
        int64_t N, E, k, d;
    };
    for (Case c : {Case{5, 4, 2, 4}, Case{6, 3, 1, 3}, Case{1, 2, 2, 5}}) {
        for (bool prefill : {false, true}) {
            SCOPED_TRACE("N,E,k,d = " + dims({c.N, c.E, c.k, c.d}) + ", " + mode_name(prefill));
            const int64_t N = c.N, E = c.E, k = c.k, d = c.d;
            const Ids indices = ref::router_topk(to_double(normal(N * E)), N, E, k).indices;
            const Ids slot_of = ref::moe_group(indices, N, k, E).slot_of;
            auto y = normal(N * k * d), g = normal(N * k);
            const Vec G = to_double(normal(N * d));
            Grad d_y = grad({N * k, d}, prefill), d_g = grad({N, k}, prefill);
            be().moe_combine_backward(up(y, {N * k, d}), up_ids(slot_of, {N * k}), up(g, {N, k}),
                                      up(to_float(G), {N, d}), d_y.t, d_g.t);
            const Vec Y = to_double(y), Gt = to_double(g), zeros(static_cast<size_t>(N * d), 0.0);
            auto f = [&](const Vec& yv, const Vec& gv) {
                return dot(G, ref::moe_combine(yv, slot_of, gv, N, k, d, zeros));
            };
            EXPECT_TRUE(
                GradClose(analytic(d_y), numeric_grad(Y, [&](const Vec& v) { return f(v, Gt); })))
                << "d_expert_out";
            EXPECT_TRUE(
                GradClose(analytic(d_g), numeric_grad(Gt, [&](const Vec& v) { return f(Y, v); })))
                << "d_gates";
        }
    }
}

// ---------------------------------------------------------------- activations

TEST_F(BackwardFiniteDiff, ActivationBackward) {
    SCOPED_TRACE(trace());
    const int64_t n = 41;
    struct Named {
        Activation act;
        const char* name;
    };
    for (Named a : {Named{Activation::Gelu, "gelu"}, Named{Activation::Silu, "silu"},
                    Named{Activation::Relu, "relu"}, Named{Activation::Relu2, "relu2"}}) {
        for (bool prefill : {false, true}) {
            SCOPED_TRACE(std::string(a.name) + ", " + mode_name(prefill));
            auto x = normal(n, 2.5);
            // Keep clear of relu's kink at 0 (FD would straddle it); and cover the tails.
            for (auto& v : x)
                if (std::abs(v) < 1e-3f) v = v < 0 ? -0.5f : 0.5f;
            x[0] = 6.0f;
            x[1] = -6.0f;
            const Vec G = to_double(normal(n));
            Grad d_x = grad({n}, prefill);
            be().activation_backward(a.act, up(x, {n}), up(to_float(G), {n}), d_x.t);
            const Vec num = numeric_grad(
                to_double(x), [&](const Vec& xv) { return dot(G, ref::activation(a.act, xv)); });
            EXPECT_TRUE(GradClose(analytic(d_x), num));
        }
    }
}

TEST_F(BackwardFiniteDiff, SwigluBackward) {
    SCOPED_TRACE(trace());
    const int64_t n = 37;
    for (bool prefill : {false, true}) {
        SCOPED_TRACE(mode_name(prefill));
        auto gate = normal(n, 2.5), upv = normal(n);
        gate[0] = 8.0f;
        gate[1] = -8.0f;
        const Vec G = to_double(normal(n));
        Grad d_gate = grad({n}, prefill), d_up = grad({n}, prefill);
        be().swiglu_backward(up(gate, {n}), up(upv, {n}), up(to_float(G), {n}), d_gate.t, d_up.t);
        const Vec Gt = to_double(gate), U = to_double(upv);
        EXPECT_TRUE(
            GradClose(analytic(d_gate),
                      numeric_grad(Gt, [&](const Vec& v) { return dot(G, ref::swiglu(v, U)); })))
            << "d_gate";
        EXPECT_TRUE(
            GradClose(analytic(d_up),
                      numeric_grad(U, [&](const Vec& v) { return dot(G, ref::swiglu(Gt, v)); })))
            << "d_up";
    }
}

// ---------------------------------------------------------------- cross-entropy

TEST_F(BackwardFiniteDiff, CrossEntropyBackward) {
    SCOPED_TRACE(trace());
    struct Case {
        int64_t N, V;
        double logit_scale;
        float scale;
    };
    for (Case c : {Case{5, 11, 1.0, 0.37f}, Case{4, 7, 20.0, 1.0f}, Case{1, 1, 1.0, 2.5f},
                   Case{6, 3, 3.0, -0.8f}}) {
        SCOPED_TRACE("N,V = " + dims({c.N, c.V}) + ", logit scale " +
                     std::to_string(c.logit_scale) + ", scale " + std::to_string(c.scale));
        const int64_t N = c.N, V = c.V;
        auto logits = normal(N * V, c.logit_scale);
        Ids targets = ints(N, 0, static_cast<int32_t>(V));
        if (N > 1) targets[1] = -1;  // ignored rows
        if (N > 3) targets[3] = -1;
        targets[0] = static_cast<int32_t>(V - 1);
        // Pre-filled with garbage: the op writes, it does not accumulate.
        auto garbage = normal(N * V, 3.0);
        Tensor d_logits = up(garbage, {N, V});
        be().cross_entropy_backward(up(logits, {N, V}), up_ids(targets, {N}), c.scale, d_logits);
        const std::vector<float> got = down(d_logits);
        const double s = c.scale;
        const Vec num = numeric_grad(to_double(logits), [&](const Vec& lv) {
            Vec losses = ref::cross_entropy(lv, N, V, targets);
            double L = 0.0;
            for (double l : losses) L += l;
            return s * L;
        });
        // With large logits a row's gradient can be ~exp(-40): below fp32's resolution of
        // p - 1 (~6e-8 |scale|) and double FD's noise (~1e-10). Entries are bounded by |scale|,
        // so errors are measured against at least 1e-3 |scale| (an absolute 1e-6 |scale|).
        EXPECT_TRUE(GradClose(to_double(got), num, kGradTol, 1e-3 * std::abs(s)));
        for (int64_t n = 0; n < N; ++n) {
            if (targets[n] != -1) continue;
            for (int64_t v = 0; v < V; ++v)
                EXPECT_EQ(got[n * V + v], 0.0f) << "row " << n << " (target -1), column " << v;
        }
    }
}

// ---------------------------------------------------------------- optimizer support

TEST_F(BackwardFiniteDiff, SumSquaresDoubleAccurateAndThreadIndependent) {
    SCOPED_TRACE(trace());
    const int saved_threads = num_threads();
    for (int64_t n : {int64_t{50001}, int64_t{16384}, int64_t{7}, int64_t{1}}) {
        SCOPED_TRACE("n = " + std::to_string(n));
        auto x = normal(n, 1.7);
        double want = 0.0;
        for (float v : x) want += static_cast<double>(v) * v;
        Tensor tx = up(x, {n});
        float got[2];
        for (int threads : {1, 2}) {
            set_num_threads(threads);
            Tensor out = be().alloc({1});
            be().fill(out, std::nanf(""));
            be().sum_squares(tx, out);
            be().download(out, &got[threads - 1]);
        }
        set_num_threads(saved_threads);
        EXPECT_TRUE(RelClose({got[0]}, {want}, 1e-6));
        // Bitwise identical whatever the thread count.
        EXPECT_EQ(got[0], got[1]) << "1 thread vs 2 threads";
    }
    set_num_threads(saved_threads);
}

TEST_F(BackwardFiniteDiff, Scale) {
    SCOPED_TRACE(trace());
    const int64_t n = 53;
    for (float s : {-0.37f, 0.0f, 3.5f, 1.0f}) {
        SCOPED_TRACE("s = " + std::to_string(s));
        auto x = normal(n);
        Tensor tx = up(x, {n});
        be().scale(tx, s);
        const std::vector<float> got = down(tx);
        for (int64_t i = 0; i < n; ++i) {
            // One correctly rounded fp32 multiply.
            const volatile float want = x[i] * s;
            EXPECT_EQ(got[i], want) << "element " << i;
        }
    }
}

// PyTorch's AdamW, in double, on the fp32 inputs and hyperparameters.
struct AdamWRef {
    Vec p, m, v;
    void step(const Vec& g, const Vec& mask, const Backend::AdamWParams& hp) {
        const double lr = hp.lr, b1 = hp.beta1, b2 = hp.beta2, eps = hp.eps, wd = hp.weight_decay;
        const double t = static_cast<double>(hp.step);
        const double bc1 = 1.0 - std::pow(b1, t), bc2 = 1.0 - std::pow(b2, t);
        for (size_t i = 0; i < p.size(); ++i) {
            p[i] *= 1.0 - lr * wd * mask[i];
            m[i] = b1 * m[i] + (1.0 - b1) * g[i];
            v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
            p[i] -= (lr / bc1) * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + eps);
        }
    }
};

TEST_F(BackwardFiniteDiff, AdamWMatchesPyTorchFormula) {
    SCOPED_TRACE(trace());
    const int64_t n = 57;
    struct Case {
        float lr, beta1, beta2, eps, weight_decay;
    };
    for (Case c : {Case{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f}, Case{3e-4f, 0.9f, 0.999f, 1e-8f, 0.0f},
                   Case{5e-2f, 0.8f, 0.99f, 1e-6f, 0.5f}}) {
        SCOPED_TRACE("lr " + std::to_string(c.lr) + ", betas " + std::to_string(c.beta1) + "/" +
                     std::to_string(c.beta2) + ", wd " + std::to_string(c.weight_decay));
        auto p = normal(n);
        // As a model steps: elements [0, k) with weight decay, [k, n) in a call without, each
        // call on views of the whole tensors (k odd: a view at an unaligned offset).
        const int64_t k = 19;
        Vec mask(static_cast<size_t>(n), 0.0);
        std::fill(mask.begin(), mask.begin() + k, 1.0);
        Tensor tp = up(p, {n}), tm = be().alloc({n}), tv = be().alloc({n}), tg = be().alloc({n});
        be().fill(tm, 0.0f);
        be().fill(tv, 0.0f);
        const auto part = [](const Tensor& t, int64_t begin, int64_t end) {
            return t.slice(begin, {end - begin});
        };
        AdamWRef want{to_double(p), Vec(static_cast<size_t>(n), 0.0),
                      Vec(static_cast<size_t>(n), 0.0)};
        for (int64_t t = 1; t <= 3; ++t) {
            SCOPED_TRACE("step " + std::to_string(t));
            auto g = normal(n, 0.3);
            g[2] = 0.0f;  // a zero gradient: the moments decay, no NaN
            be().upload(tg, g.data());
            const Backend::AdamWParams hp{c.lr, c.beta1, c.beta2, c.eps, c.weight_decay, t};
            Backend::AdamWParams no_decay = hp;
            no_decay.weight_decay = 0.0f;
            for (const auto& [begin, end, params] :
                 {std::tuple{int64_t{0}, k, hp}, {k, n, no_decay}})
                be().adamw(part(tp, begin, end), part(tg, begin, end), part(tm, begin, end),
                           part(tv, begin, end), params);
            want.step(to_double(g), mask, hp);
            EXPECT_TRUE(RelClose(down(tp), want.p, 1e-6)) << "params";
            EXPECT_TRUE(RelClose(down(tm), want.m, 1e-6)) << "m";
            EXPECT_TRUE(RelClose(down(tv), want.v, 1e-6)) << "v";
        }
    }
}

}  // namespace
}  // namespace tmx

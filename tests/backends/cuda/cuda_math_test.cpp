// The CUDA backend's scalar math (backends/cuda/cuda_math.h), compiled here by g++ so that it
// is tested without a GPU: every activation and derivative against the CPU backend's
// (backends/cpu/cpu_math.h) and against double precision, and the AdamW update against a
// double-precision re-derivation of PyTorch's AdamW and against the CPU backend's adamw.
//
// Error model. The GELU and SiLU functions compute t = exp(-a) in fp32, a = 2u for GELU (u its
// tanh argument), a = x for SiLU. The fp32 argument carries a few roundings, i.e. an absolute
// error of a few u |a| (u = 2^-24, the unit roundoff), which exp turns into a relative error of
// t; so the relative error of a correct implementation grows like u (1 + |a|), and we allow
// kUlps * u * (1 + |a|). The derivatives are sums of two terms that cancel where the
// derivative crosses zero, so their error is taken relative to the larger of the value and
// the first term, s = sigmoid(a). Measured on x86-64 with glibc: at most ~3.3 u (1 + |a|)
// against double, and ~3.3 u (1 + |a|) against the CPU's exp_fast; kUlps = 8 leaves a margin
// of two while a wrong constant (1e-3 relative or more) or a missing term fails by orders of
// magnitude. Device code runs CUDA's expf (2 ulp) instead of glibc's: the GPU op tests cover it.
//
// Clamping. As on the CPU, exp's argument is clamped to [-87, 88] so that e * (1 / (1 + e))
// never forms inf * 0; beyond |a| = 87 results are below 1e-36 in magnitude or exact (x, 1,
// 0), and there the CUDA functions are compared with the CPU's only, which clamp the same way.
#include "backends/cuda/cuda_math.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <iomanip>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "backends/cpu/cpu_math.h"
#include "backends/registry.h"
#include "engine/compute/backend.h"
#include "engine/core/rng.h"
#include "tests/test_util.h"

namespace tmx {
namespace {

constexpr double kUnitRoundoff = 0x1p-24;
constexpr double kUlps = 8.0;
constexpr double kGeluK = 0.79788456080286535588;  // sqrt(2 / pi), independent of the header
constexpr double kGeluC = 0.044715;

using FloatFn = std::function<float(float)>;
using DoubleFn = std::function<double(double)>;

// A dense grid over [-20, 20], step 2^-12: the inputs the model's activations take, finely.
std::vector<float> dense_inputs() {
    std::vector<float> xs;
    for (int i = -20 * 4096; i <= 20 * 4096; ++i) xs.push_back(static_cast<float>(i) / 4096.0f);
    return xs;
}

// The dense grid, magnitudes from 1e-30 to 1e30 on a log scale with both signs, and the special
// values (signed zeros, subnormals, the largest floats, infinities).
std::vector<float> wide_inputs() {
    std::vector<float> xs = dense_inputs();
    for (double m = 1e-30; m < 1e30; m *= 1.07) {
        xs.push_back(static_cast<float>(m));
        xs.push_back(static_cast<float>(-m));
    }
    const float inf = std::numeric_limits<float>::infinity();
    for (float x :
         {0.0f, -0.0f, std::numeric_limits<float>::denorm_min(),
          -std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min(),
          std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(), inf, -inf})
        xs.push_back(x);
    return xs;
}

// exp's argument a (see the error model) of each function, in double.
double gelu_arg(double x) {
    return 2.0 * kGeluK * (x + kGeluC * x * x * x);
}
double silu_arg(double x) {
    return x;
}
double sigmoid(double a) {
    return 1.0 / (1.0 + std::exp(-a));
}

// The functions in double: 0.5 x (1 + tanh u) = x sigmoid(2u) for GELU (the test
// GeluReferenceIsTheTanhForm checks the identity), x sigmoid(x) for SiLU.
double gelu_ref(double x) {
    return x * sigmoid(gelu_arg(x));
}
double silu_ref(double x) {
    return x * sigmoid(x);
}

// Central difference in double: truncation and rounding errors ~1e-10 relative, far below fp32.
double derivative_ref(const DoubleFn& f, double x) {
    const double h = 1e-5 * std::max(1.0, std::abs(x));
    return (f(x + h) - f(x - h)) / (2.0 * h);
}

// Checks got(x) against want(x) for each x: |got - want| <= tol(x) * max(|want|, floor(x)),
// with tol(x) = kUlps u (1 + |arg(x)|) (the error model above). Inf and NaN must match exactly.
// Reports the worst point.
::testing::AssertionResult Close(const std::vector<float>& xs, const FloatFn& got,
                                 const DoubleFn& want, const DoubleFn& arg, const DoubleFn& floor) {
    double worst = 0.0;
    float worst_x = 0.0f;
    for (float x : xs) {
        const double g = got(x), w = want(x);
        if (g == w) continue;  // exact, zeros included (0 / 0 below)
        if (!std::isfinite(w) || !std::isfinite(g)) {
            if (!(std::isnan(g) && std::isnan(w)))
                return ::testing::AssertionFailure()
                       << std::setprecision(9) << "at x = " << x << ": got " << g << ", want " << w;
            continue;
        }
        const double tol = kUlps * kUnitRoundoff * (1.0 + std::abs(arg(x)));
        const double err = std::abs(g - w) / std::max(std::abs(w), floor(x)) / tol;
        if (!(err <= worst)) {
            worst = err;
            worst_x = x;
        }
    }
    if (worst <= 1.0) return ::testing::AssertionSuccess();
    std::ostringstream os;
    os << std::setprecision(9) << "error " << worst << " times the tolerance at x = " << worst_x
       << ": got " << got(worst_x) << ", want " << want(worst_x);
    return ::testing::AssertionFailure() << os.str();
}

double no_floor(double) {
    return 0.0;
}

// The inputs whose exp argument stays clear of the clamp.
std::vector<float> unclamped(const std::vector<float>& xs, double (*arg)(double)) {
    std::vector<float> out;
    for (float x : xs)
        if (std::abs(arg(x)) < 87.0) out.push_back(x);
    return out;
}

TEST(CudaMath, GeluReferenceIsTheTanhForm) {
    for (double x = -6.0; x <= 6.0; x += 1.0 / 64) {
        const double tanh_form = 0.5 * x * (1.0 + std::tanh(kGeluK * (x + kGeluC * x * x * x)));
        EXPECT_NEAR(gelu_ref(x), tanh_form, 1e-14) << "x = " << x;
    }
}

TEST(CudaMath, GeluMatchesDoublePrecision) {
    const auto xs = unclamped(dense_inputs(), gelu_arg);
    EXPECT_TRUE(Close(xs, cuda::gelu_tanh, gelu_ref, gelu_arg, no_floor));
    EXPECT_TRUE(Close(
        xs, cuda::gelu_tanh_derivative, [](double x) { return derivative_ref(gelu_ref, x); },
        gelu_arg, [](double x) { return sigmoid(gelu_arg(x)); }));
}

TEST(CudaMath, SiluMatchesDoublePrecision) {
    const auto xs = unclamped(dense_inputs(), silu_arg);
    EXPECT_TRUE(Close(xs, cuda::silu, silu_ref, silu_arg, no_floor));
    EXPECT_TRUE(Close(
        xs, cuda::silu_derivative, [](double x) { return derivative_ref(silu_ref, x); }, silu_arg,
        sigmoid));
}

// Over every magnitude, inf and NaN included: the same function as the CPU backend's, within
// the rounding of exp, where clamped too. The error allowed is that of an argument at the
// clamp (|a| = 88) at most.
TEST(CudaMath, ActivationsMatchCpuMath) {
    const auto xs = wide_inputs();
    auto clamped = [](double (*arg)(double)) {
        return [arg](double x) { return std::min(std::abs(arg(x)), 88.0); };
    };
    auto s_gelu = [](double x) { return sigmoid(std::clamp(gelu_arg(x), -88.0, 87.0)); };
    auto s_silu = [](double x) { return sigmoid(std::clamp(x, -88.0, 87.0)); };
    EXPECT_TRUE(Close(xs, cuda::gelu_tanh, cpu::gelu_tanh, clamped(gelu_arg), no_floor));
    EXPECT_TRUE(Close(xs, cuda::gelu_tanh_derivative, cpu::gelu_tanh_derivative, clamped(gelu_arg),
                      s_gelu));
    EXPECT_TRUE(Close(xs, cuda::silu, cpu::silu, clamped(silu_arg), no_floor));
    EXPECT_TRUE(Close(xs, cuda::silu_derivative, cpu::silu_derivative, clamped(silu_arg), s_silu));
    // The relu family is exact.
    for (float x : xs) {
        EXPECT_EQ(cuda::relu(x), cpu::relu(x)) << "x = " << x;
        EXPECT_EQ(cuda::relu_derivative(x), cpu::relu_derivative(x)) << "x = " << x;
        EXPECT_EQ(cuda::relu2(x), cpu::relu2(x)) << "x = " << x;
        EXPECT_EQ(cuda::relu2_derivative(x), cpu::relu2_derivative(x)) << "x = " << x;
    }
}

TEST(CudaMath, ActivationsPropagateNan) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    EXPECT_TRUE(std::isnan(cuda::gelu_tanh(nan)));
    EXPECT_TRUE(std::isnan(cuda::gelu_tanh_derivative(nan)));
    EXPECT_TRUE(std::isnan(cuda::silu(nan)));
    EXPECT_TRUE(std::isnan(cuda::silu_derivative(nan)));
}

// Large |x| gives the limits without inf * 0 = NaN (the reason exp's argument is clamped):
// gelu(x) = x and gelu'(x) = 1 once sigmoid rounds to 1, and both are ~0 for large negative x
// (not exactly 0: the clamp leaves e^-87 in place of smaller values); silu likewise.
TEST(CudaMath, ActivationsSaturateWithoutNan) {
    for (float x : {20.0f, 100.0f, 1e4f, 1e8f}) {
        SCOPED_TRACE("x = " + std::to_string(x));
        EXPECT_EQ(cuda::gelu_tanh(x), x);
        EXPECT_EQ(cuda::gelu_tanh_derivative(x), 1.0f);
        EXPECT_EQ(cuda::silu(x), x);
        EXPECT_EQ(cuda::silu_derivative(x), 1.0f);
        for (float y : {cuda::gelu_tanh(-x), cuda::gelu_tanh_derivative(-x), cuda::silu(-x),
                        cuda::silu_derivative(-x)}) {
            EXPECT_FALSE(std::isnan(y));
            EXPECT_LE(std::abs(y), 1e-6f);
        }
    }
}

TEST(CudaMath, ReluFamilyValuesAndKinks) {
    EXPECT_EQ(cuda::relu(-2.0f), 0.0f);
    EXPECT_EQ(cuda::relu(3.5f), 3.5f);
    EXPECT_EQ(cuda::relu2(-2.0f), 0.0f);
    EXPECT_EQ(cuda::relu2(3.0f), 9.0f);
    EXPECT_EQ(cuda::relu_derivative(-1.0f), 0.0f);
    EXPECT_EQ(cuda::relu_derivative(1e-30f), 1.0f);
    EXPECT_EQ(cuda::relu2_derivative(3.0f), 6.0f);
    // At the kink, the derivative is 0 (the CPU's convention: x > 0).
    EXPECT_EQ(cuda::relu_derivative(0.0f), 0.0f);
    EXPECT_EQ(cuda::relu2_derivative(0.0f), 0.0f);
    EXPECT_EQ(cuda::relu_derivative(-0.0f), 0.0f);
}

TEST(CudaMath, ActivationFnDispatchesToEachFunction) {
    for (float x : {-3.0f, -0.5f, 0.0f, 0.7f, 4.0f}) {
        EXPECT_EQ(cuda::ActivationFn<Activation::Gelu>::value(x), cuda::gelu_tanh(x));
        EXPECT_EQ(cuda::ActivationFn<Activation::Gelu>::derivative(x),
                  cuda::gelu_tanh_derivative(x));
        EXPECT_EQ(cuda::ActivationFn<Activation::Silu>::value(x), cuda::silu(x));
        EXPECT_EQ(cuda::ActivationFn<Activation::Silu>::derivative(x), cuda::silu_derivative(x));
        EXPECT_EQ(cuda::ActivationFn<Activation::Relu>::value(x), cuda::relu(x));
        EXPECT_EQ(cuda::ActivationFn<Activation::Relu>::derivative(x), cuda::relu_derivative(x));
        EXPECT_EQ(cuda::ActivationFn<Activation::Relu2>::value(x), cuda::relu2(x));
        EXPECT_EQ(cuda::ActivationFn<Activation::Relu2>::derivative(x), cuda::relu2_derivative(x));
    }
}

// ---------------------------------------------------------------- AdamW

struct AdamWCase {
    float lr, beta1, beta2, eps, weight_decay;
};

const AdamWCase kAdamWCases[] = {
    {1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f},
    {3e-4f, 0.9f, 0.999f, 1e-8f, 0.0f},
    {5e-2f, 0.8f, 0.99f, 1e-6f, 0.5f},
};

std::string describe(const AdamWCase& c) {
    std::ostringstream os;
    os << "lr " << c.lr << ", betas " << c.beta1 << "/" << c.beta2 << ", eps " << c.eps << ", wd "
       << c.weight_decay;
    return os.str();
}

// PyTorch's AdamW (torch.optim.AdamW, single-tensor path) in double, on the fp32 inputs and
// hyperparameters:
//   p *= 1 - lr * wd;  m = lerp(m, g, 1 - beta1);  v = beta2 v + (1 - beta2) g^2;
//   p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// with the decay applied where mask is 1 (a model steps those elements with weight_decay and the
// others with 0).
struct AdamWRef {
    std::vector<double> p, m, v;
    void step(const std::vector<float>& g, const std::vector<float>& mask, const AdamWCase& c,
              int64_t t) {
        const double lr = c.lr, b1 = c.beta1, b2 = c.beta2, eps = c.eps, wd = c.weight_decay;
        const double bc1 = 1.0 - std::pow(b1, static_cast<double>(t));
        const double bc2 = 1.0 - std::pow(b2, static_cast<double>(t));
        for (size_t i = 0; i < p.size(); ++i) {
            p[i] *= 1.0 - lr * wd * mask[i];
            m[i] += (1.0 - b1) * (g[i] - m[i]);
            v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
            p[i] -= lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + eps);
        }
    }
};

// max_i |got_i - want_i| / max_i |want_i| <= tol.
::testing::AssertionResult VecClose(const std::vector<float>& got, const std::vector<double>& want,
                                    double tol) {
    double scale = 0.0, worst = 0.0;
    size_t at = 0;
    for (double w : want) scale = std::max(scale, std::abs(w));
    if (scale == 0.0) scale = 1.0;
    for (size_t i = 0; i < got.size(); ++i) {
        const double err = std::abs(got[i] - want[i]);
        if (!(err <= worst)) {
            worst = err;
            at = i;
        }
    }
    if (worst / scale <= tol) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << std::setprecision(9) << "relative error " << worst / scale << " > " << tol
           << " at element " << at << ": got " << got[at] << ", want " << want[at];
}

// |got_i - want_i| <= 4 u |want_i| for every i.
::testing::AssertionResult UlpClose(const std::vector<float>& got, const std::vector<float>& want) {
    for (size_t i = 0; i < got.size(); ++i) {
        const double err = std::abs(static_cast<double>(got[i]) - want[i]);
        if (!(err <= 4 * kUnitRoundoff * std::abs(want[i])))
            return ::testing::AssertionFailure() << std::setprecision(9) << "element " << i
                                                 << ": got " << got[i] << ", want " << want[i];
    }
    return ::testing::AssertionSuccess();
}

TEST(CudaMath, AdamWCoefficientsInDouble) {
    for (const AdamWCase& c : kAdamWCases) {
        SCOPED_TRACE(describe(c));
        // step 1, where 1 - beta2 is all there is, to far steps where beta^t underflows to 0.
        for (int64_t t : {int64_t{1}, int64_t{2}, int64_t{10}, int64_t{1000}, int64_t{1000000},
                          int64_t{1} << 40}) {
            SCOPED_TRACE("step " + std::to_string(t));
            const cuda::AdamWCoefficients k =
                cuda::adamw_coefficients(c.lr, c.beta1, c.beta2, c.eps, c.weight_decay, t);
            const double bc1 = 1.0 - std::pow(static_cast<double>(c.beta1), t);
            const double bc2 = 1.0 - std::pow(static_cast<double>(c.beta2), t);
            EXPECT_EQ(k.beta1, c.beta1);
            EXPECT_EQ(k.beta2, c.beta2);
            EXPECT_EQ(k.eps, c.eps);
            EXPECT_EQ(k.decay, c.lr * c.weight_decay);
            EXPECT_EQ(k.step_size, static_cast<float>(c.lr / bc1));
            EXPECT_EQ(k.bc2_sqrt, static_cast<float>(std::sqrt(bc2)));
        }
    }
}

class CudaMathAdamW : public ::testing::Test {
  protected:
    CudaMathAdamW() : seed_(test::fresh_seed()), rng_(seed_) {}
    std::string trace() const { return "seed " + std::to_string(seed_); }

    uint64_t seed_;
    Rng rng_;
};

// Several steps of the update from zero moments, over parameters with and without decay, one
// gradient that stays zero (moments decay, no 0/0) and one that changes sign.
TEST_F(CudaMathAdamW, UpdateMatchesPyTorchInDouble) {
    SCOPED_TRACE(trace());
    const size_t n = 257;
    for (const AdamWCase& c : kAdamWCases) {
        SCOPED_TRACE(describe(c));
        std::vector<float> p = test::random_normal(rng_, n), m(n, 0.0f), v(n, 0.0f), mask(n);
        const auto bits = test::random_ints(rng_, n, 0, 2);
        for (size_t i = 0; i < n; ++i) mask[i] = static_cast<float>(bits[i]);
        mask[0] = 1.0f;
        mask[1] = 0.0f;
        AdamWRef want{std::vector<double>(p.begin(), p.end()), std::vector<double>(n, 0.0),
                      std::vector<double>(n, 0.0)};
        for (int64_t t = 1; t <= 5; ++t) {
            SCOPED_TRACE("step " + std::to_string(t));
            std::vector<float> g = test::random_normal(rng_, n, 0.3);
            g[2] = 0.0f;
            g[3] = t % 2 ? 0.5f : -0.5f;
            const cuda::AdamWCoefficients decayed =
                cuda::adamw_coefficients(c.lr, c.beta1, c.beta2, c.eps, c.weight_decay, t);
            const cuda::AdamWCoefficients plain =
                cuda::adamw_coefficients(c.lr, c.beta1, c.beta2, c.eps, 0.0f, t);
            for (size_t i = 0; i < n; ++i)
                cuda::adamw_update(p[i], m[i], v[i], g[i], mask[i] ? decayed : plain);
            want.step(g, mask, c, t);
            EXPECT_TRUE(VecClose(p, want.p, 1e-6)) << "params";
            EXPECT_TRUE(VecClose(m, want.m, 1e-6)) << "m";
            EXPECT_TRUE(VecClose(v, want.v, 1e-6)) << "v";
            EXPECT_EQ(m[2], 0.0f);
            EXPECT_EQ(v[2], 0.0f);
        }
    }
}

// The shared update is the CPU backend's adamw, element for element (same formula, same
// float operations; allowing for the compiler's FMA contraction, which may differ between the
// two loops).
TEST_F(CudaMathAdamW, UpdateMatchesCpuBackend) {
    SCOPED_TRACE(trace());
    const int64_t n = 1000;
    const size_t un = static_cast<size_t>(n);
    std::unique_ptr<Backend> cpu = make_backend("cpu");
    for (const AdamWCase& c : kAdamWCases) {
        SCOPED_TRACE(describe(c));
        std::vector<float> p = test::random_normal(rng_, un), m(un, 0.0f), v(un, 0.0f);
        Tensor tp = cpu->alloc({n}), tg = cpu->alloc({n}), tm = cpu->alloc({n}),
               tv = cpu->alloc({n});
        cpu->upload(tp, p.data());
        cpu->fill(tm, 0.0f);
        cpu->fill(tv, 0.0f);
        for (int64_t t = 1; t <= 4; ++t) {
            SCOPED_TRACE("step " + std::to_string(t));
            const std::vector<float> g = test::random_normal(rng_, un, 0.3);
            cpu->upload(tg, g.data());
            cpu->adamw(tp, tg, tm, tv, {c.lr, c.beta1, c.beta2, c.eps, c.weight_decay, t});
            const cuda::AdamWCoefficients k =
                cuda::adamw_coefficients(c.lr, c.beta1, c.beta2, c.eps, c.weight_decay, t);
            for (size_t i = 0; i < un; ++i) cuda::adamw_update(p[i], m[i], v[i], g[i], k);
            std::vector<float> cp(un), cm(un), cv(un);
            cpu->download(tp, cp.data());
            cpu->download(tm, cm.data());
            cpu->download(tv, cv.data());
            // Each value within a few ulp of the CPU's: the backends' results never drift apart.
            EXPECT_TRUE(UlpClose(p, cp)) << "params";
            EXPECT_TRUE(UlpClose(m, cm)) << "m";
            EXPECT_TRUE(UlpClose(v, cv)) << "v";
        }
    }
}

}  // namespace
}  // namespace tmx

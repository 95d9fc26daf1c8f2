// The forward ops of every backend against the double-precision reference (reference_ops.h),
// on random inputs of awkward sizes. The suite is parameterised by backend name: a new
// backend joins by registering itself (backends/registry.h), which lists it in backend_names().
//
// Each test draws a fresh seed (printed on failure; TMX_TEST_SEED=<seed> replays it).
// Outputs an op overwrites are poisoned first (NaN for F32, a negative sentinel for I32), so an
// element the op forgets to write shows up as a failure.
//
// Tolerances. Results are compared as max|out - ref| / max(1, max|ref|): relative to the
// output's scale, absolute for outputs below 1. fp32 has unit roundoff u = 2^-24 ~ 6e-8, so
// elementwise ops (a few correctly or nearly correctly rounded operations, exp/tanh/sin within
// a few ulp) stay below ~1e-6; we allow 1e-5. An output that reduces over L terms (a dot
// product, a softmax denominator, a norm's statistics) carries a rounding error that grows
// with L: about sqrt(L)*u on random data, L*u in the worst case, and differently ordered
// sums (blocked BLAS, GPU tree reductions) land anywhere in between. reduction_tol(L) allows
// max(1e-5, 2e-7 * L), i.e. ~3 L u: generous for any correct fp32 summation order, still
// orders of magnitude below what a wrong index, a missed term or a wrong scale produces
// (errors of order 1e-2 .. 1).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iomanip>
#include <limits>
#include <memory>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/registry.h"
#include "engine/compute/backend.h"
#include "engine/core/errors.h"
#include "engine/model/config.h"  // to_string(Activation)
#include "tests/backends/matmul_cases.h"
#include "tests/backends/reference_ops.h"
#include "tests/backends/tensor_io.h"
#include "tests/test_util.h"
#ifdef TMX_HAS_VULKAN
#include "backends/vulkan/vulkan_backend.h"
#endif

namespace tmx {
namespace {

using ref::Ids;
using ref::Vec;
using test::for_each_matmul_variant;
using test::MatmulVariant;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr double kElementwiseTol = 1e-5;

double reduction_tol(int64_t length) {
    return std::max(1e-5, 2e-7 * static_cast<double>(length));
}

// out (from the backend) against want (the reference), as described at the top of the file.
::testing::AssertionResult Close(const std::vector<float>& out, const Vec& want, double tol) {
    if (out.size() != want.size())
        return ::testing::AssertionFailure()
               << "size " << out.size() << " vs reference " << want.size();
    double scale = 1.0;
    for (double w : want) scale = std::max(scale, std::abs(w));
    double worst = 0.0;
    size_t at = 0;
    for (size_t i = 0; i < out.size(); ++i) {
        if (!std::isfinite(out[i]))
            return ::testing::AssertionFailure()
                   << "element " << i << " is " << out[i] << " (reference " << want[i]
                   << "): not written, or overflowed";
        double err = std::abs(static_cast<double>(out[i]) - want[i]);
        if (err > worst) {
            worst = err;
            at = i;
        }
    }
    double rel = worst / scale;
    if (rel <= tol) return ::testing::AssertionSuccess();
    std::ostringstream os;
    os << std::setprecision(9) << "relative error " << rel << " > " << tol << "; worst element "
       << at << ": got " << out[at] << ", reference " << want[at] << " (scale " << scale << ")";
    return ::testing::AssertionFailure() << os.str();
}

std::string dims(std::initializer_list<int64_t> d) {
    std::string s;
    for (int64_t x : d) s += (s.empty() ? "" : "x") + std::to_string(x);
    return s;
}

class OpTest : public ::testing::TestWithParam<std::string>, protected test::OneBackendIo {
  protected:
    OpTest() : seed_(test::fresh_seed()), rng_(seed_) {}

    // A backend compiled in but without a device on this machine (Vulkan with no driver)
    // skips its tests, saying why.
    void SetUp() override {
        try {
#ifdef TMX_HAS_VULKAN
            // The portable fp32 path, which the fp32 tolerances below hold for: fp16 weights
            // (Vulkan's default where the device allows) are tested in vulkan_fp16_test.cpp.
            if (GetParam() == "vulkan")
                backend_ = make_vulkan_backend({.fp16_weights = false});
            else
#endif
                backend_ = make_backend(GetParam());
        } catch (const Error& e) {
            TMX_SKIP_UNAVAILABLE(GetParam(), e.what());
        }
    }

    std::string trace() const {
        return "backend " + GetParam() + ", seed " + std::to_string(seed_) +
               " (replay with TMX_TEST_SEED=" + std::to_string(seed_) + ")";
    }

    Backend& be() override {
        return *backend_;
    }

    std::vector<float> normal(size_t n, double scale = 1.0) {
        return test::random_normal(rng_, n, scale);
    }
    Ids ints(size_t n, int32_t lo, int32_t hi) {
        return test::random_ints(rng_, n, lo, hi);
    }

    // Per-token expert choices as the router makes them: k distinct experts per row.
    Ids random_choices(int64_t N, int64_t E, int64_t k) {
        return ref::router_topk(ref::to_double(normal(static_cast<size_t>(N * E))), N, E, k)
            .indices;
    }

    uint64_t seed_;
    Rng rng_;
    std::unique_ptr<Backend> backend_;
};

// ---------------------------------------------------------------- gather_rows (the embedding)

TEST_P(OpTest, GatherRows) {
    SCOPED_TRACE(trace());
    struct Case {
        int64_t N, d, S;
    };
    // Embedding-like shapes (a table of N rows, S tokens) and MoE-like ones (more slots than
    // rows): rows repeat in both.
    for (Case c : {Case{1, 1, 1}, Case{1, 17, 5}, Case{17, 3, 33}, Case{65, 33, 17},
                   Case{65, 33, 130}, Case{1000, 64, 65}}) {
        SCOPED_TRACE("N,d,S = " + dims({c.N, c.d, c.S}));
        auto x = normal(c.N * c.d);
        Ids rows = ints(c.S, 0, static_cast<int32_t>(c.N));  // with repeats
        rows[0] = static_cast<int32_t>(c.N - 1);             // the last row is reachable
        Tensor out = poisoned({c.S, c.d});
        be().gather_rows(up(x, {c.N, c.d}), up_ids(rows, {c.S}), out);
        // A copy: exact.
        EXPECT_TRUE(Close(down(out), ref::gather_rows(ref::to_double(x), c.N, c.d, rows), 0.0));
    }
}

TEST_P(OpTest, GatherRowsRejectsOutOfRangeRows) {
    SCOPED_TRACE(trace());
    const int64_t N = 7, d = 5;
    Tensor x = up(normal(N * d), {N, d});
    for (int32_t bad : {static_cast<int32_t>(N), -1, 1 << 30}) {
        SCOPED_TRACE("row " + std::to_string(bad));
        Tensor rows = up_ids({0, bad, 3}, {3});
        Tensor out = be().alloc({3, d});
        EXPECT_THROW(
            {
                be().gather_rows(x, rows, out);
                be().synchronize();
            },
            std::exception);
    }
}

// ---------------------------------------------------------------- norms

TEST_P(OpTest, LayerNorm) {
    SCOPED_TRACE(trace());
    struct Case {
        int64_t N, d;
    };
    for (Case c : {Case{1, 1}, Case{3, 17}, Case{17, 33}, Case{33, 65}, Case{5, 512}}) {
        SCOPED_TRACE("N,d = " + dims({c.N, c.d}));
        auto x = normal(c.N * c.d, 2.0), w = normal(c.d), b = normal(c.d);
        for (auto& v : w) v += 1.0f;
        const float eps = 1e-5f;
        Tensor out = poisoned({c.N, c.d});
        be().norm(NormType::LayerNorm, up(x, {c.N, c.d}), up(w, {c.d}), up(b, {c.d}), eps, out);
        auto want =
            ref::layernorm(ref::to_double(x), c.N, c.d, ref::to_double(w), ref::to_double(b), eps);
        EXPECT_TRUE(Close(down(out), want, reduction_tol(c.d)));
    }
}

TEST_P(OpTest, RmsNorm) {
    SCOPED_TRACE(trace());
    struct Case {
        int64_t N, d;
    };
    for (Case c : {Case{1, 1}, Case{3, 17}, Case{17, 33}, Case{33, 65}, Case{5, 512}}) {
        SCOPED_TRACE("N,d = " + dims({c.N, c.d}));
        auto x = normal(c.N * c.d, 2.0), w = normal(c.d);
        for (auto& v : w) v += 1.0f;
        const float eps = 1e-6f;
        Tensor out = poisoned({c.N, c.d});
        // rmsnorm takes no bias: an undefined tensor.
        be().norm(NormType::RmsNorm, up(x, {c.N, c.d}), up(w, {c.d}), Tensor{}, eps, out);
        auto want = ref::rmsnorm(ref::to_double(x), c.N, c.d, ref::to_double(w), eps);
        EXPECT_TRUE(Close(down(out), want, reduction_tol(c.d)));
    }
}

// Rows of the form 1000 + N(0, 1): a variance computed as E[x^2] - E[x]^2 in fp32 loses almost
// every digit (E[x^2] ~ 1e6 has spacing 0.06 against a variance of 1). The inputs' own spacing
// is ulp(1000) ~ 6e-5, so even a careful fp32 backend that holds the mean as a float is off by
// up to ~3e-5 of the unit spread: the tolerance here is 1e-4 instead of 1e-5.
TEST_P(OpTest, NormsAreStableUnderLargeMean) {
    SCOPED_TRACE(trace());
    struct Case {
        int64_t N, d;
    };
    for (Case c : {Case{3, 17}, Case{17, 64}, Case{4, 515}}) {
        SCOPED_TRACE("N,d = " + dims({c.N, c.d}));
        auto x = normal(c.N * c.d), w = normal(c.d), b = normal(c.d);
        for (auto& v : x) v += 1000.0f;
        for (auto& v : w) v += 1.0f;
        const float eps = 1e-5f;
        Tensor xt = up(x, {c.N, c.d}), wt = up(w, {c.d});
        Tensor out = poisoned({c.N, c.d});
        be().norm(NormType::LayerNorm, xt, wt, up(b, {c.d}), eps, out);
        EXPECT_TRUE(Close(
            down(out),
            ref::layernorm(ref::to_double(x), c.N, c.d, ref::to_double(w), ref::to_double(b), eps),
            1e-4))
            << "layernorm";
        out = poisoned({c.N, c.d});
        be().norm(NormType::RmsNorm, xt, wt, Tensor{}, eps, out);
        EXPECT_TRUE(Close(down(out),
                          ref::rmsnorm(ref::to_double(x), c.N, c.d, ref::to_double(w), eps),
                          reduction_tol(c.d)))
            << "rmsnorm";
    }
}

// ---------------------------------------------------------------- matmul

TEST_P(OpTest, Matmul) {
    SCOPED_TRACE(trace());
    for_each_matmul_variant(
        {{1, 1, 1},
         {1, 65, 33},
         {3, 17, 33},
         {17, 3, 65},
         {33, 65, 17},
         {65, 33, 3},
         {64, 64, 64},
         {130, 7, 257},
         {2, 300, 129},
         {16, 37, 130},   // the CPU's few-rows path at its largest row count
         {9, 521, 515}},  // the same with its threads (a weight matrix of 1 MB or more)
        [&](const MatmulVariant& v) {
            auto a = normal(v.M * v.K), b = normal(v.K * v.N);
            auto bias = normal(v.N), init = normal(v.M * v.N);
            Tensor at = up(a, v.trans_a ? Shape{v.K, v.M} : Shape{v.M, v.K});
            Tensor bt = up(b, v.trans_b ? Shape{v.N, v.K} : Shape{v.K, v.N});
            Tensor out = v.accumulate ? up(init, {v.M, v.N}) : poisoned({v.M, v.N});
            be().matmul(at, bt, out,
                        {.trans_a = v.trans_a, .trans_b = v.trans_b, .accumulate = v.accumulate},
                        v.bias ? up(bias, {v.N}) : Tensor{});
            Vec bias_d = ref::to_double(bias), init_d = ref::to_double(init);
            auto want = ref::matmul(ref::to_double(a), ref::to_double(b), v.M, v.N, v.K, v.trans_a,
                                    v.trans_b, v.bias ? &bias_d : nullptr,
                                    v.accumulate ? &init_d : nullptr);
            EXPECT_TRUE(Close(down(out), want, reduction_tol(v.K)));
        });
}

// linear(x, w, b, y) is matmul(x, w, y, {.trans_b = true}, b): with and without a bias,
// overwriting and accumulating; decode-sized and tiled row counts. A bias may be a view at an
// odd element of the flat parameters (a GPU must not load it as if it were 16-byte aligned).
TEST_P(OpTest, Linear) {
    SCOPED_TRACE(trace());
    struct Case {
        int64_t N, out_f, in_f;
    };
    enum class Bias { None, Fresh, OddView };
    for (const Case& c : {Case{1, 65, 33}, Case{3, 17, 257}, Case{130, 70, 65}}) {
        const int64_t N = c.N, out_f = c.out_f, in_f = c.in_f;
        for (Bias bias : {Bias::None, Bias::Fresh, Bias::OddView})
            for (bool acc : {false, true}) {
                SCOPED_TRACE("N,out,in " + std::to_string(N) + "," + std::to_string(out_f) + "," +
                             std::to_string(in_f) + " bias " +
                             std::to_string(static_cast<int>(bias)) + " accumulate " +
                             std::to_string(acc));
                auto x = normal(N * in_f), w = normal(out_f * in_f), b = normal(out_f + 1);
                auto init = normal(N * out_f);
                Tensor y = acc ? up(init, {N, out_f}) : poisoned({N, out_f});
                const Tensor b_t = bias == Bias::Fresh
                                       ? up(std::vector<float>(b.begin() + 1, b.end()), {out_f})
                                   : bias == Bias::OddView ? up(b, {out_f + 1}).slice(1, {out_f})
                                                           : Tensor{};
                b.erase(b.begin());  // the bias's values, either way
                be().linear(up(x, {N, in_f}), up(w, {out_f, in_f}), b_t, y, acc);
                Vec b_d = ref::to_double(b), init_d = ref::to_double(init);
                auto want =
                    ref::matmul(ref::to_double(x), ref::to_double(w), N, out_f, in_f, false, true,
                                bias != Bias::None ? &b_d : nullptr, acc ? &init_d : nullptr);
                EXPECT_TRUE(Close(down(y), want, reduction_tol(in_f)));
            }
    }
}

// Ops read and write through views (tensor offsets into a shared buffer), as the engine's
// per-expert and per-layer views do; elements outside the view stay untouched.
TEST_P(OpTest, OpsHonourViews) {
    SCOPED_TRACE(trace());
    const int64_t M = 5, N = 7, K = 3;
    auto pool = normal(200);
    Tensor buf = up(pool, {200});
    Tensor a = buf.slice(3, {M, K});     // elements [3, 18)
    Tensor b = buf.slice(18, {K, N});    // [18, 39)
    Tensor out = buf.slice(41, {M, N});  // [41, 76)
    be().matmul(a, b, out);
    auto after = down(buf);
    Vec pool_d = ref::to_double(pool);
    auto want = ref::matmul(Vec(pool_d.begin() + 3, pool_d.begin() + 18),
                            Vec(pool_d.begin() + 18, pool_d.begin() + 39), M, N, K, false, false);
    EXPECT_TRUE(
        Close(std::vector<float>(after.begin() + 41, after.begin() + 76), want, reduction_tol(K)));
    for (int64_t i = 0; i < 200; ++i)
        if (i < 41 || i >= 76) {
            EXPECT_EQ(after[i], pool[i]) << "element " << i << " changed";
        }

    // Rows gathered into rows [2, 4) of a larger matrix.
    const int64_t V = 4, d = 6;
    auto table = normal(V * d), big = normal(6 * d);
    Tensor big_t = up(big, {6, d});
    be().gather_rows(up(table, {V, d}), up_ids({3, 1}, {2}), big_t.rows(2, 4));
    auto got = down(big_t);
    for (int64_t r = 0; r < 6; ++r)
        for (int64_t c = 0; c < d; ++c) {
            float want_v = r == 2 ? table[3 * d + c] : r == 3 ? table[1 * d + c] : big[r * d + c];
            EXPECT_EQ(got[r * d + c], want_v) << "row " << r << " col " << c;
        }
}

// ---------------------------------------------------------------- rope

TEST_P(OpTest, Rope) {
    SCOPED_TRACE(trace());
    struct Case {
        int64_t N, H, hd;
    };
    struct Positions {
        int32_t lo, hi;
    };
    for (Case c : {Case{1, 1, 2}, Case{3, 2, 8}, Case{17, 3, 64}, Case{33, 4, 18}, Case{5, 1, 128}})
        for (Positions p : {Positions{0, 64}, Positions{10000, 10100}, Positions{60000, 1 << 20}})
            for (double theta : {10000.0, 1e6}) {
                SCOPED_TRACE("N,H,hd = " + dims({c.N, c.H, c.hd}) + " positions [" +
                             std::to_string(p.lo) + ", " + std::to_string(p.hi) + ") theta " +
                             std::to_string(theta));
                auto x = normal(c.N * c.H * c.hd);
                Ids pos = ints(c.N, p.lo, p.hi);
                Tensor xt = up(x, {c.N, c.H, c.hd});
                be().rope(xt, up_ids(pos, {c.N}), theta);
                auto want = ref::rope(ref::to_double(x), c.N, c.H, c.hd, pos, theta);
                // Elementwise, but the angle pos * freq must be formed in more than fp32 at
                // large positions (ulp(1e5) ~ 0.008 rad): a 1e-5 bound catches that.
                EXPECT_TRUE(Close(down(xt), want, kElementwiseTol));
            }
}

TEST_P(OpTest, RopeAtPositionZeroIsIdentity) {
    SCOPED_TRACE(trace());
    const int64_t N = 3, H = 2, hd = 16;
    auto x = normal(N * H * hd);
    Tensor xt = up(x, {N, H, hd});
    be().rope(xt, up_ids({0, 0, 0}, {N}), 10000.0);
    EXPECT_EQ(down(xt), x);
}

// ---------------------------------------------------------------- attention

TEST_P(OpTest, Attention) {
    SCOPED_TRACE(trace());
    struct Case {
        int64_t B, T, H, Hkv, hd, window;
    };
    const Case cases[] = {
        {1, 1, 1, 1, 8, 0},      // T = 1
        {2, 1, 4, 1, 16, 1},     // T = 1, window 1, group 4
        {1, 17, 1, 1, 8, 0},     // unlimited window
        {2, 17, 4, 2, 16, 0},    // B > 1, group 2
        {1, 33, 4, 4, 8, 1},     // window 1: each query sees itself only
        {2, 33, 8, 2, 16, 5},    // window < T, group 4
        {1, 17, 2, 1, 32, 17},   // window = T
        {3, 17, 4, 1, 64, 100},  // window > T
        {1, 65, 6, 3, 24, 16},   // group 2, odd-ish head_dim
        {2, 65, 3, 3, 6, 64},    // window = T - 1
    };
    for (Case c : cases) {
        SCOPED_TRACE("B,T,H,Hkv,hd,window = " + dims({c.B, c.T, c.H, c.Hkv, c.hd, c.window}));
        auto q = normal(c.B * c.T * c.H * c.hd, 1.5);
        auto k = normal(c.B * c.T * c.Hkv * c.hd, 1.5);
        auto v = normal(c.B * c.T * c.Hkv * c.hd);
        Tensor qt = up(q, {c.B, c.T, c.H, c.hd});
        Tensor kt = up(k, {c.B, c.T, c.Hkv, c.hd});
        Tensor vt = up(v, {c.B, c.T, c.Hkv, c.hd});
        Tensor out = poisoned({c.B, c.T, c.H, c.hd});
        be().attention(qt, kt, vt, out, c.window);
        auto want = ref::attention(ref::to_double(q), ref::to_double(k), ref::to_double(v), c.B,
                                   c.T, c.H, c.Hkv, c.hd, c.window);
        auto got = down(out);
        EXPECT_TRUE(Close(got, want, reduction_tol(std::max(c.hd, c.T))));

        if (c.window == 1) {  // the softmax over one key is 1: out_i = v_i of its kv head
            Vec v_of_query(got.size());
            for (int64_t b = 0; b < c.B; ++b)
                for (int64_t t = 0; t < c.T; ++t)
                    for (int64_t h = 0; h < c.H; ++h)
                        for (int64_t d = 0; d < c.hd; ++d)
                            v_of_query[((b * c.T + t) * c.H + h) * c.hd + d] =
                                v[((b * c.T + t) * c.Hkv + h / (c.H / c.Hkv)) * c.hd + d];
            EXPECT_TRUE(Close(got, v_of_query, kElementwiseTol)) << "window 1";
        }
        if (c.window >= c.T) {  // a window covering the sequence is no window
            Tensor full = poisoned({c.B, c.T, c.H, c.hd});
            be().attention(qt, kt, vt, full, 0);
            EXPECT_TRUE(Close(down(full), ref::to_double(got), kElementwiseTol))
                << "window >= T differs from window 0";
        }
    }
}

// Attention of a chunk against a rolling KV cache: each sequence gets a random history of
// start[b] + T positions; the cache holds what the contract says it holds (other slots NaN, so
// reading one fails), the chunk brings the rest; the result must equal plain attention over the
// whole history, for the chunk's queries. Then kv_cache_write must put the chunk in its slots.
TEST_P(OpTest, AttentionCachedAndKvCacheWrite) {
    SCOPED_TRACE(trace());
    struct Case {
        int64_t T, H, Hkv, hd, window, S;
        std::vector<int32_t> start;  // one per sequence
    };
    const Case cases[] = {
        {1, 4, 2, 8, 8, 8, {0}},           // decode, empty cache
        {1, 4, 2, 8, 8, 8, {5}},           // decode, partly filled
        {1, 8, 2, 16, 8, 8, {21}},         // decode, wrapped buffer
        {1, 4, 1, 8, 8, 8, {0, 7, 30}},    // batch of different fills, group 4
        {4, 4, 2, 8, 8, 8, {2, 13}},       // chunk of W/2
        {8, 6, 3, 24, 8, 8, {16, 3, 0}},   // chunk of W, odd head_dim
        {5, 4, 2, 8, 0, 32, {0, 10, 27}},  // full attention: cache of max_seq_len
        {3, 2, 1, 16, 5, 16, {20}},        // window shorter than the cache
        {6, 2, 2, 8, 4, 4, {9}},           // chunk longer than the cache
        {3, 4, 2, 8, 8, 7, {11, 1}},       // W - 1 slots are enough
    };
    for (const Case& c : cases) {
        const int64_t B = static_cast<int64_t>(c.start.size()), row = c.Hkv * c.hd;
        const int64_t qrow = c.H * c.hd;
        SCOPED_TRACE("T,H,Hkv,hd,window,S = " + dims({c.T, c.H, c.Hkv, c.hd, c.window, c.S}) +
                     ", B = " + std::to_string(B));
        std::vector<float> q(B * c.T * qrow), k(B * c.T * row), v(B * c.T * row);
        std::vector<float> kc(B * c.S * row, kNaN), vc(B * c.S * row, kNaN);
        Vec want;
        for (int64_t b = 0; b < B; ++b) {
            const int64_t L = c.start[b] + c.T;
            const std::vector<float> qh = normal(L * qrow, 1.5), kh = normal(L * row, 1.5),
                                     vh = normal(L * row);
            for (int64_t p = std::max<int64_t>(0, c.start[b] - c.S); p < c.start[b]; ++p) {
                std::copy_n(kh.begin() + p * row, row, kc.begin() + (b * c.S + p % c.S) * row);
                std::copy_n(vh.begin() + p * row, row, vc.begin() + (b * c.S + p % c.S) * row);
            }
            std::copy_n(qh.end() - c.T * qrow, c.T * qrow, q.begin() + b * c.T * qrow);
            std::copy_n(kh.end() - c.T * row, c.T * row, k.begin() + b * c.T * row);
            std::copy_n(vh.end() - c.T * row, c.T * row, v.begin() + b * c.T * row);
            const Vec all = ref::attention(ref::to_double(qh), ref::to_double(kh),
                                           ref::to_double(vh), 1, L, c.H, c.Hkv, c.hd, c.window);
            want.insert(want.end(), all.end() - c.T * qrow, all.end());
        }
        Tensor qt = up(q, {B, c.T, c.H, c.hd}), kt = up(k, {B, c.T, c.Hkv, c.hd}),
               vt = up(v, {B, c.T, c.Hkv, c.hd});
        Tensor kct = up(kc, {B, c.S, c.Hkv, c.hd}), vct = up(vc, {B, c.S, c.Hkv, c.hd});
        Tensor start = up_ids(c.start, {B});
        Tensor out = poisoned({B, c.T, c.H, c.hd});
        be().attention_cached(qt, kt, vt, kct, vct, start, out, c.window);
        const int64_t keys = c.window ? c.window : c.S + c.T;
        EXPECT_TRUE(Close(down(out), want, reduction_tol(std::max(c.hd, keys))));

        be().kv_cache_write(kt, vt, kct, vct, start);
        for (int64_t b = 0; b < B; ++b)
            for (int64_t t = std::max<int64_t>(0, c.T - c.S); t < c.T; ++t) {
                const int64_t slot = (c.start[b] + t) % c.S;
                std::copy_n(k.begin() + (b * c.T + t) * row, row,
                            kc.begin() + (b * c.S + slot) * row);
                std::copy_n(v.begin() + (b * c.T + t) * row, row,
                            vc.begin() + (b * c.S + slot) * row);
            }
        // Bit-exact, NaN slots included: the write copies and touches nothing else.
        auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
            return a.size() == b.size() &&
                   std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
        };
        EXPECT_TRUE(same(down(kct), kc)) << "keys";
        EXPECT_TRUE(same(down(vct), vc)) << "values";
    }
}

// ---------------------------------------------------------------- router

TEST_P(OpTest, RouterTopk) {
    SCOPED_TRACE(trace());
    struct Case {
        int64_t N, E, k;
    };
    for (Case c : {Case{1, 1, 1}, Case{17, 8, 2}, Case{33, 8, 1}, Case{5, 8, 8}, Case{65, 3, 2},
                   Case{16, 64, 6}, Case{3, 17, 17}}) {
        SCOPED_TRACE("N,E,k = " + dims({c.N, c.E, c.k}));
        auto logits = normal(c.N * c.E, 2.0);
        Tensor idx = poisoned_ids({c.N, c.k});
        Tensor gates = poisoned({c.N, c.k});
        be().router_topk(up(logits, {c.N, c.E}), idx, gates);
        auto want = ref::router_topk(ref::to_double(logits), c.N, c.E, c.k);
        EXPECT_EQ(down_ids(idx), want.indices);
        EXPECT_TRUE(Close(down(gates), want.gates, reduction_tol(c.k)));
    }
}

// Logits drawn from {0, 1, 2} (and whole rows of one value) tie constantly: the contract says
// ties go to the lower index, listed in descending logit order, and tied logits get equal gates.
TEST_P(OpTest, RouterTopkBreaksTiesTowardsLowerIndex) {
    SCOPED_TRACE(trace());
    {  // a hand-checked row
        Tensor idx = poisoned_ids({1, 3}), gates = poisoned({1, 3});
        be().router_topk(up({1.0f, 3.0f, 3.0f, 0.0f, 3.0f}, {1, 5}), idx, gates);
        EXPECT_EQ(down_ids(idx), (Ids{1, 2, 4}));
        EXPECT_TRUE(Close(down(gates), Vec{1.0 / 3, 1.0 / 3, 1.0 / 3}, kElementwiseTol));
    }
    struct Case {
        int64_t N, E, k;
    };
    for (Case c : {Case{33, 8, 2}, Case{17, 8, 1}, Case{9, 8, 8}, Case{65, 5, 3}}) {
        SCOPED_TRACE("N,E,k = " + dims({c.N, c.E, c.k}));
        std::vector<float> logits(c.N * c.E);
        for (auto& l : logits) l = static_cast<float>(rng_.below(3));
        for (int64_t e = 0; e < c.E; ++e) logits[e] = -1.5f;  // row 0: all tied
        Tensor idx = poisoned_ids({c.N, c.k}), gates = poisoned({c.N, c.k});
        be().router_topk(up(logits, {c.N, c.E}), idx, gates);
        auto got = down_ids(idx);
        auto got_gates = down(gates);
        auto want = ref::router_topk(ref::to_double(logits), c.N, c.E, c.k);
        EXPECT_EQ(got, want.indices);
        EXPECT_TRUE(Close(got_gates, want.gates, kElementwiseTol));
        // The rule itself, independently of the reference.
        for (int64_t n = 0; n < c.N; ++n)
            for (int64_t j = 0; j + 1 < c.k; ++j) {
                int32_t a = got[n * c.k + j], b = got[n * c.k + j + 1];
                ASSERT_TRUE(a >= 0 && a < c.E && b >= 0 && b < c.E) << "row " << n;
                float la = logits[n * c.E + a], lb = logits[n * c.E + b];
                EXPECT_TRUE(la > lb || (la == lb && a < b))
                    << "row " << n << ": choice " << j << " is expert " << a << " (" << la
                    << "), then expert " << b << " (" << lb << ")";
                if (la == lb) {
                    EXPECT_EQ(got_gates[n * c.k + j], got_gates[n * c.k + j + 1]);
                }
            }
        for (int64_t j = 0; j < c.k; ++j) EXPECT_EQ(got[j], j) << "all-tied row 0";
    }
}

TEST_P(OpTest, RouterAuxLoss) {
    SCOPED_TRACE(trace());
    {  // by hand: f = (1, 0), P = (1/2, 1/2): 2 * (1 * 1/2) = 1
        Tensor out = poisoned({1});
        be().router_aux_loss(up({0, 0, 0, 0}, {2, 2}), up_ids({0, 0}, {2, 1}), out);
        EXPECT_TRUE(Close(down(out), Vec{1.0}, kElementwiseTol));
    }
    struct Case {
        int64_t N, E, k;
    };
    for (Case c : {Case{1, 1, 1}, Case{17, 8, 2}, Case{33, 8, 1}, Case{5, 8, 8}, Case{65, 3, 2},
                   Case{130, 64, 6}}) {
        SCOPED_TRACE("N,E,k = " + dims({c.N, c.E, c.k}));
        auto logits = normal(c.N * c.E, 3.0);
        Ids idx = random_choices(c.N, c.E, c.k);  // need not be the top-k of these logits
        Tensor out = poisoned({1});
        be().router_aux_loss(up(logits, {c.N, c.E}), up_ids(idx, {c.N, c.k}), out);
        double want = ref::router_aux_loss(ref::to_double(logits), c.N, c.E, idx, c.k);
        EXPECT_TRUE(Close(down(out), Vec{want}, reduction_tol(std::max(c.N, c.E))));
    }
}

// ---------------------------------------------------------------- expert grouping

// Checks moe_group's outputs against the reference, and their meaning on their own terms.
void check_grouping(const Ids& indices, int64_t N, int64_t k, int64_t E, const Ids& offsets,
                    const Ids& slot_rows, const Ids& slot_of) {
    auto want = ref::moe_group(indices, N, k, E);
    EXPECT_EQ(offsets, want.offsets);
    EXPECT_EQ(slot_rows, want.slot_rows);
    EXPECT_EQ(slot_of, want.slot_of);
    ASSERT_EQ(offsets.size(), static_cast<size_t>(E + 1));
    EXPECT_EQ(offsets[0], 0);
    EXPECT_EQ(offsets[E], N * k);
    for (int64_t e = 0; e < E; ++e) {
        ASSERT_LE(offsets[e], offsets[e + 1]) << "expert " << e;
        for (int32_t s = offsets[e]; s + 1 < offsets[e + 1]; ++s)
            EXPECT_LT(slot_rows[s], slot_rows[s + 1]) << "expert " << e << " not in token order";
    }
    for (int64_t n = 0; n < N; ++n)
        for (int64_t j = 0; j < k; ++j) {
            int32_t s = slot_of[n * k + j], e = indices[n * k + j];
            ASSERT_TRUE(s >= 0 && s < N * k) << "slot_of[" << n * k + j << "] = " << s;
            EXPECT_EQ(slot_rows[s], n);
            EXPECT_TRUE(offsets[e] <= s && s < offsets[e + 1])
                << "token " << n << " choice " << j << " (expert " << e << ") in slot " << s;
        }
}

TEST_P(OpTest, MoeGroup) {
    SCOPED_TRACE(trace());
    struct Case {
        int64_t N, k, E;
    };
    for (Case c : {Case{1, 1, 1}, Case{17, 2, 8}, Case{33, 1, 4}, Case{5, 8, 8}, Case{65, 3, 7},
                   Case{1, 2, 64}}) {
        SCOPED_TRACE("N,k,E = " + dims({c.N, c.k, c.E}));
        Ids idx = random_choices(c.N, c.E, c.k);
        Tensor off = poisoned_ids({c.E + 1}), rows = poisoned_ids({c.N * c.k}),
               of = poisoned_ids({c.N * c.k});
        be().moe_group(up_ids(idx, {c.N, c.k}), c.E, off, rows, of);
        check_grouping(idx, c.N, c.k, c.E, down_ids(off), down_ids(rows), down_ids(of));
    }
}

// Skewed routing: one expert takes every slot, most experts get none (empty ranges at the
// start, the middle and the end of offsets).
TEST_P(OpTest, MoeGroupSkewed) {
    SCOPED_TRACE(trace());
    struct Case {
        int64_t N, k, E;
        std::vector<int32_t> choice;  // every token picks these experts, in this order
    };
    const Case cases[] = {
        {33, 1, 5, {2}},     // one expert gets all
        {17, 1, 8, {7}},     // only the last
        {17, 1, 8, {0}},     // only the first
        {65, 2, 6, {3, 0}},  // two experts get all, in reverse order of choice
        {1, 3, 9, {8, 4, 1}},
    };
    for (const Case& c : cases) {
        SCOPED_TRACE("N,k,E = " + dims({c.N, c.k, c.E}));
        Ids idx;
        for (int64_t n = 0; n < c.N; ++n) idx.insert(idx.end(), c.choice.begin(), c.choice.end());
        Tensor off = poisoned_ids({c.E + 1}), rows = poisoned_ids({c.N * c.k}),
               of = poisoned_ids({c.N * c.k});
        be().moe_group(up_ids(idx, {c.N, c.k}), c.E, off, rows, of);
        check_grouping(idx, c.N, c.k, c.E, down_ids(off), down_ids(rows), down_ids(of));
    }
}

// ---------------------------------------------------------------- grouped matmul, combine

TEST_P(OpTest, GroupedMatmul) {
    SCOPED_TRACE(trace());
    struct Case {
        int64_t K, Nout;
        std::vector<int32_t> counts;  // rows per expert
    };
    const Case cases[] = {
        {1, 1, {1}},
        {17, 33, {0, 5, 0, 0, 12, 1, 0, 3}},  // empty experts first, inside and last
        {33, 17, {20, 0, 0}},                 // everything in the first expert
        {3, 65, {0, 0, 0, 7}},                // everything in the last expert
        {65, 3, {4, 9, 1, 6, 2}},
        {128, 96, {0, 31, 33, 0, 1, 0, 64, 0}},
        {40, 50, {0, 15, 0, 0, 12, 1, 0, 9}},  // 37 slots: past CUDA's matrix-vector path
    };
    for (const Case& c : cases)
        for (bool with_bias : {false, true}) {
            const int64_t E = static_cast<int64_t>(c.counts.size());
            Ids offsets(E + 1, 0);
            for (int64_t e = 0; e < E; ++e) offsets[e + 1] = offsets[e] + c.counts[e];
            const int64_t S = offsets[E];
            SCOPED_TRACE("S,K,E,Nout = " + dims({S, c.K, E, c.Nout}) +
                         " bias=" + std::to_string(with_bias));
            auto x = normal(S * c.K), w = normal(E * c.Nout * c.K), bias = normal(E * c.Nout);
            Tensor out = poisoned({S, c.Nout});
            be().grouped_matmul(up(x, {S, c.K}), up(w, {E, c.Nout, c.K}),
                                with_bias ? up(bias, {E, c.Nout}) : Tensor{},
                                up_ids(offsets, {E + 1}), out);
            Vec bias_d = ref::to_double(bias);
            auto want = ref::grouped_matmul(ref::to_double(x), S, c.K, ref::to_double(w), E, c.Nout,
                                            with_bias ? &bias_d : nullptr, offsets);
            EXPECT_TRUE(Close(down(out), want, reduction_tol(c.K)));
        }
}

TEST_P(OpTest, MoeCombine) {
    SCOPED_TRACE(trace());
    struct Case {
        int64_t N, k, d, E;
    };
    for (Case c : {Case{1, 1, 1, 1}, Case{17, 2, 33, 8}, Case{33, 1, 17, 4}, Case{5, 8, 65, 8},
                   Case{65, 3, 3, 7}}) {
        SCOPED_TRACE("N,k,d,E = " + dims({c.N, c.k, c.d, c.E}));
        auto logits = normal(c.N * c.E);
        auto route = ref::router_topk(ref::to_double(logits), c.N, c.E, c.k);
        auto group = ref::moe_group(route.indices, c.N, c.k, c.E);
        std::vector<float> gates(route.gates.begin(), route.gates.end());
        auto y = normal(c.N * c.k * c.d), init = normal(c.N * c.d);
        Tensor out = up(init, {c.N, c.d});  // combine accumulates into out
        be().moe_combine(up(y, {c.N * c.k, c.d}), up_ids(group.slot_of, {c.N * c.k}),
                         up(gates, {c.N, c.k}), out);
        auto want = ref::moe_combine(ref::to_double(y), group.slot_of, ref::to_double(gates), c.N,
                                     c.k, c.d, ref::to_double(init));
        EXPECT_TRUE(Close(down(out), want, reduction_tol(c.k)));
    }
}

// The MoE ops chained as the model uses them (route, group, gather, grouped matmul, combine)
// against the dense formula h[n] = sum_{j} g_j (x[n] . W_e^T + b_e) of
// docs/design.md#7-router-experts-aux-loss.
TEST_P(OpTest, MoePipelineMatchesDenseFormula) {
    SCOPED_TRACE(trace());
    struct Case {
        int64_t N, d, E, k, Nout;
    };
    for (Case c : {Case{1, 8, 4, 2, 5}, Case{17, 33, 8, 2, 17}, Case{33, 16, 3, 3, 9}}) {
        SCOPED_TRACE("N,d,E,k,Nout = " + dims({c.N, c.d, c.E, c.k, c.Nout}));
        auto x = normal(c.N * c.d), gate_w = normal(c.E * c.d), w = normal(c.E * c.Nout * c.d);
        auto bias = normal(c.E * c.Nout);
        Tensor xt = up(x, {c.N, c.d});
        Tensor logits = poisoned({c.N, c.E});
        be().matmul(xt, up(gate_w, {c.E, c.d}), logits, {.trans_b = true});
        Tensor idx = poisoned_ids({c.N, c.k}), gates = poisoned({c.N, c.k});
        be().router_topk(logits, idx, gates);
        Tensor off = poisoned_ids({c.E + 1}), rows = poisoned_ids({c.N * c.k}),
               of = poisoned_ids({c.N * c.k});
        be().moe_group(idx, c.E, off, rows, of);
        Tensor xs = poisoned({c.N * c.k, c.d});
        be().gather_rows(xt, rows, xs);
        Tensor ys = poisoned({c.N * c.k, c.Nout});
        be().grouped_matmul(xs, up(w, {c.E, c.Nout, c.d}), up(bias, {c.E, c.Nout}), off, ys);
        Tensor out = be().alloc({c.N, c.Nout});
        be().fill(out, 0.0f);
        be().moe_combine(ys, of, gates, out);

        // Dense reference, routed on the backend's own logits (a near-tie between two float
        // logits must not flip the choice between backend and reference).
        Vec r = ref::to_double(down(logits));
        auto route = ref::router_topk(r, c.N, c.E, c.k);
        Vec want(c.N * c.Nout, 0.0);
        for (int64_t n = 0; n < c.N; ++n)
            for (int64_t j = 0; j < c.k; ++j) {
                int64_t e = route.indices[n * c.k + j];
                for (int64_t o = 0; o < c.Nout; ++o) {
                    double y = bias[e * c.Nout + o];
                    for (int64_t i = 0; i < c.d; ++i)
                        y += static_cast<double>(x[n * c.d + i]) * w[(e * c.Nout + o) * c.d + i];
                    want[n * c.Nout + o] += route.gates[n * c.k + j] * y;
                }
            }
        EXPECT_TRUE(Close(down(out), want, reduction_tol(c.d)));
    }
}

// ---------------------------------------------------------------- elementwise

// Values where naive formulas go wrong: exp(-x) overflowing for x << 0, tanh saturating, 0.
const std::vector<float> kExtremes = {0.0f,   -0.0f, 1e-6f,  -1e-6f, 5.0f,   -5.0f,  20.0f,
                                      -20.0f, 50.0f, -50.0f, 88.0f,  -88.0f, 100.0f, -100.0f};

TEST_P(OpTest, Activations) {
    SCOPED_TRACE(trace());
    for (Activation act : {Activation::Gelu, Activation::Silu, Activation::Relu, Activation::Relu2})
        for (Shape s : {Shape{1}, Shape{17, 33}, Shape{3, 5, 7}, Shape{65, 129}}) {
            SCOPED_TRACE(std::string(to_string(act)) + " " + shape_string(s));
            auto x = normal(static_cast<size_t>(shape_numel(s)), 3.0);
            Tensor out = poisoned(s);
            be().activation(act, up(x, s), out);
            EXPECT_TRUE(Close(down(out), ref::activation(act, ref::to_double(x)), kElementwiseTol));
        }
    // Extremes one by one, so a large output does not hide a small one's error.
    for (Activation act : {Activation::Gelu, Activation::Silu, Activation::Relu, Activation::Relu2})
        for (float v : kExtremes) {
            SCOPED_TRACE(std::string(to_string(act)) + " of " + std::to_string(v));
            Tensor out = poisoned({1});
            be().activation(act, up({v}, {1}), out);
            EXPECT_TRUE(Close(down(out), ref::activation(act, Vec{v}), kElementwiseTol));
        }
}

TEST_P(OpTest, Swiglu) {
    SCOPED_TRACE(trace());
    for (Shape s : {Shape{1}, Shape{17, 33}, Shape{65, 129}}) {
        SCOPED_TRACE(shape_string(s));
        const size_t n = static_cast<size_t>(shape_numel(s));
        auto g = normal(n, 3.0), u = normal(n);
        Tensor out = poisoned(s);
        be().swiglu(up(g, s), up(u, s), out);
        EXPECT_TRUE(
            Close(down(out), ref::swiglu(ref::to_double(g), ref::to_double(u)), kElementwiseTol));
    }
    for (float g : kExtremes) {
        SCOPED_TRACE("gate " + std::to_string(g));
        Tensor out = poisoned({1});
        be().swiglu(up({g}, {1}), up({-2.5f}, {1}), out);
        EXPECT_TRUE(Close(down(out), ref::swiglu(Vec{g}, Vec{-2.5}), kElementwiseTol));
    }
}

TEST_P(OpTest, Add) {
    SCOPED_TRACE(trace());
    for (Shape s : {Shape{1}, Shape{17, 33}, Shape{3, 5, 7}, Shape{257, 129}}) {
        SCOPED_TRACE(shape_string(s));
        const size_t n = static_cast<size_t>(shape_numel(s));
        auto a = normal(n), b = normal(n, 10.0);
        auto want = ref::add(ref::to_double(a), ref::to_double(b));
        Tensor out = poisoned(s);
        Tensor at = up(a, s), bt = up(b, s);
        be().add(at, bt, out);
        EXPECT_TRUE(Close(down(out), want, kElementwiseTol));
        be().add(at, bt, at);  // out aliases a
        EXPECT_TRUE(Close(down(at), want, kElementwiseTol)) << "out aliasing a";
        Tensor at2 = up(a, s);
        be().add(at2, bt, bt);  // out aliases b
        EXPECT_TRUE(Close(down(bt), want, kElementwiseTol)) << "out aliasing b";
    }
}

// ---------------------------------------------------------------- losses

TEST_P(OpTest, CrossEntropy) {
    SCOPED_TRACE(trace());
    struct Case {
        int64_t N, V;
        double scale;
    };
    for (Case c :
         {Case{1, 1, 1}, Case{3, 17, 1}, Case{17, 33, 3}, Case{33, 1000, 2}, Case{5, 65, 0}}) {
        SCOPED_TRACE("N,V = " + dims({c.N, c.V}) + " scale " + std::to_string(c.scale));
        auto logits = normal(c.N * c.V, c.scale);
        Ids targets = ints(c.N, -1, static_cast<int32_t>(c.V));  // includes -1 (ignored)
        targets[c.N - 1] = static_cast<int32_t>(c.V - 1);        // the last class is reachable
        if (c.N > 1) targets[0] = -1;
        Tensor losses = poisoned({c.N});
        be().cross_entropy(up(logits, {c.N, c.V}), up_ids(targets, {c.N}), losses);
        auto got = down(losses);
        EXPECT_TRUE(Close(got, ref::cross_entropy(ref::to_double(logits), c.N, c.V, targets),
                          reduction_tol(c.V)));
        for (int64_t n = 0; n < c.N; ++n)
            if (targets[n] == -1) {
                EXPECT_EQ(got[n], 0.0f) << "ignored token " << n;
            }
    }
}

// Logits of +-80 and beyond: exp(80) ~ 5.5e34 and exp(100) overflow fp32 sums unless the
// maximum is subtracted first.
TEST_P(OpTest, CrossEntropyWithLargeLogits) {
    SCOPED_TRACE(trace());
    const int64_t N = 6, V = 33;
    std::vector<float> logits(N * V);
    for (auto& l : logits) l = static_cast<float>((rng_.uniform() * 2.0 - 1.0) * 80.0);
    for (int64_t v = 0; v < V; ++v) logits[1 * V + v] = 100.0f;  // all equal, large
    for (int64_t v = 0; v < V; ++v) logits[2 * V + v] = v % 2 ? 90.0f : -90.0f;
    logits[3 * V + 5] = 120.0f;  // one dominant
    Ids targets = {0, 7, 4, 5, -1, 12};
    targets[0] = static_cast<int32_t>(std::max_element(logits.begin(), logits.begin() + V) -
                                      logits.begin());  // row 0's loss is near 0
    Tensor losses = poisoned({N});
    be().cross_entropy(up(logits, {N, V}), up_ids(targets, {N}), losses);
    auto got = down(losses);
    EXPECT_TRUE(
        Close(got, ref::cross_entropy(ref::to_double(logits), N, V, targets), reduction_tol(V)));
    EXPECT_EQ(got[4], 0.0f);
}

// ---------------------------------------------------------------- argmax_rows (greedy tokens)

// The first largest value's index per row, or -1 for a row holding a NaN or an infinity:
// random rows of several lengths (one value, fewer than a workgroup, several workgroups' worth,
// a vocabulary) with ties placed ahead of and behind each other, a row all equal, the largest
// value first or last, and each non-finite value alone among finite ones.
TEST_P(OpTest, ArgmaxRows) {
    SCOPED_TRACE(trace());
    const float inf = std::numeric_limits<float>::infinity();
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (int64_t V : {1, 7, 300, 32000}) {
        SCOPED_TRACE("V " + std::to_string(V));
        const int64_t N = 9;
        std::vector<float> logits = normal(static_cast<size_t>(N * V), 3.0);
        auto row = [&](int64_t n) { return logits.begin() + n * V; };
        const auto at = [&] {
            return std::min<int64_t>(V - 1, static_cast<int64_t>(rng_.uniform() * V));
        };
        // Row 1: its largest value twice, at a random place and later; row 2: all equal.
        const float top = *std::max_element(row(1), row(2)) + 1.0f;
        const int64_t first = at(), second = std::min(V - 1, first + 1 + (V - first) / 2);
        *(row(1) + second) = top;
        *(row(1) + first) = top;
        std::fill(row(2), row(3), -0.5f);
        // Rows 3 and 4: the largest value first, last.
        *row(3) = *std::max_element(row(3), row(4)) + 1.0f;
        *(row(5) - 1) = *std::max_element(row(4), row(5)) + 1.0f;
        // Rows 5 to 7: a NaN, +inf, -inf at a random place; row 8 stays random.
        *(row(5) + at()) = nan;
        *(row(6) + at()) = inf;
        *(row(7) + at()) = -inf;
        Ids want(static_cast<size_t>(N));
        for (int64_t n = 0; n < N; ++n) {
            const bool finite =
                std::all_of(row(n), row(n + 1), [](float x) { return std::isfinite(x); });
            want[static_cast<size_t>(n)] =
                finite ? static_cast<int32_t>(std::max_element(row(n), row(n + 1)) - row(n)) : -1;
        }
        EXPECT_EQ(want[1], static_cast<int32_t>(first));
        EXPECT_EQ(want[2], 0);
        EXPECT_EQ(be().argmax_rows(up(logits, {N, V})), want);
    }
}

// ---------------------------------------------------------------- contract violations

// A shape or dtype mismatch is an engine bug: the op throws std::logic_error naming itself.
TEST_P(OpTest, BadShapesThrowLogicError) {
    SCOPED_TRACE(trace());
    auto f = [&](Shape s) { return be().alloc(std::move(s)); };
    auto i = [&](Shape s) { return be().alloc(std::move(s), DType::I32); };

    try {
        be().matmul(f({3, 4}), f({5, 6}), f({3, 6}));
        ADD_FAILURE() << "matmul with inner dimensions 4 and 5 did not throw";
    } catch (const std::logic_error& e) {
        EXPECT_NE(std::string(e.what()).find("matmul"), std::string::npos) << e.what();
    }
    EXPECT_THROW(be().matmul(f({3, 4}), f({6, 5}), f({3, 6}), {.trans_b = true}), std::logic_error);
    EXPECT_THROW(be().matmul(f({4, 3}), f({5, 6}), f({3, 6}), {.trans_a = true}), std::logic_error);
    EXPECT_THROW(be().matmul(f({3, 4}), f({4, 6}), f({3, 7})), std::logic_error);
    EXPECT_THROW(be().matmul(f({3, 4}), f({4, 6}), f({3, 6}), {}, f({3})), std::logic_error);
    EXPECT_THROW(be().matmul(f({3, 4}), i({4, 6}), f({3, 6})), std::logic_error);
    EXPECT_THROW(be().matmul(f({12}), f({4, 6}), f({3, 6})), std::logic_error);

    EXPECT_THROW(be().gather_rows(f({7, 5}), f({3}), f({3, 5})), std::logic_error);  // F32 rows
    EXPECT_THROW(be().gather_rows(f({7, 5}), i({3}), f({3, 4})), std::logic_error);
    EXPECT_THROW(be().argmax_rows(f({15})), std::logic_error);
    EXPECT_THROW(be().argmax_rows(f({3, 0})), std::logic_error);
    EXPECT_THROW(be().argmax_rows(i({3, 5})), std::logic_error);

    EXPECT_THROW(be().norm(NormType::RmsNorm, f({3, 8}), f({7}), {}, 1e-5f, f({3, 8})),
                 std::logic_error);
    EXPECT_THROW(be().norm(NormType::LayerNorm, f({3, 8}), f({8}), {}, 1e-5f, f({3, 8})),
                 std::logic_error);  // layernorm without its bias

    EXPECT_THROW(be().rope(f({3, 2, 7}), i({3}), 10000.0), std::logic_error);  // odd head_dim
    EXPECT_THROW(be().rope(f({3, 2, 8}), i({4}), 10000.0), std::logic_error);

    Tensor q = f({1, 5, 3, 8}), kv = f({1, 5, 2, 8});
    EXPECT_THROW(be().attention(q, kv, kv, f({1, 5, 3, 8}), 0), std::logic_error);  // 3 % 2
    Tensor q4 = f({1, 5, 4, 8});
    EXPECT_THROW(be().attention(q4, kv, kv, f({1, 5, 4, 8}), -1), std::logic_error);
    EXPECT_THROW(be().attention(q4, f({1, 6, 2, 8}), f({1, 6, 2, 8}), f({1, 5, 4, 8}), 0),
                 std::logic_error);
    Tensor cache = f({1, 8, 2, 8}), start = i({1});
    EXPECT_THROW(be().attention_cached(q4, kv, kv, f({1, 8, 1, 8}), f({1, 8, 1, 8}), start,
                                       f({1, 5, 4, 8}), 8),
                 std::logic_error);  // cache kv heads differ
    EXPECT_THROW(be().attention_cached(q4, kv, kv, cache, cache, i({2}), f({1, 5, 4, 8}), 8),
                 std::logic_error);  // one start per sequence
    EXPECT_THROW(be().attention_cached(q4, kv, kv, cache, cache, start, f({1, 5, 4, 8}), 16),
                 std::logic_error);  // 8 slots cannot serve a window of 16
    EXPECT_THROW(be().kv_cache_write(kv, kv, f({2, 8, 2, 8}), f({2, 8, 2, 8}), start),
                 std::logic_error);  // batch differs

    EXPECT_THROW(be().router_topk(f({3, 4}), i({3, 5}), f({3, 5})), std::logic_error);  // k > E
    EXPECT_THROW(be().router_topk(f({3, 4}), i({3, 2}), f({3, 3})), std::logic_error);
    EXPECT_THROW(be().moe_group(i({3, 2}), 4, i({4}), i({6}), i({6})), std::logic_error);
    EXPECT_THROW(be().gather_rows(f({3, 4}), i({5}), f({5, 3})), std::logic_error);
    EXPECT_THROW(be().gather_rows(f({3, 4}), i({5}), i({5, 4})), std::logic_error);  // I32 out
    EXPECT_THROW(be().grouped_matmul(f({6, 4}), f({3, 5, 4}), {}, i({3}), f({6, 5})),
                 std::logic_error);
    EXPECT_THROW(be().grouped_matmul(f({6, 4}), f({3, 5, 3}), {}, i({4}), f({6, 5})),
                 std::logic_error);
    EXPECT_THROW(be().moe_combine(f({5, 4}), i({6}), f({3, 2}), f({3, 4})), std::logic_error);
    EXPECT_THROW(be().swiglu(f({3, 4}), f({4, 3}), f({3, 4})), std::logic_error);
    EXPECT_THROW(be().add(f({3, 4}), f({3, 4}), f({12})), std::logic_error);
    EXPECT_THROW(be().cross_entropy(f({3, 4}), i({2}), f({3})), std::logic_error);
    EXPECT_THROW(be().router_aux_loss(f({3, 4}), i({2, 2}), f({1})), std::logic_error);
}

INSTANTIATE_TEST_SUITE_P(Backends, OpTest, ::testing::ValuesIn(backend_names()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                             return info.param;
                         });

}  // namespace
}  // namespace tmx

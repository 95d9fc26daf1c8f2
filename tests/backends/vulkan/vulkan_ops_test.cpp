// The Vulkan backend against the CPU backend on shapes the shared op tests do not reach:
// sizes across tile and matrix-vector boundaries, decode shapes (one token, one expert taking
// all slots or none), the rolling KV cache, and the ordering of dependent ops recorded into one
// submit.
#ifdef TMX_HAS_VULKAN

#include "backends/registry.h"
#include "tests/backends/backend_pair_fixture.h"  // BitwiseEqual
#include "tests/backends/vulkan/vulkan_fixture.h"

namespace tmx::test {
namespace {

class VulkanOps : public VulkanTest {};

TEST_F(VulkanOps, MatmulAcrossTileAndMatrixVectorBoundaries) {
    SCOPED_TRACE(trace());
    struct Case {
        int64_t M, N, K;
    };
    // M 16 | 17: the matrix-vector path (4 rows a pass: 5 and 16 take 2 and 4 passes) and the
    // smallest tiled one (skinny tiles up to M 32); 129: 64-row tiles; 257+: the large tiles;
    // sizes one past powers of two leave partial tiles in every dimension.
    for (Case c : {Case{4, 1001, 257}, Case{5, 129, 65}, Case{16, 70, 40}, Case{17, 129, 65},
                   Case{30, 70, 40}, Case{1, 3001, 64}, Case{300, 257, 129}, Case{129, 65, 300},
                   Case{2, 7, 1}})
        for (bool ta : {false, true})
            for (bool tb : {false, true}) {
                SCOPED_TRACE("M,N,K " + std::to_string(c.M) + "," + std::to_string(c.N) + "," +
                             std::to_string(c.K) + " ta " + std::to_string(ta) + " tb " +
                             std::to_string(tb));
                auto a = normal(c.M * c.K), b = normal(c.K * c.N), bias = normal(c.N),
                     init = normal(c.M * c.N);
                const Shape sa = ta ? Shape{c.K, c.M} : Shape{c.M, c.K};
                const Shape sb = tb ? Shape{c.N, c.K} : Shape{c.K, c.N};
                const MatmulOptions o{.trans_a = ta, .trans_b = tb, .accumulate = true};
                std::vector<float> results[2];
                int i = 0;
                for (Backend* be : {static_cast<Backend*>(&vk()), &cpu()}) {
                    Tensor out = up(*be, init, {c.M, c.N});
                    be->matmul(up(*be, a, sa), up(*be, b, sb), out, o, up(*be, bias, {c.N}));
                    results[i++] = down(*be, out);
                }
                EXPECT_TRUE(Close(results[0], results[1], reduction_tol(c.K)));
            }
}

// The matrix-vector shaders read 4 consecutive k at once where K and every row start are
// multiples of 4, and one at a time otherwise: operands at every element offset mod 4 inside
// larger buffers, K a multiple of 4 or not, 1 to 16 rows (one pass of 4 rows or several).
TEST_F(VulkanOps, MatrixVectorPathsAtEveryAlignment) {
    SCOPED_TRACE(trace());
    for (int64_t K : {64, 66})
        for (int64_t M : {1, 3, 4, 7, 16})
            for (int64_t a_off : {0, 1, 2, 4})
                for (int64_t b_off : {0, 3, 4}) {
                    SCOPED_TRACE("K " + std::to_string(K) + " M " + std::to_string(M) +
                                 " offsets " + std::to_string(a_off) + "," + std::to_string(b_off));
                    const int64_t N = 37;
                    auto a = normal(a_off + M * K), b = normal(b_off + N * K);
                    std::vector<float> results[2];
                    int i = 0;
                    for (Backend* be : {static_cast<Backend*>(&vk()), &cpu()}) {
                        Tensor ta = up(*be, a, {a_off + M * K}), tb = up(*be, b, {b_off + N * K});
                        Tensor out = be->alloc({M, N});
                        be->matmul(ta.slice(a_off, {M, K}), tb.slice(b_off, {N, K}), out,
                                   {.trans_b = true});
                        results[i++] = down(*be, out);
                    }
                    EXPECT_TRUE(Close(results[0], results[1], reduction_tol(K)));
                }
    // Grouped: slot rows of x start at x_off + s * K, expert rows of w at w_off + ... * K.
    for (int64_t K : {64, 66})
        for (int64_t x_off : {0, 2, 4})
            for (int64_t w_off : {0, 1, 4}) {
                SCOPED_TRACE("grouped K " + std::to_string(K) + " offsets " +
                             std::to_string(x_off) + "," + std::to_string(w_off));
                const int64_t E = 3, Nout = 21, S = 9;  // 6 slots in one expert: 2 passes
                const std::vector<int32_t> offsets = {0, 2, 2, 9};
                auto x = normal(x_off + S * K), w = normal(w_off + E * Nout * K);
                std::vector<float> results[2];
                int i = 0;
                for (Backend* be : {static_cast<Backend*>(&vk()), &cpu()}) {
                    Tensor tx = up(*be, x, {x_off + S * K}),
                           tw = up(*be, w, {w_off + E * Nout * K});
                    Tensor out = be->alloc({S, Nout});
                    be->grouped_matmul(tx.slice(x_off, {S, K}), tw.slice(w_off, {E, Nout, K}),
                                       Tensor{}, up_ids(*be, offsets, {E + 1}), out);
                    results[i++] = down(*be, out);
                }
                EXPECT_TRUE(Close(results[0], results[1], reduction_tol(K)));
            }
}

// grouped_matmul on the device's offsets: decode (one token, top-2: two slots), one expert
// taking every slot, experts with none, and enough slots for the tiled path (past 32; up to
// there the matrix-vector shader takes an expert's slots 4 at a time).
TEST_F(VulkanOps, GroupedMatmulDecodeAndSkewedRouting) {
    SCOPED_TRACE(trace());
    struct Case {
        int64_t K, Nout;
        std::vector<int32_t> counts;
    };
    const Case cases[] = {
        {64, 130, {0, 1, 0, 0, 0, 1, 0, 0}},      // one token, top-2
        {33, 17, {0, 0, 1}},                      // one token, top-1, last expert
        {65, 33, {8, 0, 0, 0}},                   // matrix-vector path, one expert has all
        {64, 33, {2, 3, 1, 2, 0, 4, 2, 2}},       // eight tokens, top-2: matrix-vector
        {65, 33, {0, 0, 32, 0}},                  // matrix-vector path, 32 slots in one expert
        {65, 33, {0, 0, 33, 0}},                  // tiled path, one expert has all
        {129, 70, {0, 100, 3, 0, 64, 65, 0, 1}},  // skinny tiles (few slots per expert)
        {40, 70, {150, 0, 131, 20}},              // 64-row tiles
    };
    for (const Case& c : cases) {
        const int64_t E = static_cast<int64_t>(c.counts.size());
        const std::vector<int32_t> offsets = expert_offsets(c.counts);
        const int64_t S = offsets[E];
        SCOPED_TRACE("S " + std::to_string(S) + " K " + std::to_string(c.K) + " Nout " +
                     std::to_string(c.Nout));
        auto x = normal(S * c.K), w = normal(E * c.Nout * c.K), bias = normal(E * c.Nout);
        std::vector<float> results[2];
        int i = 0;
        for (Backend* be : {static_cast<Backend*>(&vk()), &cpu()}) {
            Tensor out = be->alloc({S, c.Nout});
            be->grouped_matmul(up(*be, x, {S, c.K}), up(*be, w, {E, c.Nout, c.K}),
                               up(*be, bias, {E, c.Nout}), up_ids(*be, offsets, {E + 1}), out);
            results[i++] = down(*be, out);
        }
        EXPECT_TRUE(Close(results[0], results[1], reduction_tol(c.K)));
    }
}

// A one-token MoE step on the device: route, group, gather, grouped matmul, combine, with an
// expert count where most experts receive nothing.
TEST_F(VulkanOps, OneTokenMoeStepMatchesCpu) {
    SCOPED_TRACE(trace());
    const int64_t d = 96, E = 8, k = 2, Nout = 40;
    auto x = normal(d), gate_w = normal(E * d), w = normal(E * Nout * d), bias = normal(E * Nout);
    std::vector<float> results[2];
    std::vector<int32_t> offsets[2];
    int i = 0;
    for (Backend* be : {static_cast<Backend*>(&vk()), &cpu()}) {
        Tensor xt = up(*be, x, {1, d}), logits = be->alloc({1, E});
        be->matmul(xt, up(*be, gate_w, {E, d}), logits, {.trans_b = true});
        Tensor idx = be->alloc({1, k}, DType::I32), gates = be->alloc({1, k});
        be->router_topk(logits, idx, gates);
        Tensor off = be->alloc({E + 1}, DType::I32), rows = be->alloc({k}, DType::I32),
               of = be->alloc({k}, DType::I32);
        be->moe_group(idx, E, off, rows, of);
        Tensor xs = be->alloc({k, d}), ys = be->alloc({k, Nout}), out = be->alloc({1, Nout});
        be->gather_rows(xt, rows, xs);
        be->grouped_matmul(xs, up(*be, w, {E, Nout, d}), up(*be, bias, {E, Nout}), off, ys);
        be->fill(out, 0.0f);
        be->moe_combine(ys, of, gates, out);
        offsets[i] = down_ids(*be, off);
        results[i++] = down(*be, out);
    }
    EXPECT_EQ(offsets[0], offsets[1]);
    EXPECT_TRUE(Close(results[0], results[1], reduction_tol(d)));
}

// attention_cached and kv_cache_write against the CPU backend: decode (T = 1), chunks shorter
// and longer than the cache, starts before and after the cache has wrapped, windows of 0,
// shorter than and as long as the cache.
TEST_F(VulkanOps, AttentionCachedAndCacheWriteMatchCpu) {
    SCOPED_TRACE(trace());
    struct Case {
        int64_t B, T, H, Hkv, hd, S, window;
    };
    const Case cases[] = {
        {1, 1, 8, 2, 64, 16, 16},  // decode, window = cache
        {2, 1, 4, 1, 16, 8, 5},    // decode, window < cache
        {2, 5, 4, 2, 8, 8, 8},     // a chunk
        {1, 20, 2, 1, 32, 8, 9},   // a chunk longer than the cache, window = S + 1
        {3, 3, 6, 3, 24, 300, 0},  // no window: the cache covers everything
    };
    for (const Case& c : cases) {
        SCOPED_TRACE("B,T,H,Hkv,hd,S,window " + std::to_string(c.B) + "," + std::to_string(c.T) +
                     "," + std::to_string(c.H) + "," + std::to_string(c.Hkv) + "," +
                     std::to_string(c.hd) + "," + std::to_string(c.S) + "," +
                     std::to_string(c.window));
        auto q = normal(c.B * c.T * c.H * c.hd), k = normal(c.B * c.T * c.Hkv * c.hd),
             v = normal(c.B * c.T * c.Hkv * c.hd), kc = normal(c.B * c.S * c.Hkv * c.hd),
             vc = normal(c.B * c.S * c.Hkv * c.hd);
        // Starts: empty cache, partly filled, wrapped (when the window allows it).
        std::vector<int32_t> start(c.B);
        for (int64_t b = 0; b < c.B; ++b)
            start[b] =
                c.window == 0
                    ? static_cast<int32_t>(b * (c.S - c.T) / std::max<int64_t>(1, c.B - 1) / 2)
                    : static_cast<int32_t>(b == 0 ? 0 : rng_.below(3 * c.S));
        std::vector<float> outs[2], kcs[2], vcs[2];
        int i = 0;
        for (Backend* be : {static_cast<Backend*>(&vk()), &cpu()}) {
            Tensor qt = up(*be, q, {c.B, c.T, c.H, c.hd}), kt = up(*be, k, {c.B, c.T, c.Hkv, c.hd}),
                   vt = up(*be, v, {c.B, c.T, c.Hkv, c.hd});
            Tensor kct = up(*be, kc, {c.B, c.S, c.Hkv, c.hd}),
                   vct = up(*be, vc, {c.B, c.S, c.Hkv, c.hd});
            Tensor st = up_ids(*be, start, {c.B}), out = be->alloc({c.B, c.T, c.H, c.hd});
            be->attention_cached(qt, kt, vt, kct, vct, st, out, c.window);
            be->kv_cache_write(kt, vt, kct, vct, st);
            outs[i] = down(*be, out);
            kcs[i] = down(*be, kct);
            vcs[i++] = down(*be, vct);
        }
        EXPECT_TRUE(Close(outs[0], outs[1], reduction_tol(std::max(c.hd, c.S + c.T))));
        EXPECT_EQ(kcs[0], kcs[1]) << "k_cache";
        EXPECT_EQ(vcs[0], vcs[1]) << "v_cache";
    }
}

// Generation's invariant (docs/design.md#6-rolling-kv-cache-and-generation) on the device
// alone: a prefill chunk and then one token at a time through the rolling cache give what
// attention over the whole sequence gives, with the window as long as the cache.
TEST_F(VulkanOps, DecodingThroughTheCacheMatchesFullAttention) {
    SCOPED_TRACE(trace());
    const int64_t T = 23, H = 4, Hkv = 2, hd = 16, W = 6, prefill = 4;
    auto q = normal(T * H * hd), k = normal(T * Hkv * hd), v = normal(T * Hkv * hd);
    Tensor qt = up(vk(), q, {1, T, H, hd}), kt = up(vk(), k, {1, T, Hkv, hd}),
           vt = up(vk(), v, {1, T, Hkv, hd});
    Tensor full = vk().alloc({1, T, H, hd});
    vk().attention(qt, kt, vt, full, W);

    Tensor kc = vk().alloc({1, W, Hkv, hd}), vc = vk().alloc({1, W, Hkv, hd});
    vk().fill(kc, 0.0f);
    vk().fill(vc, 0.0f);
    Tensor cached = vk().alloc({1, T, H, hd});
    for (int64_t p = 0; p < T;) {
        const int64_t n = p == 0 ? prefill : 1;
        auto chunk = [&](const Tensor& t) {  // positions [p, p + n) of a [1, T, heads, hd] tensor
            return t.reshape({T, t.dim(2), t.dim(3)})
                .rows(p, p + n)
                .reshape({1, n, t.dim(2), t.dim(3)});
        };
        Tensor start = up_ids(vk(), std::vector<int32_t>{static_cast<int32_t>(p)}, {1});
        vk().attention_cached(chunk(qt), chunk(kt), chunk(vt), kc, vc, start, chunk(cached), W);
        vk().kv_cache_write(chunk(kt), chunk(vt), kc, vc, start);
        p += n;
    }
    EXPECT_TRUE(Close(down(vk(), cached), down(vk(), full), 1e-5));
}

// Ops recorded back to back (no download between them) see each other's results: a barrier
// is recorded where one reads or overwrites what another wrote, and only there; the whole
// chain is one submit.
TEST_F(VulkanOps, DependentOpsInOneSubmitAreOrderedWithBarriersOnlyWhereNeeded) {
    SCOPED_TRACE(trace());
    const int64_t n = 1000;
    auto a = normal(n), b = normal(n);
    Tensor at = up(vk(), a, {n}), bt = up(vk(), b, {n});
    Tensor c1 = vk().alloc({n}), c2 = vk().alloc({n});
    vk().synchronize();

    const auto before = vk().counters();
    vk().add(at, bt, c1);  // independent of each other: no barrier between them
    vk().add(at, bt, c2);
    EXPECT_EQ(vk().counters().barriers, before.barriers);
    vk().add(c1, c2, c1);  // reads both: one barrier
    EXPECT_EQ(vk().counters().barriers, before.barriers + 1);
    for (int i = 0; i < 50; ++i) vk().add(c1, at, c1);  // a chain: one barrier each
    EXPECT_EQ(vk().counters().barriers, before.barriers + 51);
    EXPECT_EQ(vk().counters().submits, before.submits);  // nothing submitted yet

    std::vector<float> want(n);
    for (int64_t i = 0; i < n; ++i) {
        float c = (a[i] + b[i]) + (a[i] + b[i]);
        for (int r = 0; r < 50; ++r) c += a[i];
        want[i] = c;
    }
    EXPECT_TRUE(Close(down(vk(), c1), want, 1e-5));
    EXPECT_EQ(vk().counters().submits, before.submits + 1);
}

// The next sync point throws the error a shader reported, naming `what`.
void expect_bad_row_at_sync(VulkanBackend& vk, const std::string& what) {
    try {
        vk.synchronize();
        ADD_FAILURE() << "a row past the table did not throw";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
}

TEST_F(VulkanOps, BadIdsThrowAtTheSyncPointAndTheBackendStaysUsable) {
    SCOPED_TRACE(trace());
    Tensor table = up(vk(), normal(5 * 3), {5, 3});
    Tensor out = vk().alloc({2, 3});
    vk().gather_rows(table, up_ids(vk(), std::vector<int32_t>{1, 5}, {2}), out);
    expect_bad_row_at_sync(vk(), "row 5 outside [0, 5)");
    // The error is reported once; later work runs normally.
    auto x = normal(7);
    Tensor y = vk().alloc({7});
    vk().add(up(vk(), x, {7}), up(vk(), x, {7}), y);
    std::vector<float> want(7);
    for (int i = 0; i < 7; ++i) want[i] = x[i] + x[i];
    EXPECT_TRUE(Close(down(vk(), y), want, 1e-6));

    Tensor logits = up(vk(), normal(2 * 4), {2, 4}), losses = vk().alloc({2});
    vk().cross_entropy(logits, up_ids(vk(), std::vector<int32_t>{0, 4}, {2}), losses);
    EXPECT_THROW(down(vk(), losses), Error);
}

// gather_rows_backward with rows past the table (and negative) among 600 slots (several row
// ranges, gather_rows_backward.comp): the first bad row is reported at the sync point, once,
// and every good slot is still added, in slot order.
TEST_F(VulkanOps, BadRowsInGatherBackwardThrowAndTheGoodOnesAreAdded) {
    SCOPED_TRACE(trace());
    const int64_t N = 5, d = 3, S = 600;
    std::vector<int32_t> rows = ints(S, 0, static_cast<int32_t>(N));
    rows[1] = 5;
    rows[300] = -1;
    const std::vector<float> d_out = normal(S * d), init = normal(N * d);
    Tensor d_x = up(vk(), init, {N, d});
    vk().gather_rows_backward(up_ids(vk(), rows, {S}), up(vk(), d_out, {S, d}), d_x);
    expect_bad_row_at_sync(vk(), "row 5 outside [0, 5)");
    std::vector<float> want = init;
    for (int64_t s = 0; s < S; ++s)
        if (rows[s] >= 0 && rows[s] < N)
            for (int64_t c = 0; c < d; ++c) want[rows[s] * d + c] += d_out[s * d + c];
    EXPECT_TRUE(BitwiseEqual(down(vk(), d_x), want));
}

TEST_F(VulkanOps, CopyAndFillIncludingOverlappingViews) {
    SCOPED_TRACE(trace());
    auto x = normal(100);
    Tensor t = up(vk(), x, {100});
    vk().copy(t.slice(0, {60}), t.slice(30, {60}));  // overlapping: through a scratch copy
    vk().fill(t.slice(95, {5}), 2.5f);
    auto got = down(vk(), t);
    std::vector<float> want(100);
    for (int i = 0; i < 100; ++i) want[i] = i >= 95 ? 2.5f : i >= 30 && i < 90 ? x[i - 30] : x[i];
    EXPECT_EQ(got, want);
}

}  // namespace
}  // namespace tmx::test

#endif  // TMX_HAS_VULKAN

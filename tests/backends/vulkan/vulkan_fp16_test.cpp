// The fp16-weight path of the Vulkan matmuls (backends/vulkan/vulkan_fp16.h), the default,
// forced here with VulkanOptions::fp16_weights:
//   - the conversion rounds to nearest even and clamps like an independent host rounding;
//   - linear and grouped_matmul (decode and tiled shaders, odd sizes) equal the CPU backend run
//     on host-rounded weights at the fp32 tolerance (so every index and offset is right), and
//     the CPU on the original weights at a tolerance derived from fp16 rounding; matmul, which
//     names no weight, stays fp32 in every transposition;
//   - the model's forward and cached decoding likewise;
//   - a copy is remade after any write to its weight (upload, fill, op output,
//     Model::params_from_host), reused otherwise, and freed with its buffer;
//   - with the option off the fp32 path runs, at the fp32 tolerance, and the option, the
//     environment variable and the device's support choose the path as documented.
#ifdef TMX_HAS_VULKAN

#include <cstdlib>

#include "engine/model/kv_cache.h"
#include "engine/model/model.h"
#include "tests/backends/vulkan/vulkan_fixture.h"

namespace tmx::test {
namespace {

// fp16's unit roundoff: round to nearest with an 11-bit significand.
constexpr double kU = 0x1p-11;

// Tolerance of a dot product over random inputs with fp16-rounded weights, in Close()'s metric
// (error / max(1, max |want|)). Each weight gets a relative error d_k, |d_k| <= u, roughly
// uniform, independent: the error of sum_k x_k w_k is sum_k x_k w_k d_k, with standard
// deviation u/sqrt(3) * sqrt(K) * rms(x w). Over up to ~1e5 outputs the worst is about 4.5
// standard deviations, ~2.6 u sqrt(K) rms(x w), while max |want| is itself >= ~3 sqrt(K)
// rms(x w) (the largest of many sums of K such terms): the worst relative error is about u.
// 4u leaves room for the tails and adds the fp32 summation's own tolerance. A wrong index or
// offset would make errors of the order of the results themselves (relative error ~ 1).
double fp16_tol(int64_t K) {
    return 4 * kU + std::max(1e-5, 2e-7 * static_cast<double>(K));
}

// Round to nearest even fp16, clamped to +-65504: arithmetic on doubles (v / quantum is exact,
// nearbyint rounds half to even), independent of shaders/to_fp16.comp's bit manipulation.
float round_fp16(float v) {
    const double a = std::abs(static_cast<double>(v));
    double quantum = 0x1p-24;  // fp16 subnormals
    if (a >= 0x1p-14) {
        int e = 0;
        std::frexp(a, &e);  // a in [2^(e-1), 2^e)
        quantum = std::ldexp(1.0, e - 1 - 10);
    }
    const double r = std::nearbyint(static_cast<double>(v) / quantum) * quantum;
    return static_cast<float>(std::clamp(r, -65504.0, 65504.0));
}

std::vector<float> rounded(std::vector<float> v) {
    for (float& x : v) x = round_fp16(x);
    return v;
}

class VulkanFp16 : public VulkanTest {
  protected:
    vk::VulkanOptions options() const override { return {.fp16_weights = true}; }
    void SetUp() override {
        VulkanTest::SetUp();
        if (IsSkipped() || HasFatalFailure()) return;
        ASSERT_TRUE(vk().fp16_weights());
    }

    // The op on Vulkan with b, and on the CPU with b and round_fp16(b): linear(a, b) (b [N, K]
    // a weight), or else matmul(a, b) in the transposition ta, tb, accumulating, with a bias.
    struct Results {
        std::vector<float> vk, cpu, cpu_rounded;
    };
    Results matmul_all(int64_t M, int64_t N, int64_t K, bool ta, bool tb, bool linear = false) {
        if (linear) ta = false, tb = true;
        auto a = normal(M * K), b = normal(K * N), bias = normal(N), init = normal(M * N);
        const Shape sa = ta ? Shape{K, M} : Shape{M, K};
        const Shape sb = tb ? Shape{N, K} : Shape{K, N};
        const MatmulOptions o{.trans_a = ta, .trans_b = tb, .accumulate = true};
        auto run = [&](Backend& be, const std::vector<float>& w) {
            Tensor out = up(be, init, {M, N});
            if (linear)
                be.linear(up(be, a, sa), up(be, w, sb), up(be, bias, {N}), out, true);
            else
                be.matmul(up(be, a, sa), up(be, w, sb), out, o, up(be, bias, {N}));
            return down(be, out);
        };
        return {run(vk(), b), run(cpu(), b), run(cpu(), rounded(b))};
    }
};

TEST_F(VulkanFp16, ConversionRoundsToNearestEvenAndClamps) {
    // Ties to even (1 + 2^-11 -> 1, 1 + 3 * 2^-11 -> 1 + 2^-9), just above a tie, the largest
    // finite value and what rounds past it (clamped), subnormals and their ties, zeros, and an
    // odd count, so the last 4-byte word of the copy holds one weight.
    std::vector<float> w = {1.0f + 0x1p-11f,
                            1.0f + 3 * 0x1p-11f,
                            1.0f + 0x1p-11f + 0x1p-20f,
                            -(1.0f + 0x1p-11f),
                            65504.0f,
                            65519.0f,
                            65520.0f,
                            1e6f,
                            -1e6f,
                            0x1p-24f,
                            0x1p-25f,
                            1.5f * 0x1p-24f,
                            2.5f * 0x1p-24f,
                            0x1p-14f - 0x1p-26f,
                            6.1e-5f,
                            0.0f,
                            -0.0f,
                            3.14159265f,
                            -2.71828182f};
    for (float v : normal(30, 10.0)) w.push_back(v);
    const int64_t N = static_cast<int64_t>(w.size());
    ASSERT_EQ(N % 2, 1);
    // K = 1 and a = 1: out[m, n] is the weight as the shader read it. M = 1 takes the
    // matrix-vector shader, M = 5 the tiled one.
    for (int64_t M : {1, 5}) {
        SCOPED_TRACE("M " + std::to_string(M));
        Tensor out = vk().alloc({M, N});
        vk().linear(up(vk(), std::vector<float>(M, 1.0f), {M, 1}), up(vk(), w, {N, 1}), Tensor{},
                    out);
        const auto got = down(vk(), out);
        for (int64_t m = 0; m < M; ++m)
            for (int64_t n = 0; n < N; ++n) {
                const float want = round_fp16(w[n]), g = got[m * N + n];
                // A driver may flush fp16 subnormals to zero when widening them.
                const bool flushed = std::abs(want) < 0x1p-14f && g == 0.0f;
                EXPECT_TRUE(g == want || flushed)
                    << "weight " << w[n] << ": got " << g << ", want " << want;
            }
    }
}

TEST_F(VulkanFp16, MatmulDecodeAndTiledShapes) {
    SCOPED_TRACE(trace());
    struct Case {
        int64_t M, N, K;
    };
    // M 1..16: the matrix-vector shader; 17+: tiled; 300 x 257: the large tiles; odd sizes leave
    // partial tiles and an odd weight count.
    for (Case c : {Case{1, 3001, 63}, Case{4, 1001, 257}, Case{2, 7, 1}, Case{5, 129, 65},
                   Case{16, 65, 66}, Case{17, 129, 65}, Case{300, 257, 129}, Case{129, 65, 301}})
        for (int form = 0; form < 5; ++form) {
            const bool linear = form == 4, ta = (form & 1) != 0, tb = (form & 2) != 0;
            SCOPED_TRACE("M,N,K " + std::to_string(c.M) + "," + std::to_string(c.N) + "," +
                         std::to_string(c.K) +
                         (linear
                              ? " linear"
                              : " matmul ta " + std::to_string(ta) + " tb " + std::to_string(tb)));
            const Results r = matmul_all(c.M, c.N, c.K, ta, tb, linear);
            if (linear) {  // a linear layer: fp16 weights
                EXPECT_TRUE(Close(r.vk, r.cpu_rounded, reduction_tol(c.K)));
                EXPECT_TRUE(Close(r.vk, r.cpu, fp16_tol(c.K)));
            } else {  // matmul names no weight: fp32, whatever the transposition
                EXPECT_TRUE(Close(r.vk, r.cpu, reduction_tol(c.K)));
            }
        }
}

TEST_F(VulkanFp16, GroupedMatmulDecodeAndTiled) {
    SCOPED_TRACE(trace());
    struct Case {
        int64_t K, Nout;
        std::vector<int32_t> counts;
    };
    const Case cases[] = {
        {64, 131, {0, 1, 0, 0, 0, 1, 0, 0}},  // one token, top-2: matrix-vector
        {33, 17, {0, 0, 1}},                  // one token, last expert, odd sizes
        {65, 33, {8, 0, 0, 0}},               // matrix-vector, one expert has all
        {64, 35, {2, 3, 1, 2, 0, 4, 2, 2}},   // eight tokens, top-2: matrix-vector
        {65, 33, {0, 0, 33, 0}},              // tiled, one expert has all
        {129, 71, {0, 100, 3, 0, 64, 65, 0, 1}},
    };
    for (const Case& c : cases) {
        const int64_t E = static_cast<int64_t>(c.counts.size());
        const std::vector<int32_t> offsets = expert_offsets(c.counts);
        const int64_t S = offsets[E];
        SCOPED_TRACE("S " + std::to_string(S) + " K " + std::to_string(c.K) + " Nout " +
                     std::to_string(c.Nout));
        auto x = normal(S * c.K), w = normal(E * c.Nout * c.K), bias = normal(E * c.Nout);
        auto run = [&](Backend& be, const std::vector<float>& weights) {
            Tensor out = be.alloc({S, c.Nout});
            be.grouped_matmul(up(be, x, {S, c.K}), up(be, weights, {E, c.Nout, c.K}),
                              up(be, bias, {E, c.Nout}), up_ids(be, offsets, {E + 1}), out);
            return down(be, out);
        };
        const auto got = run(vk(), w);
        EXPECT_TRUE(Close(got, run(cpu(), rounded(w)), reduction_tol(c.K)));
        EXPECT_TRUE(Close(got, run(cpu(), w), fp16_tol(c.K)));
    }
}

// Forward (logits, loss, aux) and cached decoding of the three small configs. On weights that
// are already fp16 values the copies are exact, so Vulkan must match the CPU as closely as the
// fp32 path does (vulkan_model_test.cpp), the router's choices included. On the original
// weights, each logit carries the fp16 error of every matmul on its path, at most ~u relative
// each (fp16_tol's argument; layer norms rescale, they do not amplify): 2 layers of q/k/v/o,
// router and 2-3 FFN matmuls, and the LM head, at most ~16, with independent signs: 10u
// (~5e-3) holds with room (lavapipe measures ~1e-4: these logits are small against Close()'s
// floor of 1). The router's choices happen not to be near ties for these weights and tokens.
TEST_F(VulkanFp16, ModelForwardAndCachedDecodingMatchCpu) {
    for (const char* name : {"test-tiny", "test-tiny-swiglu", "test-tiny-dense"})
        for (bool fp16_valued : {true, false}) {
            SCOPED_TRACE(std::string(name) +
                         (fp16_valued ? ", fp16-valued weights" : ", fp32 weights"));
            const double tol = fp16_valued ? 1e-4 : 10 * kU;
            const ModelConfig config =
                load_config(source_dir() + "/assets/configs/" + name + ".json");
            Model on_cpu(config, cpu()), on_vk(config, vk());
            on_cpu.init_random(7);
            std::vector<float> params = on_cpu.params_to_host();
            if (fp16_valued) params = rounded(params);
            on_cpu.params_from_host(params);
            on_vk.params_from_host(params);

            const int64_t B = 2, T = 12;
            std::vector<int32_t> tokens(B * T), targets(B * T);
            for (int64_t i = 0; i < B * T; ++i) {
                tokens[i] = static_cast<int32_t>((i * 37 + 11) % config.vocab_size);
                targets[i] =
                    i % T == T - 1 ? -1 : static_cast<int32_t>((i * 53 + 5) % config.vocab_size);
            }
            ForwardResult want = on_cpu.forward(tokens, B, T, &targets);
            ForwardResult got = on_vk.forward(tokens, B, T, &targets);
            EXPECT_TRUE(Close(down(vk(), got.logits), down(cpu(), want.logits), tol));
            EXPECT_NEAR(got.loss, want.loss, tol * want.loss);
            EXPECT_NEAR(got.aux, want.aux, tol * std::max(1.0, want.aux));

            KvCache cache_cpu(config, cpu(), 1), cache_vk(config, vk(), 1);
            for (int64_t p = 0; p < T;) {
                const int64_t n = p == 0 ? 5 : 1;
                SCOPED_TRACE("positions " + std::to_string(p) + ".." + std::to_string(p + n - 1));
                std::vector<int32_t> chunk(tokens.begin() + p, tokens.begin() + p + n);
                const std::vector<int32_t> start{static_cast<int32_t>(p)};
                Tensor lc = on_cpu.forward_cached(chunk, 1, n, start, cache_cpu);
                Tensor lv = on_vk.forward_cached(chunk, 1, n, start, cache_vk);
                EXPECT_TRUE(Close(down(vk(), lv), down(cpu(), lc), tol));
                p += n;
            }
        }
}

// Writes to a weight, recorded in the same submit as the matmuls around them, are seen by the
// next matmul: an upload, a fill of part of it, an op writing part of it (the same buffer
// range the copy was made from, or overlapping it). Uses without a write reuse the copy.
TEST_F(VulkanFp16, WritesToAWeightAreSeenByTheNextMatmul) {
    SCOPED_TRACE(trace());
    const int64_t M = 2, N = 37, K = 21;
    auto a = normal(M * K), w1 = normal(N * K), w2 = normal(N * K);
    Tensor at = up(vk(), a, {M, K}), w = up(vk(), w1, {N, K});
    std::vector<Tensor> outs;
    auto matmul = [&] {
        outs.push_back(vk().alloc({M, N}));
        vk().linear(at, w, Tensor{}, outs.back());
    };
    matmul();  // 0: w1
    const uint64_t dispatches = vk().counters().dispatches;
    matmul();  // 1: w1, the copy reused: one dispatch, no conversion
    EXPECT_EQ(vk().counters().dispatches, dispatches + 1);
    vk().upload(w, w2.data());
    matmul();  // 2: w2
    Tensor rows = w.rows(3, 5);
    vk().fill(rows, 0.25f);
    matmul();  // 3: w2 with rows 3, 4 = 0.25
    Tensor part = w.reshape({N * K}).slice(10, {K});
    vk().add(part, part, part);
    matmul();  // 4: and elements 10 .. 10 + K doubled
    EXPECT_EQ(vk().fp16_weight_copies(), 1u);

    std::vector<float> w3 = w2, w4;
    for (int64_t i = 3 * K; i < 5 * K; ++i) w3[i] = 0.25f;
    w4 = w3;
    for (int64_t i = 10; i < 10 + K; ++i) w4[i] *= 2;
    const std::vector<float>* expected[] = {&w1, &w1, &w2, &w3, &w4};
    for (size_t i = 0; i < outs.size(); ++i) {
        SCOPED_TRACE("matmul " + std::to_string(i));
        Tensor want = cpu().alloc({M, N});
        cpu().matmul(up(cpu(), a, {M, K}), up(cpu(), rounded(*expected[i]), {N, K}), want,
                     {.trans_b = true});
        EXPECT_TRUE(Close(down(vk(), outs[i]), down(cpu(), want), reduction_tol(K)));
    }
}

// One copy serves a weight and its parts (the fused QKV weight [3N, K] and its q, k, v views),
// in either order of first use: a part starting at an even element reads the whole's copy (no
// conversion), and a whole made after its parts takes over their copies. A part at an odd
// element cannot start on a word of the copy and gets its own. A write to one part drops the
// shared copy, and every view then reads the new values.
TEST_F(VulkanFp16, AWeightAndItsPartsShareOneCopy) {
    SCOPED_TRACE(trace());
    const int64_t M = 3, N = 6, K = 11;  // parts of N * K = 66 elements: even offsets
    const std::vector<float> a = normal(M * K);
    std::vector<float> w = normal(3 * N * K);
    Tensor at = up(vk(), a, {M, K});
    for (const bool whole_first : {true, false}) {
        SCOPED_TRACE(whole_first ? "the whole first" : "the parts first");
        Tensor whole = up(vk(), w, {3 * N, K});
        const Tensor parts[] = {whole.rows(0, N), whole.rows(N, 2 * N), whole.rows(2 * N, 3 * N)};
        // linear(a, view) on Vulkan against the CPU on the rounded weights of those rows; the
        // dispatches it took (1: the matmul; 2: a conversion too).
        auto check = [&](const Tensor& view, int64_t first_row, const std::vector<float>& weights) {
            const int64_t rows = view.dim(0);
            Tensor out = vk().alloc({M, rows});
            const uint64_t before = vk().counters().dispatches;
            vk().linear(at, view, Tensor{}, out);
            const uint64_t took = vk().counters().dispatches - before;
            const std::vector<float> part(weights.begin() + first_row * K,
                                          weights.begin() + (first_row + rows) * K);
            Tensor want = cpu().alloc({M, rows});
            cpu().linear(up(cpu(), a, {M, K}), up(cpu(), rounded(part), {rows, K}), Tensor{}, want);
            EXPECT_TRUE(Close(down(vk(), out), down(cpu(), want), reduction_tol(K)))
                << "rows " << first_row << " .. " << first_row + rows;
            return took;
        };
        if (whole_first) {
            EXPECT_EQ(check(whole, 0, w), 2u);
        } else {
            for (int i = 0; i < 3; ++i) EXPECT_EQ(check(parts[i], i * N, w), 2u) << "part " << i;
            EXPECT_EQ(vk().fp16_weight_copies(), 3u);
            EXPECT_EQ(check(whole, 0, w), 2u);
        }
        EXPECT_EQ(vk().fp16_weight_copies(), 1u);
        for (int i = 0; i < 3; ++i) EXPECT_EQ(check(parts[i], i * N, w), 1u) << "part " << i;
        EXPECT_EQ(check(whole, 0, w), 1u);
        EXPECT_EQ(vk().fp16_weight_copies(), 1u);

        // Rows 1 .. N + 1 start at element K = 11, odd: a copy of their own.
        EXPECT_EQ(check(whole.rows(1, N + 1), 1, w), 2u);
        EXPECT_EQ(vk().fp16_weight_copies(), 2u);

        // New values in the second part: the copies overlapping it go, and every view reads them.
        std::vector<float> w2 = w;
        const std::vector<float> fresh = normal(N * K);
        std::copy(fresh.begin(), fresh.end(), w2.begin() + N * K);
        vk().upload(parts[1], fresh.data());
        EXPECT_EQ(vk().fp16_weight_copies(), 0u);
        EXPECT_EQ(check(parts[1], N, w2), 2u);
        EXPECT_EQ(check(whole, 0, w2), 2u);
        EXPECT_EQ(check(parts[2], 2 * N, w2), 1u);
        w = normal(3 * N * K);  // the next round's weights
        vk().synchronize();
    }
}

// Model::params_from_host uploads new weights into the same parameter buffer: the next
// forward uses them.
TEST_F(VulkanFp16, NewModelParametersAreSeen) {
    const ModelConfig config = load_config(source_dir() + "/assets/configs/test-tiny.json");
    Model on_cpu(config, cpu()), on_vk(config, vk());
    const std::vector<int32_t> tokens = {1, 5, 9, 42, 7, 3};
    for (uint64_t seed : {7, 8}) {
        SCOPED_TRACE("seed " + std::to_string(seed));
        on_cpu.init_random(seed);
        const std::vector<float> params = rounded(on_cpu.params_to_host());
        on_cpu.params_from_host(params);
        on_vk.params_from_host(params);
        ForwardResult want = on_cpu.forward(tokens, 1, 6, nullptr);
        ForwardResult got = on_vk.forward(tokens, 1, 6, nullptr);
        EXPECT_TRUE(Close(down(vk(), got.logits), down(cpu(), want.logits), 1e-4));
    }
}

TEST_F(VulkanFp16, CopiesAreFreedWithTheirBuffer) {
    auto use_and_free = [&] {
        Tensor x = up(vk(), normal(3 * 16), {3, 16}), out = vk().alloc({3, 8});
        Tensor w = up(vk(), normal(8 * 16), {8, 16});
        vk().linear(x, w, Tensor{}, out);
        Tensor xs = up(vk(), normal(2 * 16), {2, 16}), ys = vk().alloc({2, 8});
        Tensor experts = up(vk(), normal(2 * 8 * 16), {2, 8, 16});
        vk().grouped_matmul(xs, experts, Tensor{}, up_ids(vk(), std::vector<int32_t>{0, 1, 2}, {3}),
                            ys);
        vk().synchronize();
        EXPECT_EQ(vk().fp16_weight_copies(), 2u);
    };
    use_and_free();  // the first run also allocates the stream's staging memory, which stays
    EXPECT_EQ(vk().fp16_weight_copies(), 0u);
    const size_t ranges = vk().allocator_stats().live_ranges;
    use_and_free();
    EXPECT_EQ(vk().fp16_weight_copies(), 0u);
    EXPECT_EQ(vk().allocator_stats().live_ranges, ranges);
}

// With the option off the fp32 shaders run.
class VulkanFp32 : public VulkanFp16 {
  protected:
    vk::VulkanOptions options() const override { return {.fp16_weights = false}; }
    void SetUp() override { VulkanTest::SetUp(); }
};

TEST_F(VulkanFp32, WithTheOptionOffTheFp32PathRuns) {
    SCOPED_TRACE(trace());
    ASSERT_FALSE(vk().fp16_weights());
    for (int64_t M : {2, 70}) {  // matrix-vector and tiled
        const Results r = matmul_all(M, 131, 257, false, true);
        EXPECT_TRUE(Close(r.vk, r.cpu, reduction_tol(257)));
    }
    EXPECT_EQ(vk().fp16_weight_copies(), 0u);
}

TEST(VulkanFp16Choice, OptionThenEnvironmentThenOn) {
    const char* saved = std::getenv("TMX_VULKAN_FP16");
    const std::string saved_value = saved ? saved : "";
    unsetenv("TMX_VULKAN_FP16");
    EXPECT_TRUE(vk::use_fp16_weights());  // the default, on every device
    EXPECT_FALSE(vk::use_fp16_weights(false));
    EXPECT_TRUE(vk::use_fp16_weights(true));
    setenv("TMX_VULKAN_FP16", "0", 1);
    EXPECT_FALSE(vk::use_fp16_weights());
    EXPECT_TRUE(vk::use_fp16_weights(true));  // the option wins
    setenv("TMX_VULKAN_FP16", "1", 1);
    EXPECT_TRUE(vk::use_fp16_weights());
    EXPECT_FALSE(vk::use_fp16_weights(false));  // the option wins
    setenv("TMX_VULKAN_FP16", "yes", 1);
    EXPECT_THROW(vk::use_fp16_weights(), Error);
    if (saved)
        setenv("TMX_VULKAN_FP16", saved_value.c_str(), 1);
    else
        unsetenv("TMX_VULKAN_FP16");
}

}  // namespace
}  // namespace tmx::test

#endif  // TMX_HAS_VULKAN

// cpu_weight_matmul_nt: fp32 activations times weights stored in bf16, f16 and Q8_0, against a
// double-precision reference on the decoded (dequantized) weights.
//
// bf16 and f16 weights are widened exactly, so the result is an fp32 GEMM's: within fp32
// summation error of the reference. Q8_0 also quantizes each row of x to Q8 blocks (scale
// dx = max|x| / 127), so each x_k may move by half a step, dx / 2: the error is bounded by
// sum over blocks of d_w * sum |q_w| * dx / 2, plus fp32 rounding. With x exactly on its Q8 grid
// only the rounding remains, which shows that the bound is not loose by accident. Every Q8_0
// instruction-set path must give the Portable path's bits, every bf16 and f16 path is held to
// the reference, and no result may depend on the thread count.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "engine/compute/precision.h"
#include "engine/compute/weight_format.h"
#include "tests/test_util.h"

namespace tmx {
namespace {

constexpr double kUnitRoundoff = 0x1p-24;

// The seeds of a test's random inputs: fresh ones each run (TMX_TEST_SEED replays them), a few
// for the sweeps over sizes.
std::vector<uint64_t> seeds(int count) {
    const uint64_t first = test::fresh_seed();
    std::vector<uint64_t> all;
    for (int i = 0; i < count; ++i) all.push_back(first + static_cast<uint64_t>(i));
    return all;
}

// Restores the weight kernels' instruction-set path in use at scope exit.
class WeightPathRestorer {
  public:
    WeightPathRestorer() : saved_(cpu_weight_path()) {}
    ~WeightPathRestorer() { cpu_set_weight_path(saved_); }

  private:
    CpuWeightPath saved_;
};

// Restores OpenMP's thread count at scope exit.
class ThreadCountRestorer {
  public:
    ThreadCountRestorer() : saved_(omp_get_max_threads()) {}
    ~ThreadCountRestorer() { omp_set_num_threads(saved_); }

  private:
    int saved_;
};

std::string dims(int64_t M, int64_t N, int64_t K) {
    return "M,N,K = " + std::to_string(M) + "," + std::to_string(N) + "," + std::to_string(K);
}

std::vector<uint8_t> encoded(DType format, const std::vector<float>& w) {
    std::vector<uint8_t> bytes(static_cast<size_t>(dtype_bytes(format, std::ssize(w))));
    encode_weights(format, w.data(), std::ssize(w), bytes.data());
    return bytes;
}

std::vector<float> decoded(DType format, const std::vector<uint8_t>& bytes, int64_t n) {
    std::vector<float> w(static_cast<size_t>(n));
    decode_weights(format, bytes.data(), n, w.data());
    return w;
}

std::vector<float> run(DType format, int64_t M, int64_t N, int64_t K, const std::vector<float>& x,
                       const std::vector<uint8_t>& w, float beta, std::vector<float> y) {
    cpu_weight_matmul_nt(format, M, N, K, x.data(), w.data(), beta, y.data());
    return y;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// y starts as random values (beta 1 adds onto them) or NaN (beta 0 must not read them).
std::vector<float> initial_y(Rng& rng, int64_t n, float beta) {
    if (beta == 0.0f) return std::vector<float>(static_cast<size_t>(n), NAN);
    return test::random_normal(rng, static_cast<size_t>(n));
}

// The reference in double on the decoded weights, with each output's sum of |terms| for its
// rounding bound.
struct Reference {
    std::vector<double> y, abs_sum;
};
Reference reference(int64_t M, int64_t N, int64_t K, const std::vector<float>& x,
                    const std::vector<float>& w, float beta, const std::vector<float>& y0) {
    Reference r{std::vector<double>(static_cast<size_t>(M * N)),
                std::vector<double>(static_cast<size_t>(M * N))};
    for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
            double dot = 0.0, abs_sum = 0.0;
            for (int64_t k = 0; k < K; ++k) {
                const double t = double{x[m * K + k]} * double{w[n * K + k]};
                dot += t;
                abs_sum += std::abs(t);
            }
            const double old = beta == 0.0f ? 0.0 : double{beta} * y0[m * N + n];
            r.y[m * N + n] = dot + old;
            r.abs_sum[m * N + n] = abs_sum + std::abs(old);
        }
    return r;
}

// x's Q8 quantization error bound for output (m, n): per block, d_w * sum|q_w| * dx / 2.
double q8_bound(int64_t m, int64_t n, int64_t K, const std::vector<float>& x,
                const std::vector<uint8_t>& w) {
    double bound = 0.0;
    for (int64_t b = 0; b < K / kQ8_0BlockValues; ++b) {
        const float* xb = x.data() + m * K + b * kQ8_0BlockValues;
        double amax = 0.0;
        for (int64_t j = 0; j < kQ8_0BlockValues; ++j)
            amax = std::max(amax, std::abs(double{xb[j]}));
        const uint8_t* blk = w.data() + (n * K / kQ8_0BlockValues + b) * kQ8_0BlockBytes;
        uint16_t d;
        std::memcpy(&d, blk, 2);
        double abs_q = 0.0;
        for (int64_t j = 0; j < kQ8_0BlockValues; ++j)
            abs_q += std::abs(static_cast<int8_t>(blk[2 + j]));
        // dx is computed in fp32: allow it a little above max|x| / 127.
        bound += std::abs(double{f16_to_f32(d)}) * abs_q * (amax / 127.0) * (0.5 + 1e-6);
    }
    return bound;
}

// fp32 summation error of an output with `terms` terms whose |values| sum to abs_sum: a few
// roundings per term (products, sums, Q8's scale products) in any order.
double rounding_bound(int64_t terms, double abs_sum) {
    return 4.0 * static_cast<double>(terms + 4) * kUnitRoundoff * abs_sum + 1e-30;
}

// ---- bf16 and f16 ----

// On every instruction-set path this CPU has (portable, AVX2 + F16C, AVX-512): each sums in
// its own order, so each is held to the reference, not to another path's bits.
TEST(CpuWeightMatmul, WideFormatsMatchAnFp32GemmOnTheWidenedWeights) {
    WeightPathRestorer restore;
    for (uint64_t seed : seeds(2)) {
        SCOPED_TRACE("seed " + std::to_string(seed));
        Rng rng(seed);
        for (CpuWeightPath path : cpu_weight_paths_available())
            for (DType format : {DType::BF16, DType::F16})
                for (int64_t M : {1, 3, 8, 16, 17, 40})
                    for (int64_t N : {1, 5, 67, 130})
                        for (int64_t K :
                             {1, 7, 100, 257, 1029})  // 1029: chunks of 512 or 1024, a tail
                            for (float beta : {0.0f, 1.0f}) {
                                SCOPED_TRACE(std::string(to_string(path)) + " " +
                                             to_string(format) + " " + dims(M, N, K) + " beta " +
                                             std::to_string(beta));
                                cpu_set_weight_path(path);
                                const auto x = test::random_normal(rng, static_cast<size_t>(M * K));
                                const auto w = encoded(
                                    format, test::random_normal(rng, static_cast<size_t>(N * K)));
                                const auto y0 = initial_y(rng, M * N, beta);
                                const auto y = run(format, M, N, K, x, w, beta, y0);
                                const Reference ref =
                                    reference(M, N, K, x, decoded(format, w, N * K), beta, y0);
                                int failures = 0;
                                for (int64_t i = 0; i < M * N && failures < 5; ++i) {
                                    const double err = std::abs(y[i] - ref.y[i]);
                                    const double tol = rounding_bound(K, ref.abs_sum[i]);
                                    if (!(err <= tol)) {
                                        ++failures;
                                        ADD_FAILURE() << "output " << i << ": " << y[i] << " vs "
                                                      << ref.y[i] << " (tolerance " << tol << ")";
                                    }
                                }
                            }
    }
}

TEST(CpuWeightMatmul, WideFormatsHandComputed) {
    // x = [2, 3, 4], w = [1.5, -2, 0.25]: 3 - 6 + 1 = -2; with beta 1 onto 10: 8.
    const std::vector<float> x = {2.0f, 3.0f, 4.0f};
    const std::vector<uint16_t> bf16 = {0x3FC0, 0xC000, 0x3E80}, f16 = {0x3E00, 0xC000, 0x3400};
    for (const auto& [format, bits] : {std::pair{DType::BF16, bf16}, std::pair{DType::F16, f16}}) {
        SCOPED_TRACE(to_string(format));
        float y = NAN;
        cpu_weight_matmul_nt(format, 1, 1, 3, x.data(), bits.data(), 0.0f, &y);
        EXPECT_EQ(y, -2.0f);
        y = 10.0f;
        cpu_weight_matmul_nt(format, 1, 1, 3, x.data(), bits.data(), 1.0f, &y);
        EXPECT_EQ(y, 8.0f);
    }
}

// ---- Q8_0 ----

// Random Q8_0 weights (quants within [-127, 127], as quantize_q8_0 writes them), rows of
// different magnitudes.
std::vector<uint8_t> random_q8_weights(Rng& rng, int64_t N, int64_t K) {
    std::vector<float> w = test::random_normal(rng, static_cast<size_t>(N * K));
    for (int64_t n = 0; n < N; ++n) {
        const float scale = std::ldexp(1.0f, static_cast<int>(rng.below(8)) - 4);
        for (int64_t k = 0; k < K; ++k) w[n * K + k] *= scale;
    }
    return encoded(DType::Q8_0, w);
}

TEST(CpuWeightMatmul, Q8WithinTheBoundOfQuantizingX) {
    double largest_share = 0.0;  // of the quantization bound that an error reached
    for (uint64_t seed : seeds(2)) {
        SCOPED_TRACE("seed " + std::to_string(seed));
        Rng rng(seed);
        for (int64_t M : {1, 3, 8, 16, 17, 40})
            for (int64_t N : {1, 5, 67, 130})
                for (int64_t K : {32, 64, 96, 416})
                    for (float beta : {0.0f, 1.0f}) {
                        SCOPED_TRACE(dims(M, N, K) + " beta " + std::to_string(beta));
                        const auto x = test::random_normal(rng, static_cast<size_t>(M * K));
                        const auto w = random_q8_weights(rng, N, K);
                        const auto y0 = initial_y(rng, M * N, beta);
                        const auto y = run(DType::Q8_0, M, N, K, x, w, beta, y0);
                        const Reference ref =
                            reference(M, N, K, x, decoded(DType::Q8_0, w, N * K), beta, y0);
                        int failures = 0;
                        for (int64_t m = 0; m < M; ++m)
                            for (int64_t n = 0; n < N && failures < 5; ++n) {
                                const int64_t i = m * N + n;
                                const double quantization = q8_bound(m, n, K, x, w);
                                const double tol =
                                    quantization + rounding_bound(K, ref.abs_sum[i] + quantization);
                                const double err = std::abs(y[i] - ref.y[i]);
                                largest_share = std::max(largest_share, err / quantization);
                                if (!(err <= tol)) {
                                    ++failures;
                                    ADD_FAILURE()
                                        << "output " << m << "," << n << ": " << y[i] << " vs "
                                        << ref.y[i] << " (tolerance " << tol << ")";
                                }
                            }
                    }
    }
    // x really is quantized: the errors reach a fair share of the bound (a bound far above
    // every error would check little).
    EXPECT_GT(largest_share, 0.02);
}

// x = dx * integers with dx a power of two and 127 in every block: Q8 represents x exactly, so
// only fp32 rounding remains, far below the quantization bound.
TEST(CpuWeightMatmul, Q8IsExactToFp32RoundingWhenXIsOnItsGrid) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    Rng rng(seed);
    WeightPathRestorer restore;
    const int64_t M = 5, N = 67, K = 416;
    std::vector<int32_t> ints = test::random_ints(rng, static_cast<size_t>(M * K), -127, 128);
    std::vector<float> x(ints.size());
    for (size_t b = 0; b < ints.size() / kQ8_0BlockValues; ++b) {
        int32_t* q = ints.data() + b * kQ8_0BlockValues;
        q[rng.below(kQ8_0BlockValues)] = rng.below(2) ? 127 : -127;
        const int exponent = -static_cast<int>(rng.below(12));  // dx = 2^exponent
        for (size_t j = 0; j < kQ8_0BlockValues; ++j)
            x[b * kQ8_0BlockValues + j] = std::ldexp(static_cast<float>(q[j]), exponent);
    }
    const auto w = random_q8_weights(rng, N, K);
    const Reference ref = reference(M, N, K, x, decoded(DType::Q8_0, w, N * K), 0.0f, {});
    for (CpuWeightPath path : cpu_weight_paths_available()) {
        SCOPED_TRACE(to_string(path));
        cpu_set_weight_path(path);
        const auto y = run(DType::Q8_0, M, N, K, x, w, 0.0f, std::vector<float>(M * N, NAN));
        for (int64_t m = 0; m < M; ++m)
            for (int64_t n = 0; n < N; ++n) {
                const int64_t i = m * N + n;
                const double tol = rounding_bound(K / kQ8_0BlockValues, ref.abs_sum[i]);
                ASSERT_LE(std::abs(y[i] - ref.y[i]), tol) << "output " << m << "," << n;
                ASSERT_LT(tol * 100, q8_bound(m, n, K, x, w));
            }
    }
}

// One block by hand. Row 0: d = 0.5, q = [-3, 2, 2, ...]; row 1: d = -1, q = [1, 1, ...].
// x = [31.75, 1, 1, ...]: dx = 31.75 / 127 = 0.25, q_x = [127, 4, 4, ...], exact.
// Row 0: 0.5 * 0.25 * (-3 * 127 + 31 * 2 * 4) = 0.125 * -133 = -16.625.
// Row 1: -1 * 0.25 * (127 + 31 * 4) = -0.25 * 251 = -62.75.
TEST(CpuWeightMatmul, Q8HandComputed) {
    WeightPathRestorer restore;
    std::vector<uint8_t> w(2 * kQ8_0BlockBytes);
    const uint16_t half = 0x3800, minus_one = 0xBC00;
    std::memcpy(w.data(), &half, 2);
    std::memcpy(w.data() + kQ8_0BlockBytes, &minus_one, 2);
    for (int j = 0; j < 32; ++j) {
        w[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(j == 0 ? -3 : 2));
        w[kQ8_0BlockBytes + 2 + j] = 1;
    }
    std::vector<float> x(32, 1.0f);
    x[0] = 31.75f;
    for (CpuWeightPath path : cpu_weight_paths_available()) {
        SCOPED_TRACE(to_string(path));
        cpu_set_weight_path(path);
        std::vector<float> y = {NAN, NAN};
        cpu_weight_matmul_nt(DType::Q8_0, 1, 2, 32, x.data(), w.data(), 0.0f, y.data());
        EXPECT_EQ(y[0], -16.625f);
        EXPECT_EQ(y[1], -62.75f);
        y = {1.0f, 2.0f};
        cpu_weight_matmul_nt(DType::Q8_0, 1, 2, 32, x.data(), w.data(), 1.0f, y.data());
        EXPECT_EQ(y[0], -15.625f);
        EXPECT_EQ(y[1], -60.75f);
    }
}

TEST(CpuWeightMatmul, Q8PathsGiveThePortableBits) {
    WeightPathRestorer restore;
    const std::vector<CpuWeightPath> paths = cpu_weight_paths_available();
    ASSERT_EQ(paths.front(), CpuWeightPath::Portable);
    for (uint64_t seed : seeds(2)) {
        SCOPED_TRACE("seed " + std::to_string(seed));
        Rng rng(seed);
        for (int64_t M : {1, 3, 8, 16, 17, 40})
            for (int64_t N : {1, 5, 67, 130})
                for (int64_t K : {32, 64, 96, 416})
                    for (float beta : {0.0f, 1.0f}) {
                        SCOPED_TRACE(dims(M, N, K) + " beta " + std::to_string(beta));
                        const auto x = test::random_normal(rng, static_cast<size_t>(M * K));
                        const auto w = random_q8_weights(rng, N, K);
                        const auto y0 = initial_y(rng, M * N, beta);
                        cpu_set_weight_path(CpuWeightPath::Portable);
                        const auto want = run(DType::Q8_0, M, N, K, x, w, beta, y0);
                        for (CpuWeightPath path : paths) {
                            cpu_set_weight_path(path);
                            EXPECT_TRUE(same_bits(run(DType::Q8_0, M, N, K, x, w, beta, y0), want))
                                << to_string(path);
                        }
                    }
    }
}

// Quants of -128 (which quantize_q8_0 never writes, but other writers may): every path
// multiplies them exactly (the SIMD sign trick takes |-128| as the unsigned byte 128, and the
// activations' quants stay within [-127, 127]), so all paths agree and the result stays within
// the quantization bound of the exact reference.
TEST(CpuWeightMatmul, Q8QuantsOfMinus128AreExactOnEveryPath) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    Rng rng(seed);
    WeightPathRestorer restore;
    const int64_t M = 3, N = 9, K = 96;
    const auto x = test::random_normal(rng, static_cast<size_t>(M * K));
    auto w = random_q8_weights(rng, N, K);
    for (int64_t b = 0; b < N * K / kQ8_0BlockValues; ++b)
        for (int64_t j = 0; j < kQ8_0BlockValues; ++j)
            if (rng.below(3) == 0) w[b * kQ8_0BlockBytes + 2 + j] = 0x80;  // -128
    const Reference ref = reference(M, N, K, x, decoded(DType::Q8_0, w, N * K), 0.0f, {});
    cpu_set_weight_path(CpuWeightPath::Portable);
    const auto want = run(DType::Q8_0, M, N, K, x, w, 0.0f, std::vector<float>(M * N, NAN));
    for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
            const int64_t i = m * N + n;
            const double quantization = q8_bound(m, n, K, x, w);
            EXPECT_LE(std::abs(want[i] - ref.y[i]),
                      quantization + rounding_bound(K, ref.abs_sum[i] + quantization));
        }
    for (CpuWeightPath path : cpu_weight_paths_available()) {
        cpu_set_weight_path(path);
        EXPECT_TRUE(
            same_bits(run(DType::Q8_0, M, N, K, x, w, 0.0f, std::vector<float>(M * N, NAN)), want))
            << to_string(path);
    }
}

TEST(CpuWeightMatmul, Q8NonFiniteActivationsGiveNaN) {
    WeightPathRestorer restore;
    const std::vector<float> w(2 * 64, 127.0f / 256);  // d = 2^-8 exactly, q = 127
    const auto wq = encoded(DType::Q8_0, w);
    for (CpuWeightPath path : cpu_weight_paths_available()) {
        SCOPED_TRACE(to_string(path));
        cpu_set_weight_path(path);
        for (float bad : {NAN, INFINITY}) {
            std::vector<float> x(2 * 64, 1.0f);
            x[64 + 6] = bad;  // row 1's first block
            std::vector<float> y(4, 0.0f);
            cpu_weight_matmul_nt(DType::Q8_0, 2, 2, 64, x.data(), wq.data(), 0.0f, y.data());
            EXPECT_NEAR(y[0], 31.75f, 1e-4);  // 64 * 127 / 256
            EXPECT_NEAR(y[1], 31.75f, 1e-4);
            EXPECT_TRUE(std::isnan(y[2]) && std::isnan(y[3])) << y[2] << " " << y[3];
        }
    }
}

TEST(CpuWeightMatmul, PathChoice) {
    WeightPathRestorer restore;
    const std::vector<CpuWeightPath> paths = cpu_weight_paths_available();
    EXPECT_EQ(paths.front(), CpuWeightPath::Portable);
    EXPECT_EQ(cpu_weight_path(), paths.back());  // the best, unless a test failed to restore it
    EXPECT_TRUE(std::is_sorted(paths.begin(), paths.end()));
    for (CpuWeightPath p : {CpuWeightPath::Portable, CpuWeightPath::Avx2, CpuWeightPath::AvxVnni,
                            CpuWeightPath::Avx512, CpuWeightPath::Avx512Vnni}) {
        SCOPED_TRACE(to_string(p));
        if (std::find(paths.begin(), paths.end(), p) == paths.end()) {
            EXPECT_THROW(cpu_set_weight_path(p), std::logic_error);
        } else {
            cpu_set_weight_path(p);
            EXPECT_EQ(cpu_weight_path(), p);
        }
    }
    EXPECT_STREQ(to_string(CpuWeightPath::AvxVnni), "avx-vnni");
}

TEST(CpuWeightMatmul, Q8NeedsWholeBlocks) {
    std::vector<float> x(48, 1.0f), y(1);
    std::vector<uint8_t> w(64);
    EXPECT_THROW(cpu_weight_matmul_nt(DType::Q8_0, 1, 1, 48, x.data(), w.data(), 0.0f, y.data()),
                 std::invalid_argument);
}

// ---- every format ----

TEST(CpuWeightMatmul, NoDepthGivesBetaTimesY) {
    const std::vector<float> x;
    const std::vector<uint8_t> w;
    for (DType format : {DType::BF16, DType::F16, DType::Q8_0}) {
        SCOPED_TRACE(to_string(format));
        std::vector<float> y(6, NAN);
        cpu_weight_matmul_nt(format, 2, 3, 0, x.data(), w.data(), 0.0f, y.data());
        EXPECT_EQ(y, std::vector<float>(6, 0.0f));
        y = {1, 2, 3, 4, 5, 6};
        cpu_weight_matmul_nt(format, 2, 3, 0, x.data(), w.data(), 1.0f, y.data());
        EXPECT_EQ(y, (std::vector<float>{1, 2, 3, 4, 5, 6}));
    }
}

TEST(CpuWeightMatmul, ResultsDoNotDependOnTheThreadCount) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    Rng rng(seed);
    ThreadCountRestorer restore;
    struct Case {
        DType format;
        int64_t M, N, K;
    };
    // Large enough for the threads to start; M = 40: bf16 and f16 go through panels and sgemm.
    const Case cases[] = {{DType::BF16, 1, 1030, 257}, {DType::F16, 17, 130, 257},
                          {DType::BF16, 40, 300, 257}, {DType::F16, 40, 300, 100},
                          {DType::Q8_0, 1, 2051, 416}, {DType::Q8_0, 17, 130, 416},
                          {DType::Q8_0, 40, 301, 96}};
    for (const Case& c : cases) {
        SCOPED_TRACE(std::string(to_string(c.format)) + " " + dims(c.M, c.N, c.K));
        const auto x = test::random_normal(rng, static_cast<size_t>(c.M * c.K));
        const auto w = encoded(c.format, test::random_normal(rng, static_cast<size_t>(c.N * c.K)));
        const auto y0 = test::random_normal(rng, static_cast<size_t>(c.M * c.N));
        for (float beta : {0.0f, 1.0f}) {
            omp_set_num_threads(1);
            const auto want = run(c.format, c.M, c.N, c.K, x, w, beta, y0);
            for (int threads : {2, 3}) {
                omp_set_num_threads(threads);
                EXPECT_TRUE(same_bits(run(c.format, c.M, c.N, c.K, x, w, beta, y0), want))
                    << threads << " threads, beta " << beta;
            }
        }
    }
}

}  // namespace
}  // namespace tmx

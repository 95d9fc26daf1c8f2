// Matmuls against weights stored in bf16, f16 and Q8_0: the decode hot path, where every token
// reads every weight once, so the time is the weights' bytes over the memory bandwidth. The
// weights are read one row at a time, in order (a single stream: on Zen 5 one core reads it at
// twice the rate of four rows read side by side), and widened (bf16, f16) or multiplied as int8
// (Q8_0) in registers against a tile of rows of x; copying them to fp32 first would read them
// and then write and read four bytes per weight.
//
// The instruction sets are chosen at run time (CPUID) and the SIMD functions
// compiled with target attributes, so a portable build (TMX_NATIVE=OFF) has them too. No result
// depends on the thread count: each output is computed whole by one thread, in a fixed order.
//
// Q8_0 in exact integers: each row of x is quantized to blocks of 32 (fp32 scale dx =
// max|x| / 127, q = round(x / dx) in [-127, 127]), and each block's 32 products qw * qx are
// summed in int32 as 8 lane sums of 4 products (the layout of a 256-bit vpdpbusd). Every path
// computes those sums exactly, quants of -128 in the weights included (quantize_q8_0 never
// writes them; other writers may): AVX2 takes |qw| as an unsigned byte (128 fits) times qx with
// qw's sign (|qx| <= 127, so negating it is exact), and its int16 pair sums reach at most
// 2 * 128 * 127 < 32767, so vpmaddubsw never saturates; the VNNI paths multiply qx + 128 (an
// unsigned byte) by qw and take 128 * sum(qw) off again. (llama.cpp's sign trick has the same
// exactness; what it cannot take is an activation quant of -128, which ours never are.) The
// float arithmetic is one fixed order for every path, so all paths give the same bits:
//   acc[b % 2][lane] = fma(d_w[b] * dx[b], float(lane sum), acc[b % 2][lane]) for the blocks b
//   in order, then y = the sum of acc[0] + acc[1]'s lanes as (j + j+4), then (0 + 2) + (1 + 3).
#if defined(__x86_64__) || defined(__i386__)
#define TMX_X86 1
#include <cpuid.h>
#include <immintrin.h>
#endif

#include <algorithm>
#include <atomic>
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

// GCC 12's AVX-512 intrinsics warn of their own deliberately undefined values (GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace tmx {
namespace {

constexpr int64_t kBlock = kQ8_0BlockValues, kBlockBytes = kQ8_0BlockBytes;
// Threads only for a product of 256K multiply-adds or more: below, waking them costs more
// than the work.
constexpr int64_t kParallelWork = int64_t{1} << 18;
// bf16 and f16 rows are read in chunks of this many values (a multiple of 32, or all K) so
// that the chunk of x they meet stays in L1, but as long as that allows: each chunk costs a
// round trip of the accumulators through memory (measured on Zen 5, 48 KiB L1: M = 8 runs 15%
// faster with 1024 than with 512, M = 16 60% slower). Up to 3 rows of x, whole rows.
int64_t wide_chunk(int64_t M, int64_t K) {
    return M < 4 ? std::max<int64_t>(K, 1) : M <= 8 ? 1024 : 512;
}
// Above kSmallGemmRows rows of x (prefill), bf16 and f16 weights are widened a panel of up to
// kPanelRows rows at a time and multiplied by OpenBLAS (cpu_sgemm), whose blocking beats the
// one-pass kernel from about 24 rows of x on (measured with 16 to 512). Q8_0 keeps its int8
// kernel at any M: at M = 512 it runs 1.2 to 1.5 times as fast as OpenBLAS's sgemm on fp32
// weights, and it keeps the same arithmetic, so a row's result does not depend on M.
constexpr int64_t kPanelRows = 128;

float load_f16(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return f16_to_f32(h);
}

float* align_to_cache_line(float* p) {
    const auto address = reinterpret_cast<uintptr_t>(p);
    return p + (((address + 63) & ~uintptr_t{63}) - address) / sizeof(float);
}

// y = dot + beta * y, shared by every path so that they round alike (beta 0: y is not read).
inline void store_output(float* y, float dot, float beta) {
    *y = beta == 0.0f ? dot : std::fma(beta, *y, dot);
}

// Outputs are computed for kOutputBlock weight rows at a time and then stored a row of y at a
// time: storing each weight row's column of y at once would touch M cache lines (and, N apart,
// as many pages) for M values.
constexpr int64_t kOutputBlock = 16;
// dots [rows, M] into y [M, N] at columns n0 .. n0 + rows.
void store_outputs(const float* dots, int64_t M, int64_t rows, int64_t n0, int64_t N, float beta,
                   float* y) {
    for (int64_t m = 0; m < M; ++m)
        for (int64_t r = 0; r < rows; ++r) store_output(&y[m * N + n0 + r], dots[r * M + m], beta);
}

// What this CPU runs, from CPUID (GCC's and clang's __builtin_cpu_supports know different
// feature names), each with the operating system's support for its registers (XCR0).
struct CpuFeatures {
    bool avx2_fma_f16c = false, avx_vnni = false, avx512_bw_vl = false, avx512_vnni = false;
};

CpuFeatures detect_cpu_features() {
    CpuFeatures f;
#ifdef TMX_X86
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
    const bool fma = c & (1u << 12), osxsave = c & (1u << 27), avx = c & (1u << 28),
               f16c = c & (1u << 29);
    if (!osxsave || !avx) return f;
    unsigned xcr0_low, xcr0_high;
    __asm__("xgetbv" : "=a"(xcr0_low), "=d"(xcr0_high) : "c"(0));
    const bool ymm_saved = (xcr0_low & 0x6u) == 0x6u;    // SSE and AVX state
    const bool zmm_saved = (xcr0_low & 0xe6u) == 0xe6u;  // and the AVX-512 state
    if (!ymm_saved || !__get_cpuid_count(7, 0, &a, &b, &c, &d)) return f;
    const bool avx2 = b & (1u << 5), avx512f = b & (1u << 16), avx512bw = b & (1u << 30),
               avx512vl = b & (1u << 31), avx512vnni = c & (1u << 11);
    f.avx2_fma_f16c = avx2 && fma && f16c;
    f.avx512_bw_vl = f.avx2_fma_f16c && zmm_saved && avx512f && avx512bw && avx512vl;
    f.avx512_vnni = f.avx512_bw_vl && avx512vnni;
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) f.avx_vnni = f.avx2_fma_f16c && (a & (1u << 4));
#endif
    return f;
}

const CpuFeatures& cpu_features() {
    static const CpuFeatures features = detect_cpu_features();
    return features;
}

// ---- Q8_0 ----
//
// One weight row at a time (as bf16 below: a single stream reads memory fastest), against a
// tile of rows of x whose accumulators stay in registers: each block of the row is loaded (and
// its sign or correction prepared) once for the whole tile.

// The rows of x quantized to Q8 blocks: q [M, K] and one fp32 scale a block. The VNNI paths
// take q + 128 (an unsigned byte, what vpdpbusd multiplies), the others q itself.
struct Q8Activations {
    int64_t blocks = 0;  // per row
    std::vector<int8_t> q;
    std::vector<float> scale;
};

// A block containing a NaN or an infinity gets a NaN scale, so that the outputs it touches are
// NaN (as an fp32 product's would be) rather than finite values from clamped integers. The
// rounding is roundf's (half away from zero) in integer steps that vectorize: |x / dx| <= 127.
void quantize_activations(const float* x, int64_t M, int64_t K, bool offset, Q8Activations& out) {
    out.blocks = K / kBlock;
    out.q.resize(static_cast<size_t>(M * K));
    out.scale.resize(static_cast<size_t>(M * out.blocks));
    const int64_t total_blocks = M * out.blocks;
    const int32_t flip = offset ? 0x80 : 0;
#pragma omp parallel for schedule(static) if (M * K >= (1 << 16))
    for (int64_t b = 0; b < total_blocks; ++b) {
        const float* xb = x + b * kBlock;
        int8_t* qb = out.q.data() + b * kBlock;
        // max|x| in 8 lanes (max is exact: any order gives the same), then across them.
        float lane_max[8] = {};
        int32_t non_finite = 0;
        for (int64_t j0 = 0; j0 < kBlock; j0 += 8)
            for (int64_t l = 0; l < 8; ++l) {
                const float a = std::fabs(xb[j0 + l]);
                lane_max[l] = std::max(lane_max[l], a);
                non_finite |= !(a <= std::numeric_limits<float>::max());  // NaN too
            }
        const float amax = *std::max_element(lane_max, lane_max + 8);
        const bool finite = non_finite == 0;
        const float d = amax / 127.0f;
        out.scale[b] = finite ? d : NAN;
        if (!finite || d == 0.0f) {
            std::fill(qb, qb + kBlock, static_cast<int8_t>(flip));  // q = 0
            continue;
        }
        for (int64_t j = 0; j < kBlock; ++j) {
            const float v = xb[j] / d;
            const int32_t t = static_cast<int32_t>(v);  // toward zero
            const float frac = v - static_cast<float>(t);
            const int32_t q = std::clamp(t + (frac >= 0.5f) - (frac <= -0.5f), -127, 127);
            qb[j] = static_cast<int8_t>(q ^ flip);
        }
    }
}

// One weight row against every row of x: dots[m] = the row . x[m].
struct Q8Row {
    int64_t M, blocks;
    const int8_t* qx;  // [M, blocks * 32]
    const float* dx;   // [M, blocks]
    const uint8_t* w;  // the row's blocks
    float* wscale;     // scratch: [blocks], the portable kernel's widened scales
    float* dots;       // [M]
};
using Q8Kernel = void (*)(const Q8Row&);

// The fixed reduction of the two accumulators' lanes (see the top of the file).
float reduce_lanes(const float even[8], const float odd[8]) {
    float v[8], v4[4];
    for (int j = 0; j < 8; ++j) v[j] = even[j] + odd[j];
    for (int j = 0; j < 4; ++j) v4[j] = v[j] + v[j + 4];
    return (v4[0] + v4[2]) + (v4[1] + v4[3]);
}

void q8_row_portable(const Q8Row& g) {
    for (int64_t b = 0; b < g.blocks; ++b) g.wscale[b] = load_f16(g.w + b * kBlockBytes);
    for (int64_t m = 0; m < g.M; ++m) {
        const int8_t* qx = g.qx + m * g.blocks * kBlock;
        const float* dx = g.dx + m * g.blocks;
        float acc[2][8] = {};
        for (int64_t b = 0; b < g.blocks; ++b) {
            const int8_t* qw = reinterpret_cast<const int8_t*>(g.w + b * kBlockBytes + 2);
            const float s = g.wscale[b] * dx[b];
            for (int j = 0; j < 8; ++j) {
                int32_t lane = 0;
                for (int i = 4 * j; i < 4 * j + 4; ++i)
                    lane += int32_t{qw[i]} * int32_t{qx[b * kBlock + i]};
                acc[b % 2][j] = std::fma(s, static_cast<float>(lane), acc[b % 2][j]);
            }
        }
        g.dots[m] = reduce_lanes(acc[0], acc[1]);
    }
}

#ifdef TMX_X86
#define TMX_AVX2 __attribute__((target("avx2,fma,f16c")))
#define TMX_AVXVNNI __attribute__((target("avx2,fma,f16c,avxvnni")))
#define TMX_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl")))
#define TMX_AVX512VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))

TMX_AVX2 inline float reduce8_avx(__m256 v) {
    const __m128 v4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 v2 = _mm_add_ps(v4, _mm_movehl_ps(v4, v4));  // (0 + 2), (1 + 3)
    return _mm_cvtss_f32(_mm_add_ss(v2, _mm_movehdup_ps(v2)));
}

TMX_AVX2 inline float reduce_lanes_avx(__m256 even, __m256 odd) {
    return reduce8_avx(_mm256_add_ps(even, odd));
}

TMX_AVX2 inline __m256i load_block(const uint8_t* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// A block's scale d (f16) in every lane.
TMX_AVX2 inline __m256 block_scale(const uint8_t* block) {
    uint16_t d;
    std::memcpy(&d, block, 2);
    return _mm256_set1_ps(_cvtsh_ss(d));
}

// A weight block prepared once for every row of x in the tile.
struct Q8Block256 {
    __m256i qw;     // the quants
    __m256i extra;  // AVX2: |qw|; AVX-VNNI: -128 * (sums of 4 quants), vpdpbusd's start
    __m256 scale;   // d_w in every lane
};

// AVX2: |qw| as unsigned bytes times qx with qw's sign, pairs summed to int16 (no saturation:
// see the top of the file), then pairs of those to int32.
struct Avx2Lanes {
    TMX_AVX2 static Q8Block256 prepare(const uint8_t* block) {
        const __m256i qw = load_block(block + 2);
        return {qw, _mm256_abs_epi8(qw), block_scale(block)};
    }
    TMX_AVX2 static __m256i lanes(const Q8Block256& w, __m256i qx) {
        const __m256i pairs = _mm256_maddubs_epi16(w.extra, _mm256_sign_epi8(qx, w.qw));
        return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
    }
};

// AVX-VNNI: vpdpbusd multiplies qx + 128 by qw, starting from -128 * sum(qw).
struct AvxVnniLanes {
    TMX_AVXVNNI static Q8Block256 prepare(const uint8_t* block) {
        const __m256i qw = load_block(block + 2);
        const __m256i sums = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(),
                                                     _mm256_set1_epi8(static_cast<char>(0x80)), qw);
        return {qw, _mm256_sub_epi32(_mm256_setzero_si256(), sums), block_scale(block)};
    }
    TMX_AVXVNNI static __m256i lanes(const Q8Block256& w, __m256i qx_offset) {
        return _mm256_dpbusd_avx_epi32(w.extra, qx_offset, w.qw);
    }
};

// The 256-bit kernels: Ms rows of x from m0, one block at a time, even and odd blocks into
// separate accumulators. A macro, as each needs its own target attribute.
#define TMX_Q8_TILE_256(NAME, TARGET, LANES)                                                       \
    template <int Ms>                                                                              \
    TARGET inline void NAME##_block(const Q8Row& g, int64_t m0, int64_t b, __m256(&acc)[Ms]) {     \
        const Q8Block256 w = LANES::prepare(g.w + b * kBlockBytes);                                \
        _Pragma("GCC unroll 8") for (int i = 0; i < Ms; ++i) {                                     \
            const int64_t m = m0 + i;                                                              \
            const __m256i lanes = LANES::lanes(                                                    \
                w,                                                                                 \
                load_block(reinterpret_cast<const uint8_t*>(g.qx + (m * g.blocks + b) * kBlock))); \
            const __m256 s = _mm256_mul_ps(w.scale, _mm256_broadcast_ss(g.dx + m * g.blocks + b)); \
            acc[i] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(lanes), acc[i]);                        \
        }                                                                                          \
    }                                                                                              \
    template <int Ms>                                                                              \
    TARGET inline void NAME##_tile(const Q8Row& g, int64_t m0) {                                   \
        __m256 even[Ms], odd[Ms];                                                                  \
        _Pragma("GCC unroll 8") for (int i = 0; i < Ms; ++i) even[i] = odd[i] =                    \
            _mm256_setzero_ps();                                                                   \
        int64_t b = 0;                                                                             \
        for (; b + 2 <= g.blocks; b += 2) {                                                        \
            NAME##_block<Ms>(g, m0, b, even);                                                      \
            NAME##_block<Ms>(g, m0, b + 1, odd);                                                   \
        }                                                                                          \
        if (b < g.blocks) NAME##_block<Ms>(g, m0, b, even);                                        \
        _Pragma("GCC unroll 8") for (int i = 0; i < Ms; ++i) g.dots[m0 + i] =                      \
            reduce_lanes_avx(even[i], odd[i]);                                                     \
    }                                                                                              \
    TARGET void NAME(const Q8Row& g) {                                                             \
        int64_t m = 0;                                                                             \
        for (; m + 4 <= g.M; m += 4) NAME##_tile<4>(g, m);                                         \
        if (m + 2 <= g.M) NAME##_tile<2>(g, m), m += 2;                                            \
        if (m < g.M) NAME##_tile<1>(g, m);                                                         \
    }
TMX_Q8_TILE_256(q8_row_avx2, TMX_AVX2, Avx2Lanes)
TMX_Q8_TILE_256(q8_row_avxvnni, TMX_AVXVNNI, AvxVnniLanes)
#undef TMX_Q8_TILE_256

// 512 bits: two blocks at a time, the even block in the low half and the odd one in the high
// half, which are the two accumulators of the 256-bit kernels; as AVX-VNNI, vpdpbusd takes
// qx + 128 and starts from -128 * sum(qw).
template <int Ms>
TMX_AVX512VNNI inline void q8_tile_avx512vnni(const Q8Row& g, int64_t m0) {
    const __m512i offset = _mm512_set1_epi8(static_cast<char>(0x80));
    // [s_b x 8, s_b+1 x 8] from [s_b, s_b+1].
    const __m512i halves = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    __m512 acc[Ms];
#pragma GCC unroll 8
    for (int i = 0; i < Ms; ++i) acc[i] = _mm512_setzero_ps();
    int64_t b = 0;
    for (; b + 2 <= g.blocks; b += 2) {
        const uint8_t* blk = g.w + b * kBlockBytes;
        const __m512i qw = _mm512_mask_broadcast_i64x4(_mm512_castsi256_si512(load_block(blk + 2)),
                                                       0xf0, load_block(blk + kBlockBytes + 2));
        const __m512i start = _mm512_sub_epi32(
            _mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), offset, qw));
        uint16_t d0, d1;
        std::memcpy(&d0, blk, 2);
        std::memcpy(&d1, blk + kBlockBytes, 2);
        const __m128 ws = _mm_cvtph_ps(_mm_insert_epi16(_mm_cvtsi32_si128(d0), d1, 1));
#pragma GCC unroll 8
        for (int i = 0; i < Ms; ++i) {
            const int64_t m = m0 + i;
            const __m512i lanes = _mm512_dpbusd_epi32(
                start, _mm512_loadu_si512(g.qx + (m * g.blocks + b) * kBlock), qw);
            const __m128 dx = _mm_castsi128_ps(
                _mm_loadl_epi64(reinterpret_cast<const __m128i*>(g.dx + m * g.blocks + b)));
            const __m512 s =
                _mm512_permutexvar_ps(halves, _mm512_castps128_ps512(_mm_mul_ps(ws, dx)));
            acc[i] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(lanes), acc[i]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < Ms; ++i) {
        const int64_t m = m0 + i;
        __m256 even = _mm512_castps512_ps256(acc[i]);
        const __m256 odd = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[i]), 1));
        if (b < g.blocks) {  // an odd count: the last block is even
            const __m256i qw = load_block(g.w + b * kBlockBytes + 2);
            const __m256i start = _mm256_sub_epi32(
                _mm256_setzero_si256(),
                _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm512_castsi512_si256(offset), qw));
            const __m256i lanes = _mm256_dpbusd_epi32(
                start,
                load_block(reinterpret_cast<const uint8_t*>(g.qx + (m * g.blocks + b) * kBlock)),
                qw);
            const __m256 s = _mm256_mul_ps(block_scale(g.w + b * kBlockBytes),
                                           _mm256_set1_ps(g.dx[m * g.blocks + b]));
            even = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(lanes), even);
        }
        g.dots[m] = reduce_lanes_avx(even, odd);
    }
}

TMX_AVX512VNNI void q8_row_avx512vnni(const Q8Row& g) {
    int64_t m = 0;
    for (; m + 8 <= g.M; m += 8) q8_tile_avx512vnni<8>(g, m);
    if (m + 4 <= g.M) q8_tile_avx512vnni<4>(g, m), m += 4;
    if (m + 2 <= g.M) q8_tile_avx512vnni<2>(g, m), m += 2;
    if (m < g.M) q8_tile_avx512vnni<1>(g, m);
}
#endif  // TMX_X86

// The Q8_0 kernel of a path, and whether it multiplies VNNI's unsigned activations.
struct Q8Choice {
    Q8Kernel kernel;
    bool vnni;
};
Q8Choice q8_kernel(CpuWeightPath path) {
    switch (path) {
#ifdef TMX_X86
        case CpuWeightPath::Avx2:
            return {q8_row_avx2, false};
        case CpuWeightPath::AvxVnni:
            return {q8_row_avxvnni, true};
        case CpuWeightPath::Avx512:  // AVX-512 without VNNI: the 256-bit kernels
            if (cpu_features().avx_vnni) return {q8_row_avxvnni, true};
            return {q8_row_avx2, false};
        case CpuWeightPath::Avx512Vnni:
            return {q8_row_avx512vnni, true};
#endif
        default:
            return {q8_row_portable, false};
    }
}

void q8_matmul(int64_t M, int64_t N, int64_t K, const float* x, const uint8_t* w, float beta,
               float* y) {
    if (K % kBlock != 0)
        throw std::invalid_argument("cpu_weight_matmul_nt: Q8_0 needs K a multiple of 32, got " +
                                    std::to_string(K));
    const Q8Choice choice = q8_kernel(cpu_weight_path());
    Q8Activations xq;
    quantize_activations(x, M, K, choice.vnni, xq);
    const Q8Kernel kernel = choice.kernel;
    const int64_t blocks = K / kBlock, row_bytes = blocks * kBlockBytes;
    const int64_t row_blocks = (N + kOutputBlock - 1) / kOutputBlock;
#pragma omp parallel if (M * N * K >= kParallelWork)
    {
        std::vector<float> wscale(static_cast<size_t>(blocks));
        std::vector<float> dots(static_cast<size_t>(kOutputBlock * M));
        Q8Row g{M, blocks, xq.q.data(), xq.scale.data(), nullptr, wscale.data(), nullptr};
#pragma omp for schedule(static)
        for (int64_t block = 0; block < row_blocks; ++block) {
            const int64_t n0 = block * kOutputBlock, rows = std::min(kOutputBlock, N - n0);
            for (int64_t r = 0; r < rows; ++r) {
                g.w = w + (n0 + r) * row_bytes;
                g.dots = dots.data() + r * M;
                kernel(g);
            }
            store_outputs(dots.data(), M, rows, n0, N, beta, y);
        }
    }
}

// ---- bf16 and f16 ----
//
// One weight row at a time: on the machines measured, a single sequential stream reads memory
// much faster than four rows read side by side (a 2048 x 512 bf16 matrix on one Zen 5 core:
// 31 GB/s against 14). The row is read in chunks (wide_chunk); each chunk is widened in
// registers for a tile of rows of x at a time while it and that part of x are in L1, and the
// accumulators wait in `acc` between chunks. Each output sums its terms in the kernel's lanes
// (k modulo the lane count) in order, then adds the lanes in a fixed order: the same whatever M
// and the thread count.

// The format's values as fp32 (exact for both).
template <DType F>
float widen(uint16_t v) {
    if constexpr (F == DType::BF16) return from_bf16_bits(v);
    return f16_to_f32(v);
}

// One weight row against every row of x, a chunk [k0, k0 + len) at a time: dots[m] = x[m] . w
// once the last chunk is done.
struct WideRow {
    int64_t M, K;
    const float* x;  // the chunk's first column of x: x[m, k0 + j] at x[m * x_stride + j]
    int64_t x_stride;
    const uint16_t* w;  // [K]
    float* acc;         // [M, 32]: the accumulators between chunks
    float* widened;     // [chunk]: the portable kernel's widened chunk
    float* dots;        // [M]
};
using WideKernel = void (*)(const WideRow&, int64_t k0, int64_t len);

template <DType F>
void wide_row_portable(const WideRow& g, int64_t k0, int64_t len) {
    if (k0 == 0) std::fill(g.acc, g.acc + g.M * 8, 0.0f);
    for (int64_t k = 0; k < len; ++k) g.widened[k] = widen<F>(g.w[k0 + k]);
    for (int64_t m = 0; m < g.M; ++m) {
        const float* xm = g.x + m * g.x_stride;
        float* lanes = g.acc + m * 8;
        for (int64_t k = 0; k < len; ++k) lanes[(k0 + k) % 8] += xm[k] * g.widened[k];
    }
    if (k0 + len < g.K) return;
    const float zero[8] = {};
    for (int64_t m = 0; m < g.M; ++m) g.dots[m] = reduce_lanes(g.acc + m * 8, zero);
}

#ifdef TMX_X86
template <DType F>
TMX_AVX2 inline __m256 widen8_avx2(const uint16_t* p) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    if constexpr (F == DType::BF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
    return _mm256_cvtph_ps(v);
}

// The chunk [k0, k0 + len) against Ms rows of x from m0, 32 values (4 vectors, a cache line of
// weights) a step: Ms * 4 accumulators, the widened weights and x fit AVX2's 16 registers for
// Ms <= 2. The last chunk ends with K % 32: its whole 8s into the accumulators in turn, then
// K % 8 (weights zero-padded, x read masked).
template <DType F, int Ms>
TMX_AVX2 inline void wide_tile_avx2(const WideRow& g, int64_t m0, int64_t k0, int64_t len) {
    constexpr int kVecs = 4;
    float* acc_mem = g.acc + m0 * 32;
    __m256 acc[Ms][kVecs];
#pragma GCC unroll 8
    for (int i = 0; i < Ms; ++i)
#pragma GCC unroll 8
        for (int u = 0; u < kVecs; ++u)
            acc[i][u] = k0 == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(acc_mem + i * 32 + u * 8);
    const int64_t main_end = k0 + len / 32 * 32;
    for (int64_t k = k0; k < main_end; k += 32) {
        __m256 wv[kVecs];
#pragma GCC unroll 8
        for (int u = 0; u < kVecs; ++u) wv[u] = widen8_avx2<F>(g.w + k + 8 * u);
#pragma GCC unroll 8
        for (int i = 0; i < Ms; ++i)
#pragma GCC unroll 8
            for (int u = 0; u < kVecs; ++u)
                acc[i][u] =
                    _mm256_fmadd_ps(_mm256_loadu_ps(g.x + (m0 + i) * g.x_stride + (k - k0) + 8 * u),
                                    wv[u], acc[i][u]);
    }
    const int64_t end = k0 + len;
    for (int64_t k = main_end; k < end; k += 8) {
        const int u = static_cast<int>((k - main_end) / 8);
        const int64_t n = std::min<int64_t>(8, end - k);
        alignas(16) uint16_t tail[8] = {};
        std::memcpy(tail, g.w + k, static_cast<size_t>(n) * 2);
        const __m256 wv = widen8_avx2<F>(tail);
        const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)),
                                                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        for (int i = 0; i < Ms; ++i)
            acc[i][u] = _mm256_fmadd_ps(
                _mm256_maskload_ps(g.x + (m0 + i) * g.x_stride + (k - k0), mask), wv, acc[i][u]);
    }
#pragma GCC unroll 8
    for (int i = 0; i < Ms; ++i) {
        if (end == g.K) {
            const __m256 v = _mm256_add_ps(_mm256_add_ps(acc[i][0], acc[i][1]),
                                           _mm256_add_ps(acc[i][2], acc[i][3]));
            g.dots[m0 + i] = reduce8_avx(v);
        } else {
#pragma GCC unroll 8
            for (int u = 0; u < kVecs; ++u) _mm256_storeu_ps(acc_mem + i * 32 + u * 8, acc[i][u]);
        }
    }
}

template <DType F>
TMX_AVX2 void wide_row_avx2(const WideRow& g, int64_t k0, int64_t len) {
    int64_t m = 0;
    for (; m + 2 <= g.M; m += 2) wide_tile_avx2<F, 2>(g, m, k0, len);
    if (m < g.M) wide_tile_avx2<F, 1>(g, m, k0, len);
}

template <DType F>
TMX_AVX512 inline __m512 widen16_avx512(__m256i v) {
    if constexpr (F == DType::BF16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
    return _mm512_cvtph_ps(v);
}

// As wide_tile_avx2 with 512-bit vectors: 2 a step, Ms <= 8 rows of x in 32 registers, and
// masked loads for the last K % 32.
template <DType F, int Ms>
TMX_AVX512 inline void wide_tile_avx512(const WideRow& g, int64_t m0, int64_t k0, int64_t len) {
    constexpr int kVecs = 2;
    float* acc_mem = g.acc + m0 * 32;
    __m512 acc[Ms][kVecs];
#pragma GCC unroll 8
    for (int i = 0; i < Ms; ++i)
#pragma GCC unroll 8
        for (int u = 0; u < kVecs; ++u)
            acc[i][u] = k0 == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(acc_mem + i * 32 + u * 16);
    const int64_t main_end = k0 + len / 32 * 32;
    for (int64_t k = k0; k < main_end; k += 32) {
        __m512 wv[kVecs];
#pragma GCC unroll 8
        for (int u = 0; u < kVecs; ++u)
            wv[u] = widen16_avx512<F>(
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g.w + k + 16 * u)));
#pragma GCC unroll 8
        for (int i = 0; i < Ms; ++i)
#pragma GCC unroll 8
            for (int u = 0; u < kVecs; ++u)
                acc[i][u] = _mm512_fmadd_ps(
                    _mm512_loadu_ps(g.x + (m0 + i) * g.x_stride + (k - k0) + 16 * u), wv[u],
                    acc[i][u]);
    }
    const int64_t end = k0 + len;
    for (int64_t k = main_end; k < end; k += 16) {
        const int u = static_cast<int>((k - main_end) / 16);
        const int64_t n = std::min<int64_t>(16, end - k);
        const __mmask16 mask = static_cast<__mmask16>((1u << n) - 1);
        const __m512 wv = widen16_avx512<F>(_mm256_maskz_loadu_epi16(mask, g.w + k));
        for (int i = 0; i < Ms; ++i)
            acc[i][u] = _mm512_fmadd_ps(
                _mm512_maskz_loadu_ps(mask, g.x + (m0 + i) * g.x_stride + (k - k0)), wv, acc[i][u]);
    }
#pragma GCC unroll 8
    for (int i = 0; i < Ms; ++i) {
        if (end == g.K) {
            const __m512 v = _mm512_add_ps(acc[i][0], acc[i][1]);
            g.dots[m0 + i] =
                reduce_lanes_avx(_mm512_castps512_ps256(v),
                                 _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
        } else {
#pragma GCC unroll 8
            for (int u = 0; u < kVecs; ++u) _mm512_storeu_ps(acc_mem + i * 32 + u * 16, acc[i][u]);
        }
    }
}

template <DType F>
TMX_AVX512 void wide_row_avx512(const WideRow& g, int64_t k0, int64_t len) {
    int64_t m = 0;
    for (; m + 8 <= g.M; m += 8) wide_tile_avx512<F, 8>(g, m, k0, len);
    if (m + 4 <= g.M) wide_tile_avx512<F, 4>(g, m, k0, len), m += 4;
    if (m + 2 <= g.M) wide_tile_avx512<F, 2>(g, m, k0, len), m += 2;
    if (m < g.M) wide_tile_avx512<F, 1>(g, m, k0, len);
}
#endif  // TMX_X86

template <DType F>
WideKernel wide_kernel() {
#ifdef TMX_X86
    const CpuWeightPath path = cpu_weight_path();
    if (path >= CpuWeightPath::Avx512) return wide_row_avx512<F>;
    if (path >= CpuWeightPath::Avx2) return wide_row_avx2<F>;
#endif
    return wide_row_portable<F>;
}

#ifdef TMX_X86
template <DType F>
TMX_AVX2 void widen_avx2(const uint16_t* in, int64_t n, float* out) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, widen8_avx2<F>(in + i));
    for (; i < n; ++i) out[i] = widen<F>(in[i]);
}
#endif

// n stored values to fp32.
template <DType F>
void widen_all(const uint16_t* in, int64_t n, float* out) {
#ifdef TMX_X86
    if (cpu_weight_path() >= CpuWeightPath::Avx2) return widen_avx2<F>(in, n, out);
#endif
    for (int64_t i = 0; i < n; ++i) out[i] = widen<F>(in[i]);
}

template <DType F>
void wide_matmul_one_pass(int64_t M, int64_t N, int64_t K, const float* x, const uint16_t* w,
                          float beta, float* y) {
    const WideKernel kernel = wide_kernel<F>();
    // One row at a time streams the weights fastest. With several rows of x, the chunk loop
    // goes outside a block of rows instead, so that x's chunk stays in L1 for all of them; x is
    // then copied chunk by chunk with a padded row stride, as rows of x a power of two apart
    // (K = 2048: 8 KiB) would all fall in the same L1 sets and evict each other.
    const bool blocked = M >= 4;
    const int64_t block_rows = blocked ? 8 : kOutputBlock;
    const int64_t blocks = (N + block_rows - 1) / block_rows;
    const int64_t chunk = wide_chunk(M, K), chunks = (K + chunk - 1) / chunk;
    const int64_t packed_stride = chunk + 16;
    std::vector<float> packed_storage;
    float* packed = nullptr;
    if (blocked) {  // 64-byte aligned: a vector load that straddles two cache lines costs two
        packed_storage.resize(static_cast<size_t>(chunks * M * packed_stride + 16));
        packed = align_to_cache_line(packed_storage.data());
        for (int64_t c = 0; c < chunks; ++c)
            for (int64_t m = 0; m < M; ++m)
                std::copy_n(x + m * K + c * chunk, std::min(chunk, K - c * chunk),
                            packed + (c * M + m) * packed_stride);
    }
#pragma omp parallel if (M * N * K >= kParallelWork)
    {
        std::vector<float> acc(static_cast<size_t>(block_rows * M * 32));
        std::vector<float> widened(static_cast<size_t>(chunk));
        std::vector<float> dots(static_cast<size_t>(block_rows * M));
        WideRow g{M, K, nullptr, 0, nullptr, nullptr, widened.data(), nullptr};
#pragma omp for schedule(static)
        for (int64_t block = 0; block < blocks; ++block) {
            const int64_t n0 = block * block_rows, rows = std::min(block_rows, N - n0);
            for (int64_t c = 0; c < chunks; ++c) {
                const int64_t k0 = c * chunk;
                g.x = blocked ? packed + c * M * packed_stride : x + k0;
                g.x_stride = blocked ? packed_stride : K;
                for (int64_t r = 0; r < rows; ++r) {
                    g.w = w + (n0 + r) * K;
                    g.acc = acc.data() + r * M * 32;
                    g.dots = dots.data() + r * M;
                    kernel(g, k0, std::min(chunk, K - k0));
                }
            }
            store_outputs(dots.data(), M, rows, n0, N, beta, y);
        }
    }
}

// Prefill: each thread widens a panel of rows to fp32 and multiplies it by all of x with
// OpenBLAS (single-threaded inside the parallel region). The panels are fixed, so each output
// comes from the same call whatever the thread count.
template <DType F>
void wide_matmul_panels(int64_t M, int64_t N, int64_t K, const float* x, const uint16_t* w,
                        float beta, float* y) {
    // At most 1 MiB a panel, but 32 rows at least: each call packs x again.
    const int64_t panel_rows = std::clamp<int64_t>((int64_t{1} << 18) / K, 32, kPanelRows);
    const int64_t panels = (N + panel_rows - 1) / panel_rows;
#pragma omp parallel
    {
        std::vector<float> panel(static_cast<size_t>(panel_rows * K));
        std::vector<float> out(static_cast<size_t>(M * panel_rows));
#pragma omp for schedule(static)
        for (int64_t p = 0; p < panels; ++p) {
            const int64_t n0 = p * panel_rows, rows = std::min(panel_rows, N - n0);
            widen_all<F>(w + n0 * K, rows * K, panel.data());
            cpu_sgemm(false, true, M, rows, K, 1.0f, x, panel.data(), 0.0f, out.data());
            for (int64_t m = 0; m < M; ++m)
                for (int64_t r = 0; r < rows; ++r)
                    store_output(&y[m * N + n0 + r], out[m * rows + r], beta);
        }
    }
}

template <DType F>
void wide_matmul(int64_t M, int64_t N, int64_t K, const float* x, const uint16_t* w, float beta,
                 float* y) {
    if (M > kSmallGemmRows && K > 0)
        wide_matmul_panels<F>(M, N, K, x, w, beta, y);
    else
        wide_matmul_one_pass<F>(M, N, K, x, w, beta, y);
}

std::atomic<CpuWeightPath>& current_weight_path() {
    static std::atomic<CpuWeightPath> path{cpu_weight_paths_available().back()};
    return path;
}

}  // namespace

const char* to_string(CpuWeightPath p) {
    switch (p) {
        case CpuWeightPath::Portable:
            return "portable";
        case CpuWeightPath::Avx2:
            return "avx2";
        case CpuWeightPath::AvxVnni:
            return "avx-vnni";
        case CpuWeightPath::Avx512:
            return "avx512";
        case CpuWeightPath::Avx512Vnni:
            return "avx512-vnni";
    }
    return "unknown";
}

std::vector<CpuWeightPath> cpu_weight_paths_available() {
    static const std::vector<CpuWeightPath> paths = [] {
        std::vector<CpuWeightPath> p{CpuWeightPath::Portable};
        const CpuFeatures& f = cpu_features();
        if (f.avx2_fma_f16c) p.push_back(CpuWeightPath::Avx2);
        if (f.avx_vnni) p.push_back(CpuWeightPath::AvxVnni);
        if (f.avx512_bw_vl) p.push_back(CpuWeightPath::Avx512);
        if (f.avx512_vnni) p.push_back(CpuWeightPath::Avx512Vnni);
        return p;
    }();
    return paths;
}

CpuWeightPath cpu_weight_path() {
    return current_weight_path().load(std::memory_order_relaxed);
}

void cpu_set_weight_path(CpuWeightPath p) {
    const std::vector<CpuWeightPath> paths = cpu_weight_paths_available();
    if (std::find(paths.begin(), paths.end(), p) == paths.end())
        throw std::logic_error(std::string("cpu_set_weight_path: this CPU has no ") + to_string(p) +
                               " path");
    current_weight_path().store(p, std::memory_order_relaxed);
}

void cpu_weight_matmul_nt(DType format, int64_t M, int64_t N, int64_t K, const float* x,
                          const void* w, float beta, float* y) {
    if (M <= 0 || N <= 0) return;
    switch (format) {
        case DType::F32:
            return cpu_sgemm(false, true, M, N, K, 1.0f, x, static_cast<const float*>(w), beta, y);
        case DType::BF16:
            return wide_matmul<DType::BF16>(M, N, K, x, static_cast<const uint16_t*>(w), beta, y);
        case DType::F16:
            return wide_matmul<DType::F16>(M, N, K, x, static_cast<const uint16_t*>(w), beta, y);
        case DType::Q8_0:
            return q8_matmul(M, N, K, x, static_cast<const uint8_t*>(w), beta, y);
        default:
            break;
    }
    throw std::logic_error(std::string("cpu_weight_matmul_nt: ") + to_string(format) +
                           " is no weight format");
}

}  // namespace tmx

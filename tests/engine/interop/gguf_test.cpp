// The GGUF module against the format's spec: the writer's bytes against bytes laid out by hand,
// Q8_0 and f16 against values computed by hand from their formulas, writer -> reader round
// trips of every tensor and metadata type, and the reader against hostile files, each an error
// that names the file and the field at fault.
#include "engine/interop/gguf.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "engine/core/errors.h"
#include "engine/core/file_io.h"
#include "engine/core/rng.h"
#include "engine/model/safetensors.h"
#include "tests/test_util.h"

namespace tmx::gguf {
namespace {

// Little-endian bytes laid out by hand.
struct Bytes {
    std::string s;
    Bytes& raw(const std::string& x) {
        s += x;
        return *this;
    }
    template <typename T>
    Bytes& le(T x) {
        char b[sizeof(T)];
        std::memcpy(b, &x, sizeof(T));
        s.append(b, sizeof(T));
        return *this;
    }
    Bytes& u8(uint8_t x) { return le(x); }
    Bytes& u16(uint16_t x) { return le(x); }
    Bytes& u32(uint32_t x) { return le(x); }
    Bytes& u64(uint64_t x) { return le(x); }
    Bytes& f32(float x) { return le(x); }
    Bytes& str(const std::string& x) { return u64(x.size()).raw(x); }
    Bytes& zeros(size_t n) {
        s.append(n, '\0');
        return *this;
    }
    Bytes& pad_to(size_t alignment) {
        return zeros((alignment - s.size() % alignment) % alignment);
    }
};

std::string file_bytes(const std::string& path) {
    return read_file(path);
}

// Without write_file_atomic's fsync: the hostile-file tests write thousands of files.
void write_bytes(const std::string& path, const std::string& bytes) {
    std::filesystem::remove(path);  // a truncated file would be flushed on close (ext4)
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    ASSERT_TRUE(out.good()) << path;
}

// The error opening the file gives, or "" when it opens.
std::string open_error(const std::string& path) {
    try {
        Reader r(path);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

bool starts_with(const std::string& s, const std::string& prefix) {
    return s.compare(0, prefix.size(), prefix) == 0;
}

float f32_of_bits(uint32_t u) {
    return std::bit_cast<float>(u);
}

// ---- the writer's bytes against the spec ----

TEST(GgufWriter, BytesMatchTheSpecLaidOutByHand) {
    test::TempDir tmp;
    const std::string path = tmp / "tiny.gguf";
    const std::vector<float> w = {1.0f, -2.0f, 0.5f, 3.25f, -0.125f, 100.0f};  // [2, 3] row-major
    {
        Writer out(path);
        out.add("general.architecture", Value::string("tmx"));
        out.add("tmx.n_layers", Value::u32(2));
        out.add("tmx.names", Value::string_array({"a", "bc"}));
        out.add("tmx.scales", Value::f32_array({0.5f, -2.0f}));
        out.add_tensor("w", {3, 2}, TensorType::F32);  // ne[0] = 3 columns, fastest
        out.add_tensor("b", {2}, TensorType::F16);
        out.write_header();
        out.append(w.data(), 10);  // in two chunks that split a float
        out.append(reinterpret_cast<const char*>(w.data()) + 10, 14);
        const float b[2] = {1.0f, -2.0f};
        out.append_f32(b, 2);
        out.finish();
    }

    Bytes e;
    e.raw("GGUF").u32(3).u64(2).u64(4);
    e.str("general.architecture").u32(8).str("tmx");
    e.str("tmx.n_layers").u32(4).u32(2);
    e.str("tmx.names").u32(9).u32(8).u64(2).str("a").str("bc");
    e.str("tmx.scales").u32(9).u32(6).u64(2).f32(0.5f).f32(-2.0f);
    e.str("w").u32(2).u64(3).u64(2).u32(0).u64(0);
    e.str("b").u32(1).u64(2).u32(1).u64(32);  // w's 24 bytes padded to 32
    const size_t header_end = e.s.size();
    e.pad_to(32);
    const size_t data_start = e.s.size();
    for (float x : w) e.f32(x);
    e.zeros(8);                 // w padded to 32 bytes
    e.u16(0x3C00).u16(0xC000);  // 1.0 and -2.0 as f16
    e.zeros(28);                // the end padded to the alignment
    ASSERT_EQ(data_start % 32, 0u);
    ASSERT_GT(data_start, header_end);  // the padding is there to check
    const std::string got = file_bytes(path);
    ASSERT_EQ(got.size(), e.s.size());
    for (size_t i = 0; i < got.size(); ++i)
        ASSERT_EQ(static_cast<uint8_t>(got[i]), static_cast<uint8_t>(e.s[i])) << "byte " << i;

    Reader r(path);
    EXPECT_EQ(r.data_offset(), data_start);
    EXPECT_EQ(r.tensors()[1].offset, 32u);
}

TEST(GgufWriter, EmptyFileIsHeaderAndPadding) {
    test::TempDir tmp;
    const std::string path = tmp / "empty.gguf";
    Writer out(path);
    out.finish();  // writes the header itself
    Bytes e;
    e.raw("GGUF").u32(3).u64(0).u64(0).pad_to(32);
    EXPECT_EQ(file_bytes(path), e.s);
    Reader r(path);
    EXPECT_TRUE(r.tensors().empty());
    EXPECT_TRUE(r.metadata().empty());
}

// ---- Q8_0 ----

// Three blocks whose scale and quants follow by hand from d = max|x| / 127, q = roundf(x / d).
TEST(GgufQ8_0, BlocksComputedByHand) {
    std::vector<float> x(96, 0.0f);
    std::vector<int8_t> q(96, 0);
    // Block 0: max|x| = 127, so d = 1 (f16 0x3C00) and q = roundf(x), ties away from zero.
    const std::pair<float, int8_t> b0[] = {{127.0f, 127},   {0.5f, 1},       {-0.5f, -1}, {1.5f, 2},
                                           {2.5f, 3},       {-2.5f, -3},     {0.49f, 0},  {3.7f, 4},
                                           {-100.2f, -100}, {-126.6f, -127}, {64.0f, 64}};
    for (size_t j = 0; j < std::size(b0); ++j) x[j] = b0[j].first, q[j] = b0[j].second;
    // Block 1: max|x| = 63.5, so d = 0.5 (f16 0x3800) and q = roundf(2 x).
    const std::pair<float, int8_t> b1[] = {{-63.5f, -127}, {0.25f, 1}, {-0.75f, -2},
                                           {10.1f, 20},    {0.2f, 0},  {31.0f, 62}};
    for (size_t j = 0; j < std::size(b1); ++j) x[32 + j] = b1[j].first, q[32 + j] = b1[j].second;
    // Block 2: max|x| = 1, so d = 1/127 = 0.0078740... = 2^-7 * (1 + 8.06/1024): f16 0x2008;
    // q = roundf(127 x).
    const std::pair<float, int8_t> b2[] = {{1.0f, 127}, {-1.0f, -127}, {0.1f, 13},
                                           {0.3f, 38},  {0.25f, 32},   {-0.62f, -79}};
    for (size_t j = 0; j < std::size(b2); ++j) x[64 + j] = b2[j].first, q[64 + j] = b2[j].second;

    std::vector<uint8_t> expected;
    const uint16_t scales[3] = {0x3C00, 0x3800, 0x2008};
    for (int b = 0; b < 3; ++b) {
        expected.push_back(static_cast<uint8_t>(scales[b] & 0xff));
        expected.push_back(static_cast<uint8_t>(scales[b] >> 8));
        for (int j = 0; j < 32; ++j) expected.push_back(static_cast<uint8_t>(q[b * 32 + j]));
    }
    std::vector<uint8_t> got(3 * 34);
    quantize_q8_0(x.data(), x.size(), got.data());
    ASSERT_EQ(got.size(), expected.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], expected[i]) << "byte " << i;

    std::vector<float> back(96);
    dequantize_q8_0(got.data(), 96, back.data());
    EXPECT_EQ(back[1], 1.0f);
    EXPECT_EQ(back[33], 0.5f);
    EXPECT_EQ(back[34], -1.0f);
    EXPECT_EQ(back[66], f16_to_f32(0x2008) * 13.0f);
}

TEST(GgufQ8_0, AllZeroBlockIsAllZeroBytes) {
    const std::vector<float> x(64, 0.0f);
    std::vector<uint8_t> out(68, 0xAB);
    quantize_q8_0(x.data(), x.size(), out.data());
    for (uint8_t b : out) EXPECT_EQ(b, 0);
    std::vector<float> back(64, 1.0f);
    dequantize_q8_0(out.data(), 64, back.data());
    for (float v : back) EXPECT_EQ(v, 0.0f);
}

// Each value comes back within half a step: d/2 for the rounding of x/d, plus |q| times the
// error of storing d as f16 (the quants are computed with the fp32 d, as ggml does).
TEST(GgufQ8_0, RoundTripWithinHalfAStep) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    Rng rng(seed);
    const size_t n = 32 * 200;
    std::vector<float> x = test::random_normal(rng, n);
    for (size_t b = 0; b < n / 32; ++b) {  // blocks of very different magnitudes
        const float scale = std::ldexp(1.0f, static_cast<int>(rng.below(40)) - 20);
        for (size_t j = 0; j < 32; ++j) x[b * 32 + j] *= scale;
    }
    std::vector<uint8_t> q(n / 32 * 34);
    quantize_q8_0(x.data(), n, q.data());
    std::vector<float> back(n);
    dequantize_q8_0(q.data(), n, back.data());
    for (size_t b = 0; b < n / 32; ++b) {
        float amax = 0;
        for (size_t j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
        const float d = amax / 127.0f;
        uint16_t dh;
        std::memcpy(&dh, q.data() + b * 34, 2);
        const float d16 = f16_to_f32(dh);
        EXPECT_EQ(dh, f32_to_f16(d));
        for (size_t j = 0; j < 32; ++j) {
            const size_t i = b * 32 + j;
            const float qi = static_cast<float>(static_cast<int8_t>(q[b * 34 + 2 + j]));
            const float bound = d / 2 + std::fabs(qi) * std::fabs(d - d16) + 1e-6f * amax;
            ASSERT_LE(std::fabs(back[i] - x[i]), bound) << "value " << i;
        }
    }
}

TEST(GgufQ8_0, NonFiniteInputsAreNoUndefinedBehaviour) {
    std::vector<float> x(32, 1.0f);
    x[3] = std::numeric_limits<float>::quiet_NaN();
    x[4] = std::numeric_limits<float>::infinity();
    std::vector<uint8_t> q(34);
    quantize_q8_0(x.data(), 32, q.data());  // no crash, no UB (checked under the sanitizers)
    EXPECT_THROW(quantize_q8_0(x.data(), 31, q.data()), Error);
}

// ---- f16 ----

TEST(GgufF16, KnownValues) {
    EXPECT_EQ(f32_to_f16(1.0f), 0x3C00);
    EXPECT_EQ(f32_to_f16(-2.0f), 0xC000);
    EXPECT_EQ(f32_to_f16(0.1f), 0x2E66);
    EXPECT_EQ(f32_to_f16(65504.0f), 0x7BFF);  // the largest half
    EXPECT_EQ(f32_to_f16(65519.99f), 0x7BFF);
    EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);  // halfway to 2^16, ties to even: infinity
    EXPECT_EQ(f32_to_f16(1e10f), 0x7C00);
    EXPECT_EQ(f32_to_f16(-1e10f), 0xFC00);
    EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::infinity()), 0x7C00);
    EXPECT_EQ(f32_to_f16(-std::numeric_limits<float>::infinity()), 0xFC00);
    EXPECT_EQ(f32_to_f16(0.0f), 0x0000);
    EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
    EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -14)), 0x0400);     // the smallest normal
    EXPECT_EQ(f32_to_f16(std::ldexp(1023.0f, -24)), 0x03FF);  // the largest subnormal
    EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);     // the smallest subnormal
    EXPECT_EQ(f32_to_f16(-std::ldexp(1.0f, -24)), 0x8001);
    EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);  // a tie, to even (0)
    EXPECT_EQ(f32_to_f16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
    EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -30)), 0x0000);
    EXPECT_EQ(f32_to_f16(std::ldexp(1.5f, -24)), 0x0002);             // tie between 1 and 2
    EXPECT_EQ(f32_to_f16(std::ldexp(2.5f, -24)), 0x0002);             // tie between 2 and 3
    EXPECT_EQ(f32_to_f16(std::ldexp(2047.0f, -25)), 0x0400);          // rounds up to normal
    EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);      // tie, to even
    EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);  // tie, to even
    EXPECT_EQ(f32_to_f16(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f)), 0x3C01);
    const uint16_t nan = f32_to_f16(std::numeric_limits<float>::quiet_NaN());
    EXPECT_EQ(nan & 0x7C00, 0x7C00);
    EXPECT_NE(nan & 0x03FF, 0);
    EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f32_of_bits(0x7f800001u)))));  // signalling
    EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(-std::numeric_limits<float>::quiet_NaN()))));
}

TEST(GgufF16, EveryHalfRoundTrips) {
    for (uint32_t h = 0; h < 0x10000; ++h) {
        const float f = f16_to_f32(static_cast<uint16_t>(h));
        if (std::isnan(f)) {
            EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f)))) << std::hex << h;
            continue;
        }
        ASSERT_EQ(f32_to_f16(f), h) << std::hex << h;
    }
}

// Between two neighbouring halves every float rounds to the nearer one.
TEST(GgufF16, RandomFloatsRoundToTheNearestHalf) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    Rng rng(seed);
    for (int i = 0; i < 100000; ++i) {
        // Both signs, exponents from below the smallest subnormal half to above the largest.
        const uint32_t exponent = 100 + static_cast<uint32_t>(rng.below(44));  // 2^-27 .. 2^16
        const uint32_t bits = static_cast<uint32_t>(rng.below(2) << 31) | (exponent << 23) |
                              static_cast<uint32_t>(rng.below(1u << 23));
        const float f = f32_of_bits(bits);
        if (std::isnan(f) || std::fabs(f) >= 65504.0f) continue;
        const uint16_t h = f32_to_f16(f);
        const double got = f16_to_f32(h);
        const double up = f16_to_f32(static_cast<uint16_t>(h + 1));
        const double err = std::fabs(got - static_cast<double>(f));
        // The next half away from zero is no nearer.
        if ((h & 0x7FFF) < 0x7BFF) {
            ASSERT_LE(err, std::fabs(up - f)) << f;
        }
        if ((h & 0x7FFF) > 0) {
            const double down = f16_to_f32(static_cast<uint16_t>(h - 1));
            ASSERT_LE(err, std::fabs(down - f)) << f;
        }
    }
}

// ---- tensor_bytes ----

TEST(GgufTensorBytes, SizesAndOverflow) {
    EXPECT_EQ(tensor_bytes(TensorType::F32, 10), 40u);
    EXPECT_EQ(tensor_bytes(TensorType::F16, 10), 20u);
    EXPECT_EQ(tensor_bytes(TensorType::BF16, 10), 20u);
    EXPECT_EQ(tensor_bytes(TensorType::Q8_0, 64), 68u);
    EXPECT_THROW(tensor_bytes(TensorType::Q8_0, 33), Error);
    EXPECT_THROW(tensor_bytes(TensorType::F32, uint64_t{1} << 62), Error);
    EXPECT_THROW(tensor_bytes(TensorType::F32, ~uint64_t{0}), Error);
    EXPECT_STREQ(to_string(TensorType::Q8_0), "Q8_0");
    EXPECT_STREQ(to_string(TensorType::BF16), "BF16");
}

// ---- writer -> reader ----

TEST(GgufRoundTrip, TensorsOfEveryType) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    Rng rng(seed);
    test::TempDir tmp;
    const std::string path = tmp / "t.gguf";
    struct T {
        std::string name;
        std::vector<uint64_t> dims;
        TensorType type;
        std::vector<float> x;
    };
    std::vector<T> ts = {
        {"f32", {7, 5}, TensorType::F32, {}},
        {"f16", {33, 3, 2}, TensorType::F16, {}},
        {"bf16", {5, 1, 2, 3}, TensorType::BF16, {}},
        {"q8_0", {64, 3}, TensorType::Q8_0, {}},
        {"q8_0.big", {32 * 40, 30}, TensorType::Q8_0, {}},  // more than one read chunk
        {"f16.tiny", {40}, TensorType::F16, {}},
    };
    for (auto& t : ts) {
        size_t n = 1;
        for (uint64_t d : t.dims) n *= d;
        t.x = test::random_normal(rng, n);
    }
    for (float& v : ts.back().x) v *= 1e-6f;  // f16 subnormals
    {
        Writer out(path);
        out.add(kAlignmentKey, Value::u32(64));
        for (const auto& t : ts) out.add_tensor(t.name, t.dims, t.type);
        out.write_header();
        for (const auto& t : ts) {
            if (t.type == TensorType::F32) {  // raw bytes, in uneven chunks
                out.append(t.x.data(), 3);
                out.append(reinterpret_cast<const char*>(t.x.data()) + 3, t.x.size() * 4 - 3);
            } else {
                const size_t half = t.type == TensorType::Q8_0 ? 64 : t.x.size() / 2;
                out.append_f32(t.x.data(), half);
                out.append_f32(t.x.data() + half, t.x.size() - half);
            }
        }
        out.finish();
    }
    Reader r(path);
    EXPECT_EQ(r.version(), 3u);
    EXPECT_EQ(r.alignment(), 64u);
    EXPECT_EQ(r.data_offset() % 64, 0u);
    ASSERT_EQ(r.tensors().size(), ts.size());
    for (size_t k = 0; k < ts.size(); ++k) {
        const T& t = ts[k];
        SCOPED_TRACE(t.name);
        const TensorInfo* info = r.find_tensor(t.name);
        ASSERT_NE(info, nullptr);
        EXPECT_EQ(info, &r.tensors()[k]);
        EXPECT_EQ(info->dims, t.dims);
        EXPECT_EQ(info->type, t.type);
        EXPECT_EQ(info->numel, t.x.size());
        EXPECT_EQ(info->bytes, tensor_bytes(t.type, t.x.size()));
        EXPECT_EQ(info->offset % 64, 0u);
        std::vector<float> got(t.x.size());
        r.read_f32(*info, 0, t.x.size(), got.data());
        std::vector<float> expected(t.x.size());
        if (t.type == TensorType::Q8_0) {
            std::vector<uint8_t> q(info->bytes);
            quantize_q8_0(t.x.data(), t.x.size(), q.data());
            dequantize_q8_0(q.data(), t.x.size(), expected.data());
        }
        for (size_t i = 0; i < t.x.size(); ++i) {
            const float x = t.x[i];
            switch (t.type) {
                case TensorType::F32:
                    ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(x)) << i;
                    break;
                case TensorType::F16:
                    ASSERT_EQ(got[i], f16_to_f32(f32_to_f16(x))) << i;
                    ASSERT_LE(std::fabs(got[i] - x), std::max(std::fabs(x) * 0x1p-11f, 0x1p-25f))
                        << i;
                    break;
                case TensorType::BF16:
                    ASSERT_EQ(got[i], bf16_to_f32(f32_to_bf16(x))) << i;
                    ASSERT_LE(std::fabs(got[i] - x), std::fabs(x) * 0x1p-8f) << i;
                    break;
                case TensorType::Q8_0: {
                    ASSERT_EQ(got[i], expected[i]) << i;
                    float amax = 0;
                    for (size_t j = i / 32 * 32; j < i / 32 * 32 + 32; ++j)
                        amax = std::max(amax, std::fabs(t.x[j]));
                    // d/2 plus 127 times the f16 error of d (at most d * 2^-11).
                    ASSERT_LE(std::fabs(got[i] - x), amax / 127 * (0.5f + 127 * 0x1p-11f)) << i;
                    break;
                }
            }
        }
        // A part of the tensor reads the same as that part of the whole.
        const uint64_t first = t.type == TensorType::Q8_0 ? 32 : 3;
        const uint64_t count = t.type == TensorType::Q8_0 ? 32 : t.x.size() - 5;
        std::vector<float> part(count);
        r.read_f32(*info, first, count, part.data());
        for (uint64_t i = 0; i < count; ++i) ASSERT_EQ(part[i], got[first + i]) << i;
    }
    // Reads outside a tensor, or Q8_0 reads that split a block, are errors naming it.
    const TensorInfo& q = *r.find_tensor("q8_0");
    std::vector<float> buf(q.numel + 32);
    try {
        r.read_f32(q, 16, 32, buf.data());
        ADD_FAILURE() << "no error";
    } catch (const Error& e) {
        EXPECT_TRUE(starts_with(e.what(), path)) << e.what();
        EXPECT_NE(std::string(e.what()).find("'q8_0'"), std::string::npos) << e.what();
    }
    EXPECT_THROW(r.read_f32(q, 0, q.numel + 32, buf.data()), Error);
    EXPECT_THROW(r.read_f32(q, ~uint64_t{0} - 31, 32, buf.data()), Error);
    std::vector<uint8_t> raw(q.bytes);
    r.read_raw(q, 0, q.bytes, raw.data());
    std::vector<uint8_t> requant(q.bytes);
    quantize_q8_0(ts[3].x.data(), ts[3].x.size(), requant.data());
    EXPECT_EQ(raw, requant);
    EXPECT_THROW(r.read_raw(q, 1, q.bytes, raw.data()), Error);
}

TEST(GgufRoundTrip, MetadataOfEveryType) {
    test::TempDir tmp;
    const std::string path = tmp / "m.gguf";
    const std::string u16s = [] {
        Bytes b;
        b.u16(1).u16(65535);
        return b.s;
    }();
    std::vector<std::pair<std::string, Value>> kvs = {
        {"u8", Value::u8(200)},
        {"i8", Value::i8(-100)},
        {"u16", Value::u16(60000)},
        {"i16", Value::i16(-30000)},
        {"u32", Value::u32(4000000000u)},
        {"i32", Value::i32(-2000000000)},
        {"f32", Value::f32(0.1f)},
        {"bool.true", Value::boolean(true)},
        {"bool.false", Value::boolean(false)},
        {"string", Value::string(std::string("h\xc3\xa9llo, w\0rld", 13))},
        {"string.empty", Value::string("")},
        {"u64", Value::u64(~uint64_t{0})},
        {"i64", Value::i64(std::numeric_limits<int64_t>::min())},
        {"f64", Value::f64(0.1)},
        {"a.u8", Value::scalar_array(ValueType::UINT8, std::string("\x01\xff", 2))},
        {"a.i8", Value::scalar_array(ValueType::INT8, std::string("\x01\xff", 2))},
        {"a.u16", Value::scalar_array(ValueType::UINT16, u16s)},
        {"a.i16", Value::scalar_array(ValueType::INT16, u16s)},
        {"a.u32", Value::u32_array({1, 4000000000u})},
        {"a.i32", Value::i32_array({-5, 7, std::numeric_limits<int32_t>::min()})},
        {"a.f32", Value::f32_array({0.5f, -1e-20f, 3e30f})},
        {"a.bool", Value::bool_array({true, false, true})},
        {"a.string", Value::string_array({"x", "", "longer string"})},
        {"a.u64", Value::u64_array({0, ~uint64_t{0}})},
        {"a.i64", Value::i64_array({-1, 5})},
        {"a.f64", Value::f64_array({0.1, -2.5})},
        {"a.empty", Value::f32_array({})},
        {"a.empty_strings", Value::string_array({})},
    };
    {
        Writer out(path);
        for (const auto& [k, v] : kvs) out.add(k, v);
        out.finish();
    }
    Reader r(path);
    ASSERT_EQ(r.metadata().size(), kvs.size());
    for (size_t i = 0; i < kvs.size(); ++i) {
        SCOPED_TRACE(kvs[i].first);
        const auto& [key, v] = r.metadata()[i];
        EXPECT_EQ(key, kvs[i].first);  // in file order
        EXPECT_EQ(v.type, kvs[i].second.type);
        EXPECT_EQ(v.type_name(), kvs[i].second.type_name());
        if (v.is_array()) {
            EXPECT_EQ(v.array_type, kvs[i].second.array_type);
        }
        EXPECT_EQ(v.bits, kvs[i].second.bits);
        EXPECT_EQ(v.str, kvs[i].second.str);
        EXPECT_EQ(v.strings, kvs[i].second.strings);
        EXPECT_EQ(v.raw, kvs[i].second.raw);
        EXPECT_EQ(r.find(key), &v);
    }
    EXPECT_EQ(r.get_u32("u8"), 200u);
    EXPECT_EQ(r.get_u32("u16"), 60000u);
    EXPECT_EQ(r.get_u32("u32"), 4000000000u);
    EXPECT_EQ(r.get_u64("u64"), ~uint64_t{0});
    EXPECT_EQ(r.get_i64("i8"), -100);
    EXPECT_EQ(r.get_i64("i16"), -30000);
    EXPECT_EQ(r.get_i64("i32"), -2000000000);
    EXPECT_EQ(r.get_i64("i64"), std::numeric_limits<int64_t>::min());
    EXPECT_EQ(r.get_f32("f32"), 0.1f);
    EXPECT_EQ(r.get_f64("f64"), 0.1);
    EXPECT_EQ(r.get_f32("f64"), 0.1f);
    EXPECT_TRUE(r.get_bool("bool.true"));
    EXPECT_FALSE(r.get_bool("bool.false"));
    EXPECT_EQ(r.get_string("string"), std::string("h\xc3\xa9llo, w\0rld", 13));
    EXPECT_EQ(r.get_string("string.empty"), "");
    EXPECT_EQ(r.get_string_array("a.string"), (std::vector<std::string>{"x", "", "longer string"}));
    EXPECT_EQ(r.get_f32_array("a.f32"), (std::vector<float>{0.5f, -1e-20f, 3e30f}));
    EXPECT_EQ(r.get_f32_array("a.f64"), (std::vector<float>{0.1f, -2.5f}));
    EXPECT_EQ(r.get_i32_array("a.i32"),
              (std::vector<int32_t>{-5, 7, std::numeric_limits<int32_t>::min()}));
    EXPECT_EQ(r.get_i32_array("a.i8"), (std::vector<int32_t>{1, -1}));
    EXPECT_EQ(r.get_i32_array("a.u16"), (std::vector<int32_t>{1, 65535}));
    EXPECT_EQ(r.get_i32_array("a.i16"), (std::vector<int32_t>{1, -1}));
    EXPECT_EQ(r.get_u32_array("a.u32"), (std::vector<uint32_t>{1, 4000000000u}));
    EXPECT_EQ(r.get_u32_array("a.u8"), (std::vector<uint32_t>{1, 255}));
    EXPECT_TRUE(r.get_f32_array("a.empty").empty());
    EXPECT_TRUE(r.get_string_array("a.empty_strings").empty());
    EXPECT_EQ(r.find("a.bool")->size(), 3u);
    bool b = false;
    EXPECT_TRUE(r.find("a.bool")->at(2).to_bool(b));
    EXPECT_TRUE(b);
    EXPECT_TRUE(r.has("u8"));
    EXPECT_FALSE(r.has("nope"));
    EXPECT_EQ(r.find("nope"), nullptr);

    // Wrong kinds and values out of range: errors naming the file, the key, what was expected
    // and what was found.
    auto error_of = [&](auto f) -> std::string {
        try {
            f();
        } catch (const Error& e) {
            return e.what();
        }
        return "";
    };
    EXPECT_EQ(error_of([&] { r.get_string("u32"); }),
              path + ": metadata 'u32': expected string, got uint32 4000000000");
    EXPECT_EQ(error_of([&] { r.get_u32("i8"); }),
              path + ": metadata 'i8': expected an integer that fits uint32, got int8 -100");
    EXPECT_EQ(error_of([&] { r.get_u32("u64"); }),
              path + ": metadata 'u64': expected an integer that fits uint32, got uint64 " +
                  std::to_string(~uint64_t{0}));
    EXPECT_EQ(error_of([&] { r.get_i64("u64"); }),
              path + ": metadata 'u64': expected an integer that fits int64, got uint64 " +
                  std::to_string(~uint64_t{0}));
    EXPECT_EQ(error_of([&] { r.get_u32("missing"); }), path + ": metadata 'missing': missing");
    EXPECT_EQ(error_of([&] { r.get_f32("string"); }),
              path + ": metadata 'string': expected float32 or float64, got string");
    EXPECT_EQ(error_of([&] { r.get_bool("u8"); }),
              path + ": metadata 'u8': expected bool, got uint8 200");
    EXPECT_EQ(error_of([&] { r.get_string_array("a.f32"); }),
              path + ": metadata 'a.f32': expected array of string, got array of float32");
    EXPECT_EQ(error_of([&] { r.get_f32_array("a.i32"); }),
              path +
                  ": metadata 'a.i32': expected array of float32 or float64, got array of "
                  "int32");
    EXPECT_EQ(error_of([&] { r.get_i32_array("a.u32"); }),
              path +
                  ": metadata 'a.u32': element 1: expected an integer that fits int32, got "
                  "uint32 4000000000");
    EXPECT_EQ(error_of([&] { r.get_u32_array("a.i32"); }),
              path +
                  ": metadata 'a.i32': element 0: expected an integer that fits uint32, got "
                  "int32 -5");
}

TEST(GgufRoundTrip, LargeStringArrayStreams) {
    // A vocabulary-sized array crosses the reader's buffer many times.
    test::TempDir tmp;
    const std::string path = tmp / "vocab.gguf";
    std::vector<std::string> vocab;
    for (int i = 0; i < 40000; ++i) vocab.push_back("token_" + std::to_string(i * 7919));
    vocab[123] = std::string(3 << 20, 'x');  // longer than the buffer
    std::vector<float> scores(vocab.size());
    for (size_t i = 0; i < scores.size(); ++i) scores[i] = -static_cast<float>(i);
    {
        Writer out(path);
        out.add("tokenizer.ggml.tokens", Value::string_array(vocab));
        out.add("tokenizer.ggml.scores", Value::f32_array(scores));
        out.add_tensor("x", {32}, TensorType::Q8_0);
        out.write_header();
        std::vector<float> x(32, 1.0f);
        out.append_f32(x.data(), 32);
        out.finish();
    }
    Reader r(path);
    EXPECT_EQ(r.get_string_array("tokenizer.ggml.tokens"), vocab);
    EXPECT_EQ(r.get_f32_array("tokenizer.ggml.scores"), scores);
    std::vector<float> x(32);
    r.read_f32(r.tensors()[0], 0, 32, x.data());
    for (float v : x) EXPECT_EQ(v, f16_to_f32(0x2008) * 127);  // d = 1/127 as f16, q = 127
}

// ---- the writer's own checks ----

TEST(GgufWriter, RefusesWhatTheFormatCannotHold) {
    test::TempDir tmp;
    const std::string path = tmp / "w.gguf";
    Writer out(path);
    out.add("k", Value::u32(1));
    EXPECT_THROW(out.add("k", Value::u32(2)), Error);
    EXPECT_THROW(out.add(kAlignmentKey, Value::u32(3)), Error);
    EXPECT_THROW(out.add(kAlignmentKey, Value::u32(0)), Error);
    EXPECT_THROW(out.add(kAlignmentKey, Value::u64(32)), Error);
    EXPECT_THROW(Value::scalar_array(ValueType::UINT32, "abc"), Error);
    EXPECT_THROW(Value::scalar_array(ValueType::ARRAY, ""), Error);
    out.add_tensor("t", {32, 2}, TensorType::Q8_0);
    EXPECT_THROW(out.add_tensor("t", {4}, TensorType::F32), Error);
    EXPECT_THROW(out.add_tensor("u", {}, TensorType::F32), Error);
    EXPECT_THROW(out.add_tensor("u", {1, 1, 1, 1, 1}, TensorType::F32), Error);
    EXPECT_THROW(out.add_tensor("u", {4, 0}, TensorType::F32), Error);
    EXPECT_THROW(out.add_tensor("u", {16}, TensorType::Q8_0), Error);
    EXPECT_THROW(out.add_tensor("u", {uint64_t{1} << 40, uint64_t{1} << 40}, TensorType::F32),
                 Error);
    EXPECT_THROW(out.add_tensor(std::string(64, 'n'), {4}, TensorType::F32), Error);
    EXPECT_THROW(out.add_tensor("u", {4}, static_cast<TensorType>(2)), Error);
    EXPECT_THROW(out.append("x", 1), Error);  // before the header
    out.write_header();
    EXPECT_THROW(out.add("late", Value::u32(1)), Error);
    EXPECT_THROW(out.add_tensor("late", {4}, TensorType::F32), Error);
    std::vector<float> x(64, 1.0f);
    EXPECT_THROW(out.append_f32(x.data(), 16), Error);  // not whole Q8_0 blocks
    out.append_f32(x.data(), 32);
    try {
        out.finish();  // one block of two is missing
        ADD_FAILURE() << "no error";
    } catch (const Error& e) {
        EXPECT_EQ(std::string(e.what()), path + ": tensor 't' has 34 of its 68 bytes of data");
    }
    EXPECT_THROW(out.append_f32(x.data(), 64), Error);  // more than is left
    out.append_f32(x.data(), 32);
    EXPECT_THROW(out.append("x", 1), Error);  // more than the tensors hold
    out.finish();
    EXPECT_NO_THROW(Reader{path});
}

TEST(GgufWriter, DestroyedWithoutFinishLeavesNoFile) {
    test::TempDir tmp;
    const std::string path = tmp / "never.gguf";
    {
        Writer out(path);
        out.add("k", Value::string("v"));
        out.add_tensor("t", {1000}, TensorType::F32);
        out.write_header();
        std::vector<float> x(500, 1.0f);
        out.append_f32(x.data(), x.size());
    }
    EXPECT_FALSE(std::filesystem::exists(path));
    EXPECT_TRUE(std::filesystem::is_empty(tmp.path()));  // nor its temporary file
    {
        Writer out(path);  // nothing written at all
    }
    EXPECT_TRUE(std::filesystem::is_empty(tmp.path()));
}

TEST(GgufWriter, FinishReplacesAnExistingFileAtomically) {
    test::TempDir tmp;
    const std::string path = tmp / "f.gguf";
    test::write_text(path, "old contents");
    {
        Writer out(path);
        out.add("k", Value::u32(7));
        out.write_header();
        EXPECT_EQ(file_bytes(path), "old contents");  // untouched until finish()
        out.finish();
    }
    EXPECT_EQ(Reader(path).get_u32("k"), 7u);
    EXPECT_EQ(std::distance(std::filesystem::directory_iterator(tmp.path()),
                            std::filesystem::directory_iterator()),
              1);
}

// ---- hostile files ----

struct TensorSpec {
    std::string name;
    std::vector<uint64_t> dims;
    uint32_t type = 0;
    uint64_t offset = 0;
};

// A file laid out by hand: header, the given metadata bytes, tensor infos, padding to
// `alignment`, `data_bytes` zero bytes.
std::string hand_file(const std::string& kvs, uint64_t n_kv, const std::vector<TensorSpec>& ts,
                      uint64_t data_bytes, uint32_t version = 3, size_t alignment = 32) {
    Bytes b;
    b.raw("GGUF").u32(version).u64(ts.size()).u64(n_kv).raw(kvs);
    for (const auto& t : ts) {
        b.str(t.name).u32(static_cast<uint32_t>(t.dims.size()));
        for (uint64_t d : t.dims) b.u64(d);
        b.u32(t.type).u64(t.offset);
    }
    b.pad_to(alignment).zeros(data_bytes);
    return b.s;
}

std::string kv_u32(const std::string& key, uint32_t v) {
    return Bytes().str(key).u32(4).u32(v).s;
}

TEST(GgufReader, WellFormedHandFileOpens) {
    test::TempDir tmp;
    const std::string path = tmp / "ok.gguf";
    write_bytes(path,
                hand_file(kv_u32("a", 1), 1, {{"x", {8}, 0, 0}, {"y", {32, 2}, 8, 32}}, 32 + 68));
    EXPECT_EQ(open_error(path), "");
    write_bytes(path, hand_file("", 0, {{"x", {8}, 0, 0}}, 32, 2));  // version 2
    EXPECT_EQ(open_error(path), "");
    EXPECT_EQ(Reader(path).version(), 2u);
}

TEST(GgufReader, EveryTruncationIsAnErrorNamingTheFile) {
    test::TempDir tmp;
    const std::string good = tmp / "good.gguf";
    {
        Writer out(good);
        out.add("general.name", Value::string("tiny"));
        out.add("a", Value::f32_array({1.0f, 2.0f}));
        out.add("s", Value::string_array({"p", "q"}));
        out.add_tensor("x", {8}, TensorType::F32);  // 32 bytes: the file ends with its data
        out.write_header();
        std::vector<float> x(8, 1.0f);
        out.append_f32(x.data(), 8);
        out.finish();
    }
    const std::string bytes = file_bytes(good);
    ASSERT_EQ(open_error(good), "");
    const std::string path = tmp / "cut.gguf";
    for (size_t n = 0; n < bytes.size(); ++n) {
        write_bytes(path, bytes.substr(0, n));
        const std::string err = open_error(path);
        ASSERT_TRUE(starts_with(err, path + ": "))
            << "prefix of " << n << " bytes: '" << err << "'";
    }
}

TEST(GgufReader, MalformedFilesAreErrorsNamingTheField) {
    test::TempDir tmp;
    const std::string path = tmp / "bad.gguf";
    const uint64_t huge = uint64_t{1} << 40;
    const std::vector<TensorSpec> one = {{"x", {8}, 0, 0}};
    struct Case {
        const char* what;
        std::string bytes;
        std::vector<std::string> expect;  // substrings of the error after "PATH: "
    };
    std::string bad_magic = hand_file("", 0, one, 32);
    bad_magic[3] = 'X';
    std::string big_endian = hand_file("", 0, one, 32);
    big_endian[4] = 0, big_endian[7] = 3;
    const std::vector<Case> cases = {
        {"wrong magic", bad_magic, {"magic"}},
        {"version 1", hand_file("", 0, one, 32, 1), {"version 1"}},
        {"version 4", hand_file("", 0, one, 32, 4), {"version 4"}},
        {"big-endian", big_endian, {"big-endian"}},
        {"key length past the end", Bytes().u64(huge).s, {"metadata key #0", "exceeds the file"}},
        {"string value past the end",
         Bytes().str("name").u32(8).u64(huge).s,
         {"metadata 'name'", "string length 1099511627776", "exceeds the file"}},
        {"array count past the end",
         Bytes().str("arr").u32(9).u32(6).u64(huge).s,
         {"metadata 'arr'", "array of 1099511627776 float32 exceeds the file"}},
        {"string array count past the end",
         Bytes().str("arr").u32(9).u32(8).u64(~uint64_t{0}).s,
         {"metadata 'arr'", "strings exceeds the file"}},
        {"array element string past the end",
         Bytes().str("arr").u32(9).u32(8).u64(2).str("ok").u64(huge).s,
         {"metadata 'arr' element 1", "exceeds the file"}},
        {"nested array",
         Bytes().str("arr").u32(9).u32(9).u64(0).s,
         {"metadata 'arr'", "arrays of arrays"}},
        {"unknown value type",
         Bytes().str("k").u32(13).u32(0).s,
         {"metadata 'k'", "unknown value type 13"}},
        {"unknown element type",
         Bytes().str("k").u32(9).u32(99).u64(0).s,
         {"metadata 'k'", "unknown array element type 99"}},
        {"bool value 2", Bytes().str("k").u32(7).u8(2).s, {"metadata 'k'", "bool value 2"}},
        {"bool element 5",
         Bytes().str("k").u32(9).u32(7).u64(2).u8(1).u8(5).s,
         {"metadata 'k'", "bool element 1 is 5"}},
        {"duplicate key", kv_u32("k", 1) + kv_u32("k", 2), {"metadata 'k'", "duplicate key"}},
        {"alignment 0", kv_u32("general.alignment", 0), {"'general.alignment'", "power of two"}},
        {"alignment 3", kv_u32("general.alignment", 3), {"'general.alignment'", "power of two"}},
        {"alignment as uint64",
         Bytes().str("general.alignment").u32(10).u64(32).s,
         {"'general.alignment'", "uint32 power of two, got uint64 32"}},
    };
    // Cases of metadata hold one pair each (the duplicate key two).
    for (const Case& c : cases) {
        SCOPED_TRACE(c.what);
        std::string bytes = c.bytes;
        if (bytes.compare(0, 4, "GGUF") != 0 && bytes.compare(0, 4, "GGUX") != 0) {
            const uint64_t n_kv = std::string(c.what) == "duplicate key" ? 2 : 1;
            bytes = hand_file(bytes, n_kv, one, 32);
        }
        write_bytes(path, bytes);
        const std::string err = open_error(path);
        ASSERT_TRUE(starts_with(err, path + ": ")) << err;
        for (const auto& s : c.expect) EXPECT_NE(err.find(s), std::string::npos) << err;
    }

    const std::vector<
        std::tuple<const char*, std::vector<TensorSpec>, uint64_t, std::vector<std::string>>>
        tensor_cases = {
            {"n_dims 0", {{"x", {}, 0, 0}}, 64, {"tensor 'x'", "n_dims 0"}},
            {"n_dims 5", {{"x", {1, 1, 1, 1, 8}, 0, 0}}, 64, {"tensor 'x'", "n_dims 5"}},
            {"dim 0", {{"x", {8, 0}, 0, 0}}, 64, {"tensor 'x'", "dims[1] is 0"}},
            {"element count overflow",
             {{"x", {uint64_t{1} << 32, uint64_t{1} << 32}, 0, 0}},
             64,
             {"tensor 'x'", "overflow"}},
            {"byte count overflow",
             {{"x", {uint64_t{1} << 62}, 0, 0}},
             64,
             {"tensor 'x'", "overflow"}},
            {"dim over int64", {{"x", {~uint64_t{0}}, 0, 0}}, 64, {"tensor 'x'", "overflow"}},
            {"unknown type", {{"x", {8}, 2, 0}}, 64, {"tensor 'x'", "tensor type 2"}},
            {"unknown type 99", {{"x", {8}, 99, 0}}, 64, {"tensor 'x'", "tensor type 99"}},
            {"q8_0 row not a multiple of 32",
             {{"x", {16, 2}, 8, 0}},
             64,
             {"tensor 'x'", "multiple of 32"}},
            {"unaligned offset", {{"x", {8}, 0, 4}}, 64, {"tensor 'x'", "offset 4"}},
            {"data past the end", {{"x", {8}, 0, 0}}, 31, {"tensor 'x'", "past the end"}},
            {"offset past the end", {{"x", {8}, 0, huge}}, 64, {"tensor 'x'", "past the end"}},
            {"overlapping tensors",
             {{"x", {8}, 0, 32}, {"y", {16}, 0, 0}},
             96,
             {"tensor 'x'", "overlaps tensor 'y'"}},
            {"duplicate tensor name",
             {{"x", {8}, 0, 0}, {"x", {8}, 0, 32}},
             64,
             {"tensor 'x'", "duplicate tensor name"}},
        };
    for (const auto& [what, ts, data, expect] : tensor_cases) {
        SCOPED_TRACE(what);
        write_bytes(path, hand_file("", 0, ts, data));
        const std::string err = open_error(path);
        ASSERT_TRUE(starts_with(err, path + ": ")) << err;
        for (const auto& s : expect) EXPECT_NE(err.find(s), std::string::npos) << err;
    }

    // Counts that cannot fit in the file are refused before anything is allocated.
    for (const auto& [tc, kc] : std::vector<std::pair<uint64_t, uint64_t>>{
             {~uint64_t{0}, 0}, {0, ~uint64_t{0}}, {huge, 0}, {0, huge}}) {
        write_bytes(path, Bytes().raw("GGUF").u32(3).u64(tc).u64(kc).zeros(64).s);
        const std::string err = open_error(path);
        ASSERT_TRUE(starts_with(err, path + ": ")) << err;
        EXPECT_NE(err.find(tc ? "tensor_count" : "metadata_kv_count"), std::string::npos) << err;
    }
    // The alignment a file sets is the one its offsets are checked against.
    write_bytes(path, hand_file(kv_u32("general.alignment", 64), 1,
                                {{"x", {8}, 0, 0}, {"y", {8}, 0, 32}}, 96, 3, 64));
    EXPECT_NE(open_error(path).find("offset 32 is not a multiple of the alignment 64"),
              std::string::npos);
    // Not a regular file.
    EXPECT_TRUE(starts_with(open_error(tmp.path().string()), tmp.path().string() + ": "));
    EXPECT_TRUE(starts_with(open_error(tmp / "missing.gguf"), tmp / "missing.gguf"));
}

// Random corruption of a valid file: the reader opens it or gives a tmx::Error, and a file that
// opens reads every tensor.
TEST(GgufReader, CorruptedFilesNeverCrash) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    Rng rng(seed);
    test::TempDir tmp;
    const std::string good = tmp / "good.gguf";
    {
        Writer out(good);
        out.add("s", Value::string("abc"));
        out.add("a", Value::string_array({"x", "yz"}));
        out.add("f", Value::f32_array({1, 2, 3}));
        out.add_tensor("q", {32, 2}, TensorType::Q8_0);
        out.add_tensor("h", {3, 2}, TensorType::F16);
        out.write_header();
        const std::vector<float> x = test::random_normal(rng, 64);
        out.append_f32(x.data(), 64);
        out.append_f32(x.data(), 6);
        out.finish();
    }
    const std::string bytes = file_bytes(good);
    const std::string path = tmp / "corrupt.gguf";
    int opened = 0;
    for (int i = 0; i < 3000; ++i) {
        std::string b = bytes;
        const int flips = 1 + static_cast<int>(rng.below(4));
        for (int f = 0; f < flips; ++f) {
            const size_t at = rng.below(b.size());
            if (rng.below(2))
                b[at] = static_cast<char>(rng.next_u64());
            else
                b[at] ^= static_cast<char>(1u << rng.below(8));
        }
        write_bytes(path, b);
        try {
            Reader r(path);
            ++opened;
            for (const auto& [k, v] : r.metadata())
                for (uint64_t e = 0; e < v.size(); ++e) (void)v.at(e);
            for (const auto& t : r.tensors()) {
                std::vector<float> out(t.numel);
                r.read_f32(t, 0, t.numel, out.data());
            }
        } catch (const Error& e) {
            ASSERT_TRUE(starts_with(e.what(), path + ": ")) << e.what();
        }
    }
    EXPECT_GT(opened, 0);
}

}  // namespace
}  // namespace tmx::gguf

// The safetensors reader against malformed files: each violation of the format's rules is an
// error naming the file and the tensor, never a silent acceptance or an overflow.
#include "engine/model/safetensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/errors.h"
#include "engine/core/file_io.h"
#include "engine/core/rng.h"
#include "tests/test_util.h"

namespace tmx {
namespace {

// A safetensors file from a header written by hand (so that it can break the rules) and
// `data_bytes` zero bytes of data.
std::string write_safetensors(const test::TempDir& tmp, const std::string& header,
                              size_t data_bytes) {
    std::string bytes;
    for (int i = 0; i < 8; ++i)
        bytes.push_back(static_cast<char>((uint64_t{header.size()} >> (8 * i)) & 0xff));
    bytes += header;
    bytes.append(data_bytes, '\0');
    const std::string path = tmp / "model.safetensors";
    write_file_atomic(path, bytes);
    return path;
}

// The error opening the file gives, or "" when it opens.
std::string open_error(const std::string& path) {
    try {
        SafetensorsFile file(path);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

std::string entry(const std::string& name, const std::string& shape, uint64_t begin, uint64_t end) {
    return "\"" + name + "\": {\"dtype\": \"F32\", \"shape\": " + shape + ", \"data_offsets\": [" +
           std::to_string(begin) + ", " + std::to_string(end) + "]}";
}

TEST(Safetensors, WellFormedFileOpens) {
    test::TempDir tmp;
    const std::string path =
        write_safetensors(tmp,
                          "{" + entry("a", "[2]", 0, 8) + ", " + entry("b", "[3]", 8, 20) + ", " +
                              entry("empty", "[0]", 20, 20) + "}",
                          20);
    EXPECT_EQ(open_error(path), "");
}

// Every malformed header of the issue, each an error that names the tensor at fault.
TEST(Safetensors, MalformedHeadersAreErrorsNamingTheTensor) {
    struct Case {
        const char* what;
        std::string header;
        size_t data_bytes;
        std::string expected;  // in the message, besides the path
    };
    const std::string a = entry("a", "[2]", 0, 8);
    const Case cases[] = {
        {"a tensor listed twice", "{" + a + ", " + entry("b", "[1]", 8, 12) + ", " + a + "}", 12,
         "corrupt header: key 'a' appears twice"},
        {"a key twice in one entry",
         "{\"a\": {\"dtype\": \"F32\", \"dtype\": \"F32\", \"shape\": [2], "
         "\"data_offsets\": [0, 8]}}",
         8, "corrupt header: key 'a.dtype' appears twice"},
        {"overlapping ranges", "{" + a + ", " + entry("b", "[2]", 4, 12) + "}", 12,
         "tensor 'b': data [4, 12) overlaps tensor 'a'"},
        {"a gap between ranges", "{" + a + ", " + entry("b", "[1]", 12, 16) + "}", 16,
         "tensor 'b': data [12, 16) leaves bytes [8, 12)"},
        {"a range that ends before it begins", "{" + entry("a", "[0]", 8, 0) + "}", 8,
         "tensor 'a': data_offsets [8, 0] end before they begin"},
        {"data after the last tensor", "{" + a + "}", 24, "data bytes [8, 24) belong to no tensor"},
        {"a first range that does not start at 0", "{" + entry("a", "[2]", 8, 16) + "}", 16,
         "tensor 'a': data [8, 16) leaves bytes [0, 8)"},
        {"a shape whose element count overflows",
         "{" + entry("a", "[4294967296, 4294967296]", 0, 0) + "}", 0,
         "tensor 'a': shape [4294967296,4294967296]: size overflows a 64-bit integer"},
        {"a shape whose byte size overflows",
         "{" + entry("a", "[2305843009213693952, 2]", 0, 0) + "}", 0,
         "tensor 'a': byte size of shape [2305843009213693952,2]: size overflows"},
        {"a dimension beyond int64", "{" + entry("a", "[9223372036854775808]", 0, 0) + "}", 0,
         "tensor 'a': field 'shape[0]': expected an integer >= 0 that fits in 64 bits, got "
         "9223372036854775808"},
        {"a dimension beyond 64 bits", "{" + entry("a", "[18446744073709551616]", 0, 0) + "}", 0,
         "tensor 'a': field 'shape[0]': expected an integer >= 0, got 1.8446744073709552e+19"},
        {"a negative offset",
         "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [-8, 0]}}", 8,
         "tensor 'a': field 'data_offsets[0]': expected an integer >= 0, got -8"},
        {"an offset beyond 64 bits",
         "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], "
         "\"data_offsets\": [0, 18446744073709551624]}}",
         8, "tensor 'a': field 'data_offsets[1]': expected an integer >= 0, got 1.84467"},
        {"a fractional dimension", "{" + entry("a", "[2.5]", 0, 10) + "}", 10,
         "tensor 'a': field 'shape[0]': expected an integer >= 0, got 2.5"},
    };
    for (const Case& c : cases) {
        SCOPED_TRACE(c.what);
        test::TempDir tmp;
        const std::string path = write_safetensors(tmp, c.header, c.data_bytes);
        const std::string error = open_error(path);
        EXPECT_NE(error.find(path + ": "), std::string::npos) << error;
        EXPECT_NE(error.find(c.expected), std::string::npos) << error;
    }
}

// f32 -> f16: round to nearest even, overflow to infinity, subnormals kept, NaN kept.
TEST(Safetensors, F32ToF16RoundsToNearestEven) {
    EXPECT_EQ(f32_to_f16(1.0f), 0x3C00);
    EXPECT_EQ(f32_to_f16(-2.0f), 0xC000);
    EXPECT_EQ(f32_to_f16(65504.0f), 0x7BFF);
    EXPECT_EQ(f32_to_f16(65519.0f), 0x7BFF);
    EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);  // the tie goes to the even neighbour: infinity
    EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
    EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);  // half of it: a tie, to even 0
    EXPECT_EQ(f32_to_f16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 units: a tie, to even 2
    EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
    EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);  // tie between 1 and 1+2^-10
    EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(3.0f, -11)), 0x3C02);  // tie, to even 0x3C02
    EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(std::nanf("")))));
    // Every f16 value survives the round trip; random values land within half an f16 step.
    for (uint32_t h = 0; h < 0x10000; ++h) {
        const float f = f16_to_f32(static_cast<uint16_t>(h));
        if (!std::isnan(f)) {
            EXPECT_EQ(f32_to_f16(f), h) << h;
        }
    }
    Rng rng(test::fresh_seed());
    for (int i = 0; i < 10000; ++i) {
        const float x = static_cast<float>(rng.normal() * 100.0);
        const float y = f16_to_f32(f32_to_f16(x));
        EXPECT_LE(std::fabs(y - x), std::ldexp(std::fabs(x), -11) + 1e-7f) << x;
    }
}

// The streaming writer writes the same bytes as the whole-file encoder, and the reader gets the
// values back (BF16 and F16 within their rounding).
TEST(Safetensors, StreamingWriterMatchesTheEncoderAndReadsBack) {
    Rng rng(test::fresh_seed());
    test::TempDir dir;
    std::vector<float> a(6 * 5), b(7);
    for (float& x : a) x = static_cast<float>(rng.normal());
    for (float& x : b) x = static_cast<float>(rng.normal());
    for (StorageType dtype : {StorageType::F32, StorageType::BF16, StorageType::F16}) {
        SCOPED_TRACE(to_string(dtype));
        const std::string path = dir / (std::string(to_string(dtype)) + ".safetensors");
        {
            SafetensorsWriter w(path, {{"a", {6, 5}, dtype}, {"b", {7}, dtype}});
            w.write_next(a.data());
            w.write_next(b.data());
            w.finish();
        }
        EXPECT_EQ(read_file(path),
                  encode_safetensors({{"b", {7}, b.data()}, {"a", {6, 5}, a.data()}}, dtype));
        SafetensorsFile f(path);
        std::vector<float> back(a.size());
        f.read_f32("a", back.data());
        const float rel = dtype == StorageType::F32    ? 0.0f
                          : dtype == StorageType::BF16 ? std::ldexp(1.0f, -8)
                                                       : std::ldexp(1.0f, -11);
        for (size_t i = 0; i < a.size(); ++i)
            EXPECT_LE(std::fabs(back[i] - a[i]), rel * std::fabs(a[i]));
    }
}

}  // namespace
}  // namespace tmx

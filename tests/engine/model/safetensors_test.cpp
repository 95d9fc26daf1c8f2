// The safetensors reader against malformed files: each violation of the format's rules is an
// error naming the file and the tensor, never a silent acceptance or an overflow.
#include "engine/model/safetensors.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "engine/core/errors.h"
#include "engine/core/file_io.h"
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
         "tensor 'a' is listed twice"},
        {"a key twice in one entry",
         "{\"a\": {\"dtype\": \"F32\", \"dtype\": \"F32\", \"shape\": [2], "
         "\"data_offsets\": [0, 8]}}",
         8, "tensor 'a': key 'dtype' appears twice"},
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

}  // namespace
}  // namespace tmx

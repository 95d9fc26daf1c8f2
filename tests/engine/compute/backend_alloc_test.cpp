// Backend::alloc sizes buffers with checked arithmetic: a shape whose byte count does not fit in
// 64 bits, or that has a negative dimension, is a tmx::Error naming the shape; nothing is
// allocated and the memory accounting does not move.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "backends/registry.h"
#include "engine/compute/backend.h"
#include "engine/core/errors.h"
#include "tests/test_util.h"

namespace tmx {
namespace {

// The message of the tmx::Error that allocating `shape` throws, or "" when it allocates.
std::string alloc_error(Backend& be, const Shape& shape) {
    try {
        be.alloc(shape);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

TEST(BackendAlloc, AShapeWhoseBytesDoNotFitIsAnErrorNamingIt) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("TMX_TEST_SEED=" + std::to_string(seed));
    Rng rng(seed);
    auto be = make_backend("cpu");
    const size_t live = be->memory_stats().live_bytes;
    for (int round = 0; round < 20; ++round) {
        // Elements fit in int64_t, bytes (4 each) do not: 2^62 + s elements took 4s bytes when
        // the product wrapped, a tensor larger than memory on a buffer of a few bytes.
        const int64_t s = static_cast<int64_t>(rng.below(1000));
        const Shape wraps = {(int64_t{1} << 62) + s};
        // Elements that do not fit in int64_t.
        const int64_t big = (int64_t{1} << 32) + static_cast<int64_t>(rng.below(1 << 20));
        const Shape too_many = {big, 3, big};
        // A negative dimension (shape_numel would make the count negative or positive).
        const int64_t n = 1 + static_cast<int64_t>(rng.below(1000));
        const Shape negative = rng.below(2) ? Shape{-n, n} : Shape{-n, -n};
        for (const Shape& shape : {wraps, too_many, negative}) {
            SCOPED_TRACE(shape_string(shape));
            const std::string e = alloc_error(*be, shape);
            EXPECT_NE(e.find(shape_string(shape)), std::string::npos) << e;
            EXPECT_TRUE(e.find("overflows a 64-bit integer") != std::string::npos ||
                        e.find("a dimension is negative") != std::string::npos)
                << e;
            EXPECT_EQ(be->memory_stats().live_bytes, live);
        }
    }
    // A shape that fits allocates exactly its bytes.
    const Shape fits = {1 + static_cast<int64_t>(rng.below(100)),
                        1 + static_cast<int64_t>(rng.below(100))};
    const Tensor t = be->alloc(fits);
    EXPECT_EQ(be->memory_stats().live_bytes, live + static_cast<size_t>(4 * fits[0] * fits[1]));
}

}  // namespace
}  // namespace tmx

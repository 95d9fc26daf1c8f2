// Tensor::joined: two views of one buffer, the second directly after the first, as one view
// (a decoded token's q and k, slices of one projection's row, rotated by one RoPE); anything
// else is an undefined tensor, never a view reaching elements of neither.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "backends/registry.h"
#include "engine/compute/backend.h"
#include "tests/test_util.h"

namespace tmx {
namespace {

TEST(TensorJoined, AdjacentSlicesOfOneBufferBecomeOneView) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("TMX_TEST_SEED=" + std::to_string(seed));
    Rng rng(seed);
    auto be = make_backend("cpu");
    for (int round = 0; round < 20; ++round) {
        const int64_t a = 1 + static_cast<int64_t>(rng.below(40)),
                      b = 1 + static_cast<int64_t>(rng.below(40)),
                      rest = static_cast<int64_t>(rng.below(10));
        const std::vector<float> values =
            test::random_normal(rng, static_cast<size_t>(a + b + rest));
        const Tensor row = be->alloc({a + b + rest});
        be->upload(row, values.data());
        const Tensor first = row.slice(0, {a}), second = row.slice(a, {b});

        const Tensor both = first.joined(second, {1, a + b});
        ASSERT_TRUE(both.defined());
        EXPECT_EQ(both.shape(), (Shape{1, a + b}));
        EXPECT_EQ(both.offset(), first.offset());
        std::vector<float> got(static_cast<size_t>(a + b));
        be->download(both, got.data());
        EXPECT_EQ(got, std::vector<float>(values.begin(), values.begin() + a + b));

        // Not in that order, not adjacent, another buffer, a shape of another size.
        EXPECT_FALSE(second.joined(first, {a + b}).defined());
        if (rest > 0) {
            EXPECT_FALSE(first.joined(row.slice(a + 1, {b}), {a + b}).defined());
        }
        const Tensor other = be->alloc({b});
        EXPECT_FALSE(first.joined(other, {a + b}).defined());
        EXPECT_FALSE(first.joined(second, {a + b + 1}).defined());
        EXPECT_FALSE(Tensor{}.joined(second, {b}).defined());
    }
}

}  // namespace
}  // namespace tmx

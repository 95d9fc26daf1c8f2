#include "engine/compute/precision.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "engine/core/errors.h"
#include "engine/core/rng.h"
#include "tests/test_util.h"

namespace tmx {
namespace {

float from_bits(uint32_t u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}
uint32_t bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
}

// The nearest bf16 by exact comparison in double: the two bf16 values around x (x's upper 16
// bits, and one bf16 ulp further from 0), the closer one, or on a tie the one with an even
// last bit. Past the largest bf16 the next "value" is 2^128 (infinity's bits), as IEEE rounding
// treats it. Finite x only.
uint32_t nearest_bf16_reference(float x) {
    const uint32_t toward_zero = bits(x) & 0xffff0000u;
    const uint32_t away = toward_zero + 0x10000u;
    const double lo = from_bits(toward_zero);
    const double hi = (away & 0x7fffffffu) == 0x7f800000u ? std::copysign(std::ldexp(1.0, 128), x)
                                                          : static_cast<double>(from_bits(away));
    const double d_lo = std::abs(static_cast<double>(x) - lo);
    const double d_hi = std::abs(hi - static_cast<double>(x));
    if (d_lo < d_hi) return toward_zero;
    if (d_hi < d_lo) return away;
    return (toward_zero >> 16) % 2 == 0 ? toward_zero : away;
}

TEST(RoundToBf16, TiesGoToTheEvenNeighbour) {
    // 1 + 2^-8 lies halfway between 1 (even last bit) and 1 + 2^-7 (odd): down.
    EXPECT_EQ(bits(round_to_bf16(from_bits(0x3f808000u))), 0x3f800000u);
    // 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): up.
    EXPECT_EQ(bits(round_to_bf16(from_bits(0x3f818000u))), 0x3f820000u);
    // Just past and just short of the tie.
    EXPECT_EQ(bits(round_to_bf16(from_bits(0x3f808001u))), 0x3f810000u);
    EXPECT_EQ(bits(round_to_bf16(from_bits(0x3f807fffu))), 0x3f800000u);
    // The sign does not take part.
    EXPECT_EQ(bits(round_to_bf16(from_bits(0xbf808000u))), 0xbf800000u);
    EXPECT_EQ(bits(round_to_bf16(from_bits(0xbf818000u))), 0xbf820000u);
    // Exact bf16 values are unchanged.
    for (float v : {0.0f, -0.0f, 1.0f, -2.5f, 0.15625f, 3.0e38f})
        EXPECT_EQ(bits(round_to_bf16(round_to_bf16(v))), bits(round_to_bf16(v)));
    EXPECT_EQ(bits(round_to_bf16(-0.0f)), 0x80000000u);
}

TEST(RoundToBf16, SubnormalsRoundLikeAnyOtherValue) {
    EXPECT_EQ(bits(round_to_bf16(from_bits(0x00000001u))), 0x00000000u);  // smallest: to 0
    EXPECT_EQ(bits(round_to_bf16(from_bits(0x00008000u))), 0x00000000u);  // tie, to even 0
    EXPECT_EQ(bits(round_to_bf16(from_bits(0x00018000u))), 0x00020000u);  // tie, to even
    EXPECT_EQ(bits(round_to_bf16(from_bits(0x00008001u))), 0x00010000u);  // past the tie
    EXPECT_EQ(bits(round_to_bf16(from_bits(0x807fffffu))), 0x80800000u);  // up to the normals
}

TEST(RoundToBf16, InfinitiesStayAndOverflowGoesToInfinity) {
    const float inf = std::numeric_limits<float>::infinity();
    EXPECT_EQ(round_to_bf16(inf), inf);
    EXPECT_EQ(round_to_bf16(-inf), -inf);
    EXPECT_EQ(round_to_bf16(std::numeric_limits<float>::max()), inf);  // past bf16's largest
    EXPECT_EQ(round_to_bf16(-std::numeric_limits<float>::max()), -inf);
    EXPECT_EQ(bits(round_to_bf16(from_bits(0x7f7f7fffu))), 0x7f7f0000u);  // short of the tie
}

TEST(RoundToBf16, NanStaysNanWithItsSign) {
    // A NaN whose payload is all in the dropped bits would truncate to infinity: it must not.
    for (uint32_t u : {0x7fc00000u, 0x7f800001u, 0x7fbfffffu, 0x7fffffffu, 0xff800001u}) {
        const float r = round_to_bf16(from_bits(u));
        EXPECT_TRUE(std::isnan(r)) << std::hex << u;
        EXPECT_EQ(bits(r) & 0xffffu, 0u) << std::hex << u;  // a bf16 value
        EXPECT_EQ(bits(r) >> 31, u >> 31) << std::hex << u;
    }
}

TEST(RoundToBf16, MatchesExactNearestEvenOnRandomFloats) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("TMX_TEST_SEED=" + std::to_string(seed));
    Rng rng(seed);
    int checked = 0;
    while (checked < 200000) {
        const uint32_t u = static_cast<uint32_t>(rng.next_u64());
        const float x = from_bits(u);
        if (!std::isfinite(x)) continue;
        const uint32_t got = bits(round_to_bf16(x)), want = nearest_bf16_reference(x);
        ASSERT_EQ(got, want) << "x bits " << std::hex << u;
        ++checked;
    }
}

TEST(Precision, ParsesItsTwoNamesAndNamesTheFlagOtherwise) {
    EXPECT_EQ(parse_precision("fp32", "--precision"), Precision::F32);
    EXPECT_EQ(parse_precision("bf16", "--precision"), Precision::BF16);
    EXPECT_STREQ(to_string(Precision::BF16), "bf16");
    EXPECT_STREQ(to_string(Precision::F32), "fp32");
    try {
        parse_precision("fp16", "run/trainer_state.json: precision");
        FAIL() << "fp16 accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("run/trainer_state.json: precision"),
                  std::string::npos);
        EXPECT_NE(std::string(e.what()).find("'fp16'"), std::string::npos);
    }
}

}  // namespace
}  // namespace tmx

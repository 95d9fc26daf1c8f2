// The one JSON field reader: each getter takes what its type allows and nothing else, and every
// error names the source, the field, what was expected and what was found.
#include "engine/core/json_fields.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/core/errors.h"
#include "engine/core/rng.h"
#include "tests/test_util.h"

namespace tmx {
namespace {

using nlohmann::json;

using test::error_of;

TEST(JsonFields, TypedGettersTakeTheirTypeAndNameTheFieldOtherwise) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("TMX_TEST_SEED=" + std::to_string(seed));
    Rng rng(seed);
    const int64_t n = static_cast<int64_t>(rng.below(uint64_t{1} << 62)) - (int64_t{1} << 61);
    const double x = rng.normal() * 1e3;
    const json j = {{"n", n}, {"x", x}, {"name", "abc"}, {"flag", true}, {"big", UINT64_MAX}};
    const json_fields::Fields f(j, "run/state.json");
    EXPECT_EQ(f.integer("n"), n);
    EXPECT_EQ(f.number("x"), x);
    EXPECT_EQ(f.number("n"), static_cast<double>(n));  // an integer is a number
    EXPECT_EQ(f.string("name"), "abc");
    EXPECT_TRUE(f.boolean("flag"));
    EXPECT_EQ(f.uinteger("big"), UINT64_MAX);

    EXPECT_EQ(error_of([&] { f.integer("missing"); }),
              "run/state.json: field 'missing': missing (expected an integer)");
    EXPECT_EQ(error_of([&] { f.integer("x"); }),
              "run/state.json: field 'x': expected an integer, got " + j["x"].dump());
    EXPECT_EQ(error_of([&] { f.integer("big"); }),
              "run/state.json: field 'big': expected an integer that fits in 64 bits, got "
              "18446744073709551615");
    if (n < 0) {
        EXPECT_EQ(error_of([&] { f.integer("n", 0); }),
                  "run/state.json: field 'n': expected an integer >= 0, got " + std::to_string(n));
    }
    EXPECT_EQ(error_of([&] { f.string("n"); }),
              "run/state.json: field 'n': expected a string, got " + std::to_string(n));
    EXPECT_EQ(error_of([&] { f.boolean("name"); }),
              "run/state.json: field 'name': expected true or false, got \"abc\"");
    EXPECT_EQ(error_of([&] { f.uinteger("name"); }),
              "run/state.json: field 'name': expected an integer >= 0, got \"abc\"");
    EXPECT_EQ(error_of([&] { json_fields::Fields(json::array({1}), "a.json"); }),
              "a.json: expected a JSON object, got [1]");
}

TEST(JsonFields, LongValuesAreCutInMessagesAndEnumsListTheirChoices) {
    const json long_string = std::string(100, 'x');
    EXPECT_EQ(json_fields::describe(long_string).size(), 40u);
    const std::map<std::string, int> choices = {{"a", 1}, {"b", 2}};
    EXPECT_EQ(json_fields::as_enum(json("b"), "c.json", "kind", choices), 2);
    EXPECT_EQ(error_of([&] { json_fields::as_enum(json("z"), "c.json", "kind", choices); }),
              "c.json: field 'kind': expected one of \"a\", \"b\", got \"z\"");
}

}  // namespace
TEST(JsonFields, BoundedIntegersWholeNumbersAndStringListsNameTheFieldAndPath) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("TMX_TEST_SEED=" + std::to_string(seed));
    Rng rng(seed);
    const int64_t id = static_cast<int64_t>(rng.below(1000)) + 1;
    const json j = {{"id", id},
                    {"wide", int64_t{1} << 31},
                    {"pieces", {"a", "b"}},
                    {"mixed", {"a", 3}},
                    {"inner", {{"n", -id}}}};
    const json_fields::Fields f(j, "d/meta.json");
    EXPECT_EQ(f.integer("id", INT32_MIN, INT32_MAX), id);
    EXPECT_EQ(error_of([&] { f.integer("wide", INT32_MIN, INT32_MAX); }),
              "d/meta.json: field 'wide': expected an integer from -2147483648 to 2147483647, "
              "got 2147483648");
    EXPECT_EQ(f.string_list("pieces"), (std::vector<std::string>{"a", "b"}));
    EXPECT_EQ(error_of([&] { f.string_list("mixed"); }),
              "d/meta.json: field 'mixed[1]': expected a string, got 3");
    const json_fields::Fields inner(j.at("inner"), "d/meta.json", "inner.");
    EXPECT_EQ(error_of([&] { inner.integer("n", 0); }),
              "d/meta.json: field 'inner.n': expected an integer >= 0, got " + std::to_string(-id));
    EXPECT_EQ(error_of([&] { inner.string("gone"); }),
              "d/meta.json: field 'inner.gone': missing (expected a string)");

    // Whole numbers: an integer, or a double whose fraction is zero; never 2.5 or 1e300.
    const double whole = static_cast<double>(rng.below(1 << 20));
    EXPECT_EQ(json_fields::as_whole_number(json(whole), "c.json", "hidden_size"),
              static_cast<int64_t>(whole));
    EXPECT_EQ(json_fields::as_whole_number(json(id), "c.json", "hidden_size"), id);
    for (const json& bad : {json(whole + 0.5), json(1e300), json("4096")})
        EXPECT_EQ(error_of([&] {
                      json_fields::as_whole_number(bad, "c.json", "hidden_size");
                  }).rfind("c.json: field 'hidden_size': expected an integer, got ", 0),
                  0u)
            << bad.dump();
}

}  // namespace tmx

// The JSON Schema compiler and its automaton (engine/infer/json_schema.h): hand-picked texts
// accepted and refused, refusals naming the keyword and its path, random valid texts of random
// schemas accepted with every prefix alive, and everything the automaton accepts (random walks
// through it, random mutations of valid texts) parsing and validating.
#include "engine/infer/json_schema.h"

#include <gtest/gtest.h>

#include "tests/engine/infer/json_schema_cases.h"
#include "tests/test_util.h"

namespace tmx {
namespace {

using nlohmann::json;
using test::ojson;

JsonDfa dfa_of(const std::string& schema) {
    return JsonDfa(compile_json_schema(ojson::parse(schema)));
}

// A random text the automaton accepts: random bytes it allows, favouring the ones that close
// strings, numbers and containers so that walks end; "" when a walk runs too long.
std::string random_walk(JsonDfa& dfa, Rng& rng, size_t max_bytes = 3000) {
    static const std::string closing = "\"}],:0123456789truefalsn";
    std::string text;
    int32_t s = dfa.start();
    while (text.size() < max_bytes) {
        if (dfa.accepting(s) && (!dfa.can_continue(s) || rng.uniform() < 0.3)) return text;
        std::vector<uint8_t> allowed, preferred;
        for (int b = 0; b < 256; ++b)
            if (dfa.next(s, static_cast<uint8_t>(b)) != JsonDfa::kDead) {
                allowed.push_back(static_cast<uint8_t>(b));
                if (closing.find(static_cast<char>(b)) != std::string::npos)
                    preferred.push_back(static_cast<uint8_t>(b));
            }
        EXPECT_FALSE(allowed.empty()) << "a live state with no way on after: " << text;
        if (allowed.empty()) return "";
        const auto& from = !preferred.empty() && rng.uniform() < 0.7 ? preferred : allowed;
        const uint8_t b = from[rng.next_u64() % from.size()];
        text.push_back(static_cast<char>(b));
        s = dfa.next(s, b);
    }
    return "";
}

// Parses and validates, with the text in the failure message.
void expect_valid(const std::string& text, const ojson& schema) {
    json value;
    try {
        value = json::parse(text);
    } catch (const json::exception& e) {
        ADD_FAILURE() << "not JSON: " << text << " (" << e.what() << ")\nschema " << schema.dump();
        return;
    }
    EXPECT_TRUE(test::validates(value, schema)) << text << "\nschema " << schema.dump();
}

TEST(JsonSchema, HandPickedTextsAreAcceptedOrRefused) {
    JsonDfa person = dfa_of(test::sample_schemas()[0].dump());
    for (const char* ok :
         {R"({"name":"Ann","age":3})", R"({"name": "Ann", "age": -0, "email": "a@b"})",
          " {\n\"name\":\"\\u00e9\\ud83d\\ude00 漢\",\"age\":123456789012345678}",
          R"({ "name":"\"\\\/\b\f\n\r\t","age":0 })"})
        EXPECT_TRUE(person.accepts(ok)) << ok;
    for (const char* bad : {
             R"({"age":3,"name":"Ann"})",                    // properties out of the schema's order
             R"({"name":"Ann"})",                            // a required property missing
             R"({"name":"Ann","age":3.5})",                  // not an integer
             R"({"name":"Ann","age":3,"x":1})",              // undeclared
             R"({"name":"Ann","age":3} )",                   // whitespace after the value
             R"({"name":"Ann",  "age":3})",                  // two whitespace bytes
             R"({"name":"Ann","age":0123})",                 // a leading zero
             R"({"name":"Ann","age":1234567890123456789})",  // 19 digits
             "{\"name\":\"\x01\",\"age\":1}",                // a control byte unescaped
             "{\"name\":\"\xC0\xAF\",\"age\":1}",            // overlong UTF-8
             "{\"name\":\"\xED\xA0\x80\",\"age\":1}",        // an encoded surrogate
             R"({"name":"\ud800","age":1})",                 // a lone surrogate escape
             R"({"name":"\q","age":1})",                     // no such escape
             R"({"name":"Ann","age":1)",                     // unfinished
         })
        EXPECT_FALSE(person.accepts(bad)) << bad;
    const int32_t done = person.walk(person.start(), R"({"name":"Ann","age":3})");
    EXPECT_TRUE(person.accepting(done));
    EXPECT_FALSE(person.can_continue(done));  // the generation ends here

    JsonDfa number = dfa_of(R"({"type": "number"})");
    for (const char* ok : {"0", "-0.5", "1e5", "1E+99", "12.25e-3", " 7"})
        EXPECT_TRUE(number.accepts(ok)) << ok;
    for (const char* bad : {"-", "01", "1.", ".5", "1e100", "1e", "+1", "NaN", "  7"})
        EXPECT_FALSE(number.accepts(bad)) << bad;
    const int32_t twelve = number.walk(number.start(), "12");
    EXPECT_TRUE(number.accepting(twelve));
    EXPECT_TRUE(number.can_continue(twelve));  // 123 is a number too: an end of document decides

    JsonDfa choice = dfa_of(R"({"enum": ["red", 1, null, {"a": [true]}], "title": "x"})");
    for (const char* ok : {R"("red")", "1", "null", R"({"a":[true]})"})
        EXPECT_TRUE(choice.accepts(ok)) << ok;
    for (const char* bad : {R"("blue")", "10", R"({"a": [true]})"})
        EXPECT_FALSE(choice.accepts(bad)) << bad;

    JsonDfa list = dfa_of(R"({"type": "array", "items": {"type": "boolean"}, "minItems": 1,
                              "maxItems": 2})");
    for (const char* ok : {"[true]", "[ false, true ]", "[\ntrue,\nfalse\n]"})
        EXPECT_TRUE(list.accepts(ok)) << ok;
    for (const char* bad : {"[]", "[true,true,true]", "[1]", "[true,]"})
        EXPECT_FALSE(list.accepts(bad)) << bad;

    JsonDfa object = JsonDfa(json_object_grammar());
    for (const char* ok : {"{}", R"({"a":[1,{"b":null}],"a":"dup"})", "{ }"})
        EXPECT_TRUE(object.accepts(ok)) << ok;
    for (const char* bad : {"[]", "1", R"({"a"})", R"({a:1})"})
        EXPECT_FALSE(object.accepts(bad)) << bad;
    // Nested up to kMaxDepth levels, not one more.
    std::string deep = "{\"a\":", deeper;
    for (int d = 1; d < JsonGrammar::kMaxDepth; ++d) deep += "[";
    deeper = deep + "[]";
    deep += "1";
    for (int d = 1; d < JsonGrammar::kMaxDepth; ++d) deep += "]", deeper += "]";
    deep += "}";
    deeper += "]}";
    EXPECT_TRUE(object.accepts(deep)) << deep;
    EXPECT_FALSE(object.accepts(deeper)) << deeper;
}

// A refusal names where (`path`), which keyword is at fault and, in its message, `says`
// (the keyword itself where `says` is null and there is one).
void expect_refused(const char* schema, const char* path, const char* keyword,
                    const char* says = nullptr) {
    SCOPED_TRACE(schema);
    try {
        compile_json_schema(ojson::parse(schema));
        ADD_FAILURE() << "accepted";
    } catch (const JsonSchemaError& e) {
        EXPECT_EQ(e.path, path) << e.what();
        EXPECT_EQ(e.keyword, keyword) << e.what();
        if (!says) says = keyword;
        if (*says) {
            EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
        }
    }
}

TEST(JsonSchema, UnsupportedKeywordsAreRefusedByNameAndPath) {
    struct Case {
        const char* schema;
        const char* path;
        const char* keyword;
    };
    for (const Case& c : std::vector<Case>{
             {R"({"type":"object","properties":{"age":{"type":"integer","minimum":0}}})",
              "properties.age.minimum", "minimum"},
             {R"({"anyOf":[{"type":"string"},{"type":"string","pattern":"^a"}]})",
              "anyOf[1].pattern", "pattern"},
             {R"({"$ref":"#/$defs/x","type":"string","$defs":{"x":{}}})", "type", "type"},
             {R"({"type":"array","items":[{"type":"string"}]})", "items", "items"},
             {R"({"type":"strin"})", "type", "type"},
             {R"({"type":"object","properties":{"a":{}},"required":["b"]})", "required[0]",
              "required"},
             {R"({"type":"array","minItems":3,"maxItems":2})", "minItems", "minItems"},
             {R"({"type":"object","additionalProperties":{"type":"string"}})",
              "additionalProperties", "additionalProperties"},
             {R"({"type":"string","anyOf":[{"type":"string"}]})", "type", "type"},
             {R"({"type":"integer","enum":["a"]})", "enum", "enum"},
             {R"({"oneOf":[{"type":"string"}]})", "oneOf", "oneOf"},
             {R"({"type":"string","format":"date"})", "format", "format"},
             {R"([1])", "", ""},
             {R"({"type":"array","items":{"type":"array","items":{"type":"array","items":{"type":
                 "array","items":{"type":"array","items":{"type":"array","items":{"type":
                 "array"}}}}}}})",
              "items.items.items.items.items.items.type", "type"},
         }) {
        expect_refused(c.schema, c.path, c.keyword);
    }
    // Annotations are no refusal.
    EXPECT_NO_THROW(compile_json_schema(ojson::parse(
        R"({"$schema":"https://json-schema.org/draft/2020-12/schema","title":"t",
            "description":"d","type":"string","default":"x","examples":["y"]})")));
}

// Every random walk through the automaton is valid; a dead end fails inside random_walk.
void expect_walks_valid(const ojson& schema, int walks = 50) {
    Rng rng(test::fresh_seed());
    JsonDfa dfa(compile_json_schema(schema));
    for (int k = 0; k < walks; ++k)
        if (const std::string text = random_walk(dfa, rng); !text.empty())
            expect_valid(text, schema);
}

TEST(JsonSchema, RefsPointIntoDefsDefinitionsAndAnywhereInTheSchema) {
    // As Pydantic's model_json_schema() writes nested models and an Optional one.
    const ojson pydantic = ojson::parse(R"({
        "$defs": {"Kind": {"enum": ["cat", "dog"], "title": "Kind", "type": "string"},
                  "Pet": {"properties": {"name": {"title": "Name", "type": "string"},
                                         "kind": {"$ref": "#/$defs/Kind"}},
                          "required": ["name", "kind"], "title": "Pet", "type": "object"}},
        "properties": {"owner": {"title": "Owner", "type": "string"},
                       "pets": {"items": {"$ref": "#/$defs/Pet"}, "title": "Pets", "type": "array"},
                       "best": {"anyOf": [{"$ref": "#/$defs/Pet"}, {"type": "null"}],
                                "default": null}},
        "required": ["owner", "pets"], "title": "Household", "type": "object"})");
    JsonDfa household(compile_json_schema(pydantic));
    for (const char* ok : {R"({"owner":"Ann","pets":[{"name":"Rex","kind":"dog"}],"best":null})",
                           R"({"owner":"A","pets":[],"best":{"name":"Tom","kind":"cat"}})"})
        EXPECT_TRUE(household.accepts(ok)) << ok;
    for (const char* bad : {R"({"owner":"A","pets":[{"name":"Rex","kind":"cow"}]})",
                            R"({"owner":"A"})", R"({"owner":"A","pets":[{"name":"Rex"}]})"})
        EXPECT_FALSE(household.accepts(bad)) << bad;
    expect_walks_valid(pydantic);

    // `definitions`, RFC 6901's escapes (~1 for '/', ~0 for '~') and a percent-escape.
    const ojson escaped = ojson::parse(R"({"definitions": {"a/b": {"type": "integer"},
        "t~x": {"type": "boolean"}, "sp ace": {"const": "s"}}, "type": "array",
        "items": {"anyOf": [{"$ref": "#/definitions/a~1b"}, {"$ref": "#/definitions/t~0x"},
                            {"$ref": "#/definitions/sp%20ace", "description": "d"}]}})");
    JsonDfa list(compile_json_schema(escaped));
    EXPECT_TRUE(list.accepts(R"([1,true,"s"])"));
    EXPECT_FALSE(list.accepts(R"(["x"])"));
    expect_walks_valid(escaped);

    // Pointers to properties and items, as zod-to-json-schema writes a reused schema; `$defs`
    // below the root.
    const ojson paths = ojson::parse(R"({"type": "object", "properties": {
        "a": {"type": "array", "items": {"type": "integer"}},
        "b": {"$ref": "#/properties/a/items"}, "c": {"$ref": "#/properties/a"},
        "d": {"$defs": {"I": {"type": "null"}}, "$ref": "#/properties/d/$defs/I"}}})");
    JsonDfa record(compile_json_schema(paths));
    EXPECT_TRUE(record.accepts(R"({"a":[1],"b":2,"c":[3],"d":null})"));
    EXPECT_FALSE(record.accepts(R"({"b":"x"})"));
    EXPECT_FALSE(record.accepts(R"({"d":1})"));
    expect_walks_valid(paths);
}

TEST(JsonSchema, RecursiveRefsExpandToTheDepthLimitAndEndThere) {
    const ojson tree = ojson::parse(R"({"type": "object", "properties": {
        "name": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#"}}},
        "required": ["name", "children"], "additionalProperties": false})");
    JsonDfa dfa(compile_json_schema(tree));
    // kMaxDepth levels: the node at level 5 ends with its children empty.
    std::string deep = R"({"name":"c","children":[]})";
    for (int level = 0; level < 2; ++level)
        deep = R"({"name":"n","children":[)" + deep + "," + deep + "]}";
    EXPECT_TRUE(dfa.accepts(deep)) << deep;
    const std::string deeper = R"({"name":"n","children":[)" + deep + "]}";
    EXPECT_FALSE(dfa.accepts(deeper)) << deeper;
    // No dead end: at level 5 the only way on is the empty array.
    const int32_t at_limit = dfa.walk(
        dfa.start(), R"({"name":"a","children":[{"name":"b","children":[{"name":"c","children":[)");
    ASSERT_NE(at_limit, JsonDfa::kDead);
    EXPECT_EQ(dfa.next(at_limit, '{'), JsonDfa::kDead);
    EXPECT_NE(dfa.next(at_limit, ']'), JsonDfa::kDead);
    expect_walks_valid(tree);

    // A linked list: the optional `next` is left out at the limit. Mutual recursion through
    // an array and an object.
    const ojson linked = ojson::parse(R"({"$defs": {"L": {"type": "object", "properties": {
        "v": {"type": "integer"}, "next": {"$ref": "#/$defs/L"}}, "required": ["v"]}},
        "$ref": "#/$defs/L"})");
    JsonDfa list(compile_json_schema(linked));
    std::string six = R"({"v":6})";
    for (int v = 5; v >= 1; --v) six = R"({"v":)" + std::to_string(v) + R"(,"next":)" + six + "}";
    EXPECT_TRUE(list.accepts(six)) << six;
    EXPECT_FALSE(list.accepts(R"({"v":0,"next":)" + six + "}"));
    expect_walks_valid(linked);
    const ojson mutual = ojson::parse(R"({"$defs": {
        "A": {"type": "object", "properties": {"b": {"$ref": "#/$defs/B"}}},
        "B": {"type": "array", "items": {"$ref": "#/$defs/A"}, "maxItems": 2}},
        "$ref": "#/$defs/A"})");
    EXPECT_TRUE(JsonDfa(compile_json_schema(mutual)).accepts(R"({"b":[{"b":[]},{}]})"));
    expect_walks_valid(mutual);

    // Fan-out: a node with two recursive children compiles; one with eight would pass
    // kMaxStates and is refused as too large (not compiled forever).
    for (int fan : {2, 8}) {
        ojson node = {{"type", "object"}, {"properties", ojson::object()}};
        for (int k = 0; k < fan; ++k) node["properties"]["c" + std::to_string(k)] = {{"$ref", "#"}};
        if (fan == 2) {
            expect_walks_valid(node, 20);
            continue;
        }
        try {
            compile_json_schema(node);
            ADD_FAILURE() << "a " << fan << "-way tree compiled";
        } catch (const JsonSchemaError& e) {
            EXPECT_NE(std::string(e.what()).find("too large"), std::string::npos) << e.what();
        }
    }
}

TEST(JsonSchema, RefsThatCannotBeFollowedAreRefusedByPath) {
    struct Case {
        const char* schema;
        const char* path;
        const char* keyword;
        const char* says;
    };
    for (const Case& c : std::vector<Case>{
             {R"({"$ref":"http://example.com/s.json"})", "$ref", "$ref", "remote"},
             {R"({"type":"object","properties":{"p":{"$ref":"other.json#/x"}}})",
              "properties.p.$ref", "$ref", "relative"},
             {R"({"$ref":"#node"})", "$ref", "$ref", "$anchor"},
             {R"({"$anchor":"node","type":"string"})", "$anchor", "$anchor", "$anchor"},
             {R"({"type":"object","properties":{"pet":{"$ref":"#/$defs/Pet"}}})",
              "properties.pet.$ref", "$ref", "points to nothing"},
             {R"({"$ref":"#/$defs/a~2","$defs":{"a~2":{}}})", "$ref", "$ref", "~0 or ~1"},
             {R"({"$ref":"#/$defs/a%2","$defs":{}})", "$ref", "$ref", "percent"},
             {R"({"$ref":"#/$defs/l/01","$defs":{"l":[{}]}})", "$ref", "$ref", "points to nothing"},
             {R"({"$ref":7})", "$ref", "$ref", "string"},
             {R"({"$defs":[]})", "$defs", "$defs", "object"},
             // A required recursion never ends: refused at the recursive ref.
             {R"({"type":"object","properties":{"next":{"$ref":"#"}},"required":["next"]})",
              "properties.next.$ref", "$ref", "deeper than"},
             {R"({"$ref":"#"})", "$ref", "$ref", "cycle"},
             {R"({"$defs":{"A":{"$ref":"#/$defs/B"},"B":{"anyOf":[{"$ref":"#/$defs/A"},
                 {"type":"null"}]}},"$ref":"#/$defs/A"})",
              "$defs.B.anyOf[0].$ref", "$ref", "cycle"},
             // A fault inside a referenced schema is named where the schema's text has it.
             {R"({"$defs":{"Pet":{"type":"integer","minimum":0}},"type":"object",
                 "properties":{"pet":{"$ref":"#/$defs/Pet"}}})",
              "$defs.Pet.minimum", "minimum", "minimum"},
             {R"({"type":"object","properties":{"p":{"$id":"http://x/p","$ref":"#/$defs/q"}}})",
              "properties.p.$ref", "$ref", "$id"},
         }) {
        expect_refused(c.schema, c.path, c.keyword, c.says);
    }
    // A chain of refs with no structure between is bounded, cycle or not.
    ojson chain = {{"$defs", ojson::object()}, {"$ref", "#/$defs/d0"}};
    for (int k = 0; k < 100; ++k)
        chain["$defs"]["d" + std::to_string(k)] = {{"$ref", "#/$defs/d" + std::to_string(k + 1)}};
    chain["$defs"]["d100"] = {{"type", "string"}};
    EXPECT_THROW(compile_json_schema(chain), JsonSchemaError);
    chain["$defs"].erase("d100");
    for (int k = 60; k < 100; ++k) chain["$defs"].erase("d" + std::to_string(k));
    chain["$defs"]["d60"] = {{"type", "string"}};
    EXPECT_TRUE(JsonDfa(compile_json_schema(chain)).accepts(R"("x")"));
}

TEST(JsonSchema, RandomValidTextsOfRandomSchemasAreAcceptedWithEveryPrefixAlive) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    Rng rng(seed);
    std::vector<ojson> schemas = test::sample_schemas();
    for (int i = 0; i < 300; ++i) schemas.push_back(test::random_schema(rng));
    // Some of them written the way Pydantic and zod write them.
    EXPECT_GT(
        std::count_if(schemas.begin(), schemas.end(),
                      [](const ojson& s) { return s.dump().find("\"$ref\"") != s.dump().npos; }),
        40);
    for (const ojson& schema : schemas) {
        JsonDfa dfa(compile_json_schema(schema));
        for (int k = 0; k < 5; ++k) {
            const std::string text = test::random_valid_text(schema, rng);
            expect_valid(text, schema);  // the generator's own check
            int32_t s = dfa.start();
            for (size_t i = 0; i < text.size() && s != JsonDfa::kDead; ++i)
                s = dfa.next(s, static_cast<uint8_t>(text[i]));
            ASSERT_NE(s, JsonDfa::kDead) << text << "\nschema " << schema.dump();
            EXPECT_TRUE(dfa.accepting(s)) << text << "\nschema " << schema.dump();
        }
    }
}

TEST(JsonSchema, EverythingTheAutomatonAcceptsParsesAndValidates) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    Rng rng(seed);
    std::vector<ojson> schemas = test::sample_schemas();
    for (int i = 0; i < 200; ++i) schemas.push_back(test::random_schema(rng));
    int walks = 0, mutants = 0, refused = 0;
    static const std::string bytes = "{}[]\",:0123456789 \n-.eEtrunlfas\\\xC3\xA9";
    for (const ojson& schema : schemas) {
        JsonDfa dfa(compile_json_schema(schema));
        for (int k = 0; k < 4; ++k) {
            const std::string text = random_walk(dfa, rng);
            if (text.empty() && !dfa.accepts("")) continue;
            ++walks;
            expect_valid(text, schema);
        }
        // Random mutations of a valid text: those the automaton still accepts are valid.
        const std::string valid = test::random_valid_text(schema, rng);
        for (int k = 0; k < 20; ++k) {
            std::string m = valid;
            const size_t at = m.empty() ? 0 : rng.next_u64() % m.size();
            const char b = bytes[rng.next_u64() % bytes.size()];
            switch (rng.next_u64() % 3) {
                case 0:
                    if (!m.empty()) m.erase(at, 1);
                    break;
                case 1:
                    m.insert(m.begin() + static_cast<std::ptrdiff_t>(at), b);
                    break;
                default:
                    if (!m.empty()) m[at] = b;
            }
            if (m == valid) continue;
            ++mutants;
            if (!dfa.accepts(m)) {
                ++refused;
                continue;
            }
            expect_valid(m, schema);
        }
    }
    EXPECT_GT(walks, 600);
    EXPECT_GT(refused, mutants / 2) << "of " << mutants << " mutants";
    // json_object mode: every walk is an object.
    JsonDfa object(json_object_grammar());
    for (int k = 0; k < 200; ++k) {
        const std::string text = random_walk(object, rng);
        if (text.empty()) continue;
        expect_valid(text, ojson{{"type", "object"}});
    }
}

}  // namespace
}  // namespace tmx

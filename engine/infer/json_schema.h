// Structured output: a JSON Schema (the subset below), or "any JSON object", compiled to an
// automaton over bytes whose accepted strings are exactly the JSON texts a constrained
// generation may write (token_constraint.h turns it into per-step token masks).
//
// Supported: `type` (string, number, integer, boolean, null, object, array, or a list of them),
// `enum`, `const`, `properties` (written in the schema's order), `required` (the others may be
// left out), `additionalProperties` (false or true: either way only declared properties are
// written, which is valid under both; an object schema without `properties` is any object),
// `items`, `minItems`, `maxItems`, `anyOf` (alone, beside annotations only), nesting to
// kMaxDepth objects and arrays; `$defs` and `definitions` (at any level) hold subschemas for
// `$ref` (beside annotations only), a local JSON Pointer ("#", "#/$defs/Name",
// "#/properties/a/items", RFC 6901's ~0 ~1 and percent-escapes) resolved against the root. A
// recursive `$ref` expands to kMaxDepth levels, where the recursion ends the way the schema
// allows (an empty array, an optional property left out); one that cannot end there, or a cycle
// of refs through no object or array, is refused; so are remote refs, refs relative to a nested
// `$id`, and `$anchor`. Errors inside a referenced schema name its path in the document
// ("$defs.Pet.properties.age.minimum"). Annotations (title, description, default, examples,
// $schema, $id, $comment, deprecated, readOnly, writeOnly) are ignored; any other keyword is
// refused with a JsonSchemaError naming it and its path, since ignoring one (a `minimum`, a
// `pattern`) would let the model write what the schema forbids.
//
// How the text is written (the automaton's policy, so that a model cannot stall in whitespace or
// digits forever): compact JSON with at most one whitespace byte (space or newline) after `{`,
// `[`, `,` and `:`, before `}` and `]`, and before the value; nothing after it (the value
// complete, the generation ends). Strings are valid UTF-8 (no overlong forms, no surrogates),
// with JSON's escapes (\uXXXX: a surrogate only in its pair); control bytes only escaped. Numbers
// have at most kMaxIntegerDigits digits before the point (so an integer fits an int64),
// kMaxFraction after it and kMaxExponent in the exponent (so every number is finite in a double);
// integers have neither point nor exponent. Property names are written as nlohmann::json dumps
// them, and `enum`/`const` values likewise (compact).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/errors.h"

namespace tmx {

// A schema the compiler refuses: `keyword` is the keyword at fault ("minimum"; "" when the fault
// is a value's form, e.g. a schema that is not an object) and `path` where it is, as
// "properties.age.minimum" or "anyOf[1].type" ("" for the root).
class JsonSchemaError : public Error {
  public:
    JsonSchemaError(const std::string& what, std::string path, std::string keyword)
        : Error(what), path(std::move(path)), keyword(std::move(keyword)) {}
    std::string path, keyword;
};

// The compiled form: a nondeterministic automaton over bytes with epsilon moves, trimmed to the
// states from which the accepting one can be reached. Immutable, so one grammar serves every
// sequence of a request on any thread.
class JsonGrammar {
  public:
    static constexpr int kMaxDepth = 6;  // objects and arrays nested in each other, at most
    static constexpr int kMaxIntegerDigits = 18, kMaxFraction = 18, kMaxExponent = 2;
    static constexpr size_t kMaxStates = 200000;  // a larger schema is refused

    struct Edge {
        uint8_t lo, hi;  // the bytes lo..hi lead to `to`
        int32_t to;
    };
    struct State {
        std::vector<Edge> edges;
        std::vector<int32_t> epsilon;
    };
    int32_t start() const { return start_; }
    int32_t accept() const { return accept_; }
    const std::vector<State>& states() const { return states_; }

  private:
    friend class JsonGrammarBuilder;
    std::vector<State> states_;
    int32_t start_ = 0, accept_ = 0;
};

// Throws JsonSchemaError for a schema outside the subset or one no value satisfies. Ordered
// JSON: properties are written in the order the schema's text gives them.
std::shared_ptr<const JsonGrammar> compile_json_schema(const nlohmann::ordered_json& schema);
// OpenAI's `json_object` mode: any JSON object, nested up to kMaxDepth.
std::shared_ptr<const JsonGrammar> json_object_grammar();

// The grammar determinized lazily: each set of automaton states a text can reach becomes a
// state id on first visit, with its 256 transitions filled in as they are asked for. Not
// thread-safe (TokenConstraint locks around it).
class JsonDfa {
  public:
    static constexpr int32_t kDead = -1;
    // Beyond: tmx::Error (a pathological anyOf); each state holds a 1 KiB table, so a request
    // holds at most 50 MiB of them.
    static constexpr size_t kMaxStates = 50000;

    explicit JsonDfa(std::shared_ptr<const JsonGrammar> grammar);
    int32_t start() const { return 0; }
    int32_t next(int32_t state, uint8_t byte) {
        const int32_t t = table_[static_cast<size_t>(state)][byte];
        return t != kUnknown ? t : compute_next(state, byte);
    }
    // The state after `bytes` (kDead once a byte is refused).
    int32_t walk(int32_t state, std::string_view bytes);
    // The text so far is a whole value (an end of document may come).
    bool accepting(int32_t state) const { return flags_[static_cast<size_t>(state)] & kAccepting; }
    // Some byte may still follow.
    bool can_continue(int32_t state) const {
        return flags_[static_cast<size_t>(state)] & kContinues;
    }
    bool accepts(std::string_view text) {
        const int32_t s = walk(start(), text);
        return s != kDead && accepting(s);
    }
    size_t size() const { return sets_.size(); }

  private:
    static constexpr int32_t kUnknown = -2;
    static constexpr uint8_t kAccepting = 1, kContinues = 2;
    int32_t compute_next(int32_t state, uint8_t byte);
    // The epsilon closure of `states`, sorted, as a state id (new ones added).
    int32_t intern(std::vector<int32_t>& states);

    std::shared_ptr<const JsonGrammar> grammar_;
    std::vector<std::vector<int32_t>> sets_;
    std::vector<std::array<int32_t, 256>> table_;
    std::vector<uint8_t> flags_;
    std::map<std::vector<int32_t>, int32_t> ids_;
    std::vector<uint32_t> mark_;  // closure's visited marks, by generation
    uint32_t generation_ = 0;
};

}  // namespace tmx

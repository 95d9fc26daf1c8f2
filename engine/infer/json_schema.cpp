#include "engine/infer/json_schema.h"

#include <algorithm>
#include <cmath>
#include <set>

namespace tmx {

// Ordered: properties are written in the schema's order.
using json = nlohmann::ordered_json;

namespace {

// Keywords that only describe: ignored wherever they appear.
bool is_annotation(const std::string& key) {
    static const std::set<std::string> annotations = {
        "title", "description", "default",    "examples", "$schema",
        "$id",   "$comment",    "deprecated", "readOnly", "writeOnly"};
    return annotations.count(key) > 0;
}

// `$defs` and `definitions` hold subschemas for `$ref` to point at: no constraint themselves.
bool is_definitions(const std::string& key) {
    return key == "$defs" || key == "definitions";
}

bool is_supported(const std::string& key) {
    static const std::set<std::string> supported = {
        "type",  "enum",     "const",    "properties", "required", "additionalProperties",
        "items", "minItems", "maxItems", "anyOf",      "$ref"};
    return supported.count(key) > 0 || is_definitions(key);
}

const std::vector<std::string>& type_names() {
    static const std::vector<std::string> names = {"string", "number", "integer", "boolean",
                                                   "null",   "object", "array"};
    return names;
}

std::string child(const std::string& path, const std::string& key) {
    return path.empty() ? key : path + "." + key;
}
std::string index(const std::string& path, size_t i) {
    return path + "[" + std::to_string(i) + "]";
}

[[noreturn]] void refuse(const std::string& what, const std::string& path,
                         const std::string& keyword) {
    throw JsonSchemaError(what + (path.empty() ? " (at the schema's root)" : " (at " + path + ")"),
                          path, keyword);
}

bool value_has_type(const json& v, const std::string& type) {
    if (type == "string") return v.is_string();
    if (type == "number") return v.is_number();
    if (type == "integer")
        return v.is_number_integer() ||
               (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
    if (type == "boolean") return v.is_boolean();
    if (type == "null") return v.is_null();
    if (type == "object") return v.is_object();
    return v.is_array();
}

// How deep a value nests objects and arrays.
int nesting(const json& v) {
    int inner = 0;
    if (v.is_object() || v.is_array())
        for (const json& x : v) inner = std::max(inner, nesting(x));
    return v.is_object() || v.is_array() ? inner + 1 : 0;
}

// RFC 3986's percent-decoding of a URI fragment; false for a malformed escape.
bool percent_decode(std::string_view in, std::string& out) {
    auto hex = [](char c) -> int {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        return -1;
    };
    out.clear();
    for (size_t i = 0; i < in.size(); ++i) {
        if (in[i] != '%') {
            out += in[i];
            continue;
        }
        if (i + 2 >= in.size() || hex(in[i + 1]) < 0 || hex(in[i + 2]) < 0) return false;
        out += static_cast<char>(hex(in[i + 1]) * 16 + hex(in[i + 2]));
        i += 2;
    }
    return true;
}

}  // namespace

// Builds the automaton Thompson's way: each construct is a fragment with an entry and an exit
// state (the exit fresh, without moves of its own until the construct after it is joined on).
class JsonGrammarBuilder {
  public:
    struct Frag {
        int32_t in, out;
    };

    // A `$ref` chain (refs followed with no object or array between) longer than this is
    // refused: it bounds the compiler's recursion.
    static constexpr size_t kMaxRefChain = 64;

    // `root` is the document `$ref` pointers resolve against.
    explicit JsonGrammarBuilder(const json& root) : root_(root) {}

    std::shared_ptr<const JsonGrammar> finish(Frag value) {
        const Frag top = seq(ws(), value);
        g_->start_ = top.in;
        g_->accept_ = top.out;
        trim();
        if (!live_[static_cast<size_t>(g_->start_)]) {
            if (!cut_ref_path_.empty())
                refuse("the recursive '$ref' requires objects and arrays nested deeper than " +
                           std::to_string(JsonGrammar::kMaxDepth) +
                           " levels (no value of the schema ends)",
                       cut_ref_path_, "$ref");
            refuse("no JSON value satisfies this schema", "", "");
        }
        return g_;
    }

    Frag schema(const json& s, const std::string& path, int depth);
    Frag any_value(int depth);

  private:
    // A schema being compiled (an ancestor of the current one in the expansion) and the depth
    // it was compiled at.
    struct Expanding {
        const json* schema;
        int depth;
    };
    // Where a `$ref` points: the subschema and its path in the document.
    struct Target {
        const json* schema;
        std::string path;
        bool under_id;  // below a subschema with its own `$id` (another base for its refs)
    };
    Target resolve(const std::string& ref, const std::string& ref_path) const;
    Frag reference(const json& s, const std::string& path, int depth);
    // Objects and arrays would nest deeper than kMaxDepth: refused, or, inside a recursion
    // through `$ref`, a fragment no text gets through (trim() drops it, so the recursion ends
    // with an empty array or an optional property left out).
    Frag too_deep(const std::string& what, const std::string& path, const std::string& keyword);

    int32_t add() {
        if (g_->states_.size() >= JsonGrammar::kMaxStates)
            refuse("the schema is too large (its automaton would exceed " +
                       std::to_string(JsonGrammar::kMaxStates) + " states)",
                   "", "");
        g_->states_.emplace_back();
        return static_cast<int32_t>(g_->states_.size() - 1);
    }
    void epsilon(int32_t from, int32_t to) {
        g_->states_[static_cast<size_t>(from)].epsilon.push_back(to);
    }
    void edge(int32_t from, uint8_t lo, uint8_t hi, int32_t to) {
        g_->states_[static_cast<size_t>(from)].edges.push_back({lo, hi, to});
    }
    Frag seq(Frag a, Frag b) {
        epsilon(a.out, b.in);
        return {a.in, b.out};
    }
    Frag literal(std::string_view bytes) {
        const int32_t in = add();
        int32_t at = in;
        for (char c : bytes) {
            const int32_t to = add();
            edge(at, static_cast<uint8_t>(c), static_cast<uint8_t>(c), to);
            at = to;
        }
        return {in, at};
    }
    Frag alternatives(const std::vector<Frag>& options) {
        const Frag f{add(), add()};
        for (const Frag& o : options) {
            epsilon(f.in, o.in);
            epsilon(o.out, f.out);
        }
        return f;
    }
    // At most one whitespace byte: enough for "key": value, ", " and one value per line, and a
    // model cannot stall in whitespace.
    Frag ws() {
        const Frag f{add(), add()};
        epsilon(f.in, f.out);
        edge(f.in, ' ', ' ', f.out);
        edge(f.in, '\n', '\n', f.out);
        return f;
    }
    Frag string();
    Frag number(bool integer);
    Frag object(const json& s, const std::string& path, int depth);
    Frag array(const json& s, const std::string& path, int depth);
    Frag any_object(int depth);
    // `[`, the items (each fragment made by `item`, one copy per position counted), `]`.
    template <typename MakeItem>
    Frag list(int64_t min_items, int64_t max_items, MakeItem item);
    void trim();

    std::shared_ptr<JsonGrammar> g_ = std::make_shared<JsonGrammar>();
    std::vector<char> live_;
    const json& root_;
    std::vector<Expanding> expanding_;
    size_t ref_chain_ = 0;       // refs followed since the last object or array
    std::string recursive_ref_;  // the innermost `$ref` that re-enters a schema ("" if none)
    std::string cut_ref_path_;   // the first recursive `$ref` cut at the depth limit
    bool under_id_ = false;      // the current subschema is below a nested `$id`
};

JsonGrammarBuilder::Frag JsonGrammarBuilder::string() {
    const Frag f{add(), add()};
    const int32_t body = add(), escape = add();
    edge(f.in, '"', '"', body);
    edge(body, '"', '"', f.out);
    edge(body, 0x20, 0x21, body);  // any character but '"', '\\' and the control bytes
    edge(body, 0x23, 0x5B, body);
    edge(body, 0x5D, 0x7F, body);
    edge(body, '\\', '\\', escape);
    for (char c : std::string_view("\"\\/bfnrt")) edge(escape, c, c, body);
    // \uXXXX: any code unit but a surrogate out of its pair (which strict readers refuse): a
    // high one (D800-DBFF) must be followed by \u and a low one (DC00-DFFF).
    auto hex = [&](int32_t from, int32_t to) {
        edge(from, '0', '9', to);
        edge(from, 'a', 'f', to);
        edge(from, 'A', 'F', to);
    };
    const int32_t u1 = add(), u2 = add(), u3 = add(), u4 = add(), d2 = add();
    edge(escape, 'u', 'u', u1);
    edge(u1, '0', '9', u2);
    edge(u1, 'a', 'c', u2);
    edge(u1, 'A', 'C', u2);
    edge(u1, 'e', 'f', u2);
    edge(u1, 'E', 'F', u2);
    edge(u1, 'd', 'd', d2);
    edge(u1, 'D', 'D', d2);
    hex(u2, u3);
    hex(u3, u4);
    hex(u4, body);
    edge(d2, '0', '7', u3);
    const int32_t high3 = add(), high4 = add(), low_slash = add(), low_u = add(), low1 = add(),
                  low2 = add();
    edge(d2, '8', '9', high3);
    edge(d2, 'a', 'b', high3);
    edge(d2, 'A', 'B', high3);
    hex(high3, high4);
    hex(high4, low_slash);
    edge(low_slash, '\\', '\\', low_u);
    edge(low_u, 'u', 'u', low1);
    edge(low1, 'd', 'd', low2);
    edge(low1, 'D', 'D', low2);
    edge(low2, 'c', 'f', u3);
    edge(low2, 'C', 'F', u3);
    // UTF-8 (RFC 3629's table): continuation bytes left to read, then the special first
    // continuations that rule out overlong forms, surrogates and code points above U+10FFFF.
    const int32_t cont1 = add(), cont2 = add(), cont3 = add();
    edge(cont1, 0x80, 0xBF, body);
    edge(cont2, 0x80, 0xBF, cont1);
    edge(cont3, 0x80, 0xBF, cont2);
    edge(body, 0xC2, 0xDF, cont1);
    const int32_t e0 = add(), ed = add(), f0 = add(), f4 = add();
    edge(body, 0xE0, 0xE0, e0);
    edge(e0, 0xA0, 0xBF, cont1);
    edge(body, 0xE1, 0xEC, cont2);
    edge(body, 0xED, 0xED, ed);
    edge(ed, 0x80, 0x9F, cont1);
    edge(body, 0xEE, 0xEF, cont2);
    edge(body, 0xF0, 0xF0, f0);
    edge(f0, 0x90, 0xBF, cont2);
    edge(body, 0xF1, 0xF3, cont3);
    edge(body, 0xF4, 0xF4, f4);
    edge(f4, 0x80, 0x8F, cont2);
    return f;
}

JsonGrammarBuilder::Frag JsonGrammarBuilder::number(bool integer) {
    const Frag f{add(), add()};
    const int32_t sign = add(), int_end = add();
    epsilon(f.in, sign);
    edge(f.in, '-', '-', sign);
    edge(sign, '0', '0', int_end);
    int32_t digits = add();  // one digit read, the first 1-9
    edge(sign, '1', '9', digits);
    epsilon(digits, int_end);
    for (int k = 2; k <= JsonGrammar::kMaxIntegerDigits; ++k) {
        const int32_t more = add();
        edge(digits, '0', '9', more);
        epsilon(more, int_end);
        digits = more;
    }
    if (integer) {
        epsilon(int_end, f.out);
        return f;
    }
    const int32_t mantissa_end = add();
    epsilon(int_end, mantissa_end);
    int32_t fraction = add();  // after the point: a digit must come
    edge(int_end, '.', '.', fraction);
    for (int k = 1; k <= JsonGrammar::kMaxFraction; ++k) {
        const int32_t more = add();
        edge(fraction, '0', '9', more);
        epsilon(more, mantissa_end);
        fraction = more;
    }
    epsilon(mantissa_end, f.out);
    const int32_t e = add(), e_sign = add();
    edge(mantissa_end, 'e', 'e', e);
    edge(mantissa_end, 'E', 'E', e);
    epsilon(e, e_sign);
    edge(e, '+', '+', e_sign);
    edge(e, '-', '-', e_sign);
    int32_t exponent = e_sign;
    for (int k = 1; k <= JsonGrammar::kMaxExponent; ++k) {
        const int32_t more = add();
        edge(exponent, '0', '9', more);
        epsilon(more, f.out);
        exponent = more;
    }
    return f;
}

template <typename MakeItem>
JsonGrammarBuilder::Frag JsonGrammarBuilder::list(int64_t min_items, int64_t max_items,
                                                  MakeItem item) {
    // Positions 1..copies each have their own copy of the item, so the automaton counts; the
    // last copy loops when the list is unbounded.
    const bool unbounded = max_items < 0;
    const int64_t copies = unbounded ? std::max<int64_t>(min_items, 1) : max_items;
    const Frag open = seq(literal("["), ws());
    const Frag close = seq(ws(), literal("]"));
    const int32_t out = close.out;
    if (min_items == 0) epsilon(open.out, close.in);
    int32_t before = open.out;  // where the next item starts from
    for (int64_t k = 1; k <= copies; ++k) {
        const Frag x = item();
        epsilon(before, x.in);
        if (k >= min_items) epsilon(x.out, close.in);
        const Frag comma = seq(literal(","), ws());
        if (k < copies) {
            epsilon(x.out, comma.in);
            before = comma.out;
        } else if (unbounded) {
            epsilon(x.out, comma.in);
            epsilon(comma.out, x.in);
        }
    }
    return {open.in, out};
}

JsonGrammarBuilder::Frag JsonGrammarBuilder::any_object(int depth) {
    // `{`, then nothing or members "key": value separated by commas, then `}`.
    const Frag open = seq(literal("{"), ws());
    const Frag close = seq(ws(), literal("}"));
    epsilon(open.out, close.in);
    const Frag member = seq(seq(seq(string(), literal(":")), ws()), any_value(depth));
    epsilon(open.out, member.in);
    epsilon(member.out, close.in);
    const Frag comma = seq(literal(","), ws());
    epsilon(member.out, comma.in);
    epsilon(comma.out, member.in);
    return {open.in, close.out};
}

JsonGrammarBuilder::Frag JsonGrammarBuilder::any_value(int depth) {
    std::vector<Frag> options = {string(), number(false), literal("true"), literal("false"),
                                 literal("null")};
    if (depth > 0) {
        options.push_back(any_object(depth - 1));
        options.push_back(list(0, -1, [&] { return any_value(depth - 1); }));
    }
    return alternatives(options);
}

JsonGrammarBuilder::Frag JsonGrammarBuilder::object(const json& s, const std::string& path,
                                                    int depth) {
    if (s.contains("additionalProperties") && !s["additionalProperties"].is_boolean())
        refuse("'additionalProperties' other than true or false is not supported",
               child(path, "additionalProperties"), "additionalProperties");
    const bool closed = s.value("additionalProperties", true) == false;
    std::vector<std::string> required;
    if (s.contains("required")) {
        const json& r = s["required"];
        if (!r.is_array())
            refuse("'required' must be an array of names", child(path, "required"), "required");
        for (size_t i = 0; i < r.size(); ++i) {
            if (!r[i].is_string())
                refuse("'required' must be an array of names", index(child(path, "required"), i),
                       "required");
            if (!s.contains("properties") || !s["properties"].is_object() ||
                !s["properties"].contains(r[i].get<std::string>()))
                refuse("required property '" + r[i].get<std::string>() +
                           "' is not among 'properties' (only declared properties are written)",
                       index(child(path, "required"), i), "required");
            required.push_back(r[i].get<std::string>());
        }
    }
    if (!s.contains("properties")) {
        if (!closed) return any_object(depth);
        return seq(seq(literal("{"), ws()), literal("}"));
    }
    const json& properties = s["properties"];
    if (!properties.is_object())
        refuse("'properties' must be an object", child(path, "properties"), "properties");
    // In the schema's order. Before member i: `none` when no member has been written yet (no
    // comma), `some` otherwise; an optional member may be skipped from either.
    const Frag open = seq(literal("{"), ws());
    const Frag close = seq(ws(), literal("}"));
    int32_t none = open.out, some = add();
    for (auto it = properties.begin(); it != properties.end(); ++it) {
        const std::string& name = it.key();
        const bool optional = std::find(required.begin(), required.end(), name) == required.end();
        const Frag member = seq(seq(literal(json(name).dump() + ":"), ws()),
                                schema(it.value(), child(child(path, "properties"), name), depth));
        const Frag comma = seq(literal(","), ws());
        epsilon(none, member.in);
        epsilon(some, comma.in);
        epsilon(comma.out, member.in);
        const int32_t next_none = add(), next_some = add();
        epsilon(member.out, next_some);
        if (optional) {
            epsilon(none, next_none);
            epsilon(some, next_some);
        }
        none = next_none;
        some = next_some;
    }
    epsilon(none, close.in);
    epsilon(some, close.in);
    return {open.in, close.out};
}

JsonGrammarBuilder::Frag JsonGrammarBuilder::array(const json& s, const std::string& path,
                                                   int depth) {
    auto count = [&](const char* key) -> int64_t {
        if (!s.contains(key)) return -1;
        const json& v = s[key];
        if (!v.is_number_integer() || v.get<int64_t>() < 0)
            refuse(std::string("'") + key + "' must be an integer >= 0", child(path, key), key);
        return v.get<int64_t>();
    };
    const int64_t min_items = std::max<int64_t>(count("minItems"), 0),
                  max_items = count("maxItems");
    if (max_items >= 0 && min_items > max_items)
        refuse("'minItems' is above 'maxItems'", child(path, "minItems"), "minItems");
    if (s.contains("items") && !s["items"].is_object() && !s["items"].is_boolean())
        refuse("'items' other than one schema (a list of schemas) is not supported",
               child(path, "items"), "items");
    if (!s.contains("items")) return list(min_items, max_items, [&] { return any_value(depth); });
    return list(min_items, max_items,
                [&] { return schema(s["items"], child(path, "items"), depth); });
}

JsonGrammarBuilder::Frag JsonGrammarBuilder::schema(const json& s, const std::string& path,
                                                    int depth) {
    if (s.is_boolean()) {
        if (!s.get<bool>()) refuse("the schema false admits no value", path, "");
        return any_value(depth);
    }
    if (!s.is_object()) refuse("a schema must be an object or a boolean", path, "");
    for (auto it = s.begin(); it != s.end(); ++it) {
        if (!is_annotation(it.key()) && !is_supported(it.key()))
            refuse("the JSON Schema keyword '" + it.key() + "' is not supported",
                   child(path, it.key()), it.key());
        if (is_definitions(it.key()) && !it.value().is_object())
            refuse("'" + it.key() + "' must be an object of schemas", child(path, it.key()),
                   it.key());
    }
    // A nested `$id` starts another resource whose refs resolve against it, not the root.
    const bool was_under_id = under_id_;
    if (&s != &root_ && s.contains("$id")) under_id_ = true;
    expanding_.push_back({&s, depth});
    struct Restore {
        JsonGrammarBuilder& b;
        bool under_id;
        ~Restore() {
            b.expanding_.pop_back();
            b.under_id_ = under_id;
        }
    } restore{*this, was_under_id};
    if (s.contains("$ref")) return reference(s, path, depth);
    if (s.contains("anyOf")) {
        for (auto it = s.begin(); it != s.end(); ++it)
            if (it.key() != "anyOf" && !is_annotation(it.key()) && !is_definitions(it.key()))
                refuse("'" + it.key() + "' beside 'anyOf' is not supported (put it in each branch)",
                       child(path, it.key()), it.key());
        const json& branches = s["anyOf"];
        if (!branches.is_array() || branches.empty())
            refuse("'anyOf' must be a non-empty array of schemas", child(path, "anyOf"), "anyOf");
        std::vector<Frag> options;
        for (size_t i = 0; i < branches.size(); ++i)
            options.push_back(schema(branches[i], index(child(path, "anyOf"), i), depth));
        return alternatives(options);
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
        const json& t = s["type"];
        const std::vector<json> listed =
            t.is_array() ? t.get<std::vector<json>>() : std::vector<json>{t};
        for (const json& name : listed) {
            const auto& known = type_names();
            if (!name.is_string() ||
                std::find(known.begin(), known.end(), name.get<std::string>()) == known.end())
                refuse(
                    "'type' must name JSON Schema types (string, number, integer, boolean, "
                    "null, object, array)",
                    child(path, "type"), "type");
            types.push_back(name.get<std::string>());
        }
        if (types.empty()) refuse("'type' lists no type", child(path, "type"), "type");
    }
    if (s.contains("enum") || s.contains("const")) {
        // A fixed set of values, each written as nlohmann::json dumps it; the other keywords
        // would have to be checked against each value, and only `type` is.
        if (s.contains("enum") && s.contains("const"))
            refuse("'const' beside 'enum' is not supported", child(path, "const"), "const");
        for (const char* key :
             {"properties", "required", "additionalProperties", "items", "minItems", "maxItems"})
            if (s.contains(key))
                refuse(std::string("'") + key + "' beside 'enum' or 'const' is not supported",
                       child(path, key), key);
        const char* key = s.contains("enum") ? "enum" : "const";
        std::vector<json> values;
        if (s.contains("const")) {
            values.push_back(s["const"]);
        } else {
            if (!s["enum"].is_array() || s["enum"].empty())
                refuse("'enum' must be a non-empty array", child(path, "enum"), "enum");
            values = s["enum"].get<std::vector<json>>();
        }
        std::vector<Frag> options;
        for (const json& v : values) {
            const bool typed =
                types.empty() || std::any_of(types.begin(), types.end(), [&](const std::string& t) {
                    return value_has_type(v, t);
                });
            if (!typed) continue;
            options.push_back(nesting(v) > depth
                                  ? too_deep(std::string("a value of '") + key +
                                                 "' nests deeper than " +
                                                 std::to_string(JsonGrammar::kMaxDepth) + " levels",
                                             child(path, key), key)
                                  : literal(v.dump()));
        }
        if (options.empty())
            refuse(std::string("no value of '") + key + "' has the schema's type", child(path, key),
                   key);
        return alternatives(options);
    }
    const bool any_type = types.empty();
    if (any_type) types = type_names();
    std::vector<Frag> options;
    for (const std::string& t : types) {
        if (t == "string") {
            options.push_back(string());
        } else if (t == "number" || t == "integer") {
            if (t == "integer" && std::find(types.begin(), types.end(), "number") != types.end())
                continue;  // every integer is a number already
            options.push_back(number(t == "integer"));
        } else if (t == "boolean") {
            options.push_back(literal("true"));
            options.push_back(literal("false"));
        } else if (t == "null") {
            options.push_back(literal("null"));
        } else if (depth == 0) {
            if (!any_type)
                options.push_back(too_deep("objects and arrays nest deeper than " +
                                               std::to_string(JsonGrammar::kMaxDepth) + " levels",
                                           child(path, "type"), "type"));
        } else {
            // An object or array between: a `$ref` met below starts a new chain.
            const size_t chain = ref_chain_;
            ref_chain_ = 0;
            options.push_back(t == "object" ? object(s, path, depth - 1)
                                            : array(s, path, depth - 1));
            ref_chain_ = chain;
        }
    }
    return alternatives(options);
}

JsonGrammarBuilder::Target JsonGrammarBuilder::resolve(const std::string& ref,
                                                       const std::string& ref_path) const {
    if (ref.empty() || ref[0] != '#') {
        if (ref.find(':') != std::string::npos)
            refuse("a remote '$ref' (" + ref + ") is not supported: only local ones, '#/...'",
                   ref_path, "$ref");
        refuse("a '$ref' relative to an '$id' (" + ref +
                   ") is not supported: only local ones, '#/...'",
               ref_path, "$ref");
    }
    std::string pointer;
    if (!percent_decode(std::string_view(ref).substr(1), pointer))
        refuse("the '$ref' " + ref + " has a malformed percent-escape", ref_path, "$ref");
    if (!pointer.empty() && pointer[0] != '/')
        refuse(
            "a '$ref' to an '$anchor' (" + ref + ") is not supported: only JSON Pointers, '#/...'",
            ref_path, "$ref");
    Target t{&root_, "", false};
    // RFC 6901: "/"-separated tokens, "~1" for '/' and "~0" for '~' within one.
    for (size_t at = 0; at < pointer.size();) {
        const size_t end = std::min(pointer.find('/', at + 1), pointer.size());
        std::string token;
        for (size_t i = at + 1; i < end; ++i) {
            if (pointer[i] != '~') {
                token += pointer[i];
                continue;
            }
            if (i + 1 == end || (pointer[i + 1] != '0' && pointer[i + 1] != '1'))
                refuse("the '$ref' " + ref + " is not a JSON Pointer ('~' must be ~0 or ~1)",
                       ref_path, "$ref");
            token += pointer[++i] == '0' ? '~' : '/';
        }
        at = end;
        const json& node = *t.schema;
        if (node.is_object() && node.contains(token)) {
            t.schema = &node[token];
            t.path = child(t.path, token);
        } else if (node.is_array() && !token.empty() && token.size() < 10 &&
                   std::all_of(token.begin(), token.end(),
                               [](char c) { return c >= '0' && c <= '9'; }) &&
                   (token == "0" || token[0] != '0') && std::stoul(token) < node.size()) {
            t.schema = &node[std::stoul(token)];
            t.path = index(t.path, std::stoul(token));
        } else {
            refuse("the '$ref' " + ref + " points to nothing in the schema", ref_path, "$ref");
        }
        if (t.schema->is_object() && t.schema->contains("$id")) t.under_id = true;
    }
    return t;
}

JsonGrammarBuilder::Frag JsonGrammarBuilder::reference(const json& s, const std::string& path,
                                                       int depth) {
    const std::string ref_path = child(path, "$ref");
    for (auto it = s.begin(); it != s.end(); ++it)
        if (it.key() != "$ref" && !is_annotation(it.key()) && !is_definitions(it.key()))
            refuse("'" + it.key() +
                       "' beside '$ref' is not supported (put it in the referenced schema)",
                   child(path, it.key()), it.key());
    if (!s["$ref"].is_string()) refuse("'$ref' must be a string", ref_path, "$ref");
    if (under_id_)
        refuse("a '$ref' below a subschema with its own '$id' is not supported", ref_path, "$ref");
    const Target target = resolve(s["$ref"].get<std::string>(), ref_path);
    // Re-entering a schema at the depth it is compiled at: a cycle through no object or array,
    // which would expand forever.
    bool recursive = false;
    for (const Expanding& e : expanding_) {
        if (e.schema != target.schema) continue;
        if (e.depth == depth)
            refuse("the '$ref' cycle goes through no object or array (it never ends)", ref_path,
                   "$ref");
        recursive = true;
    }
    if (ref_chain_ >= kMaxRefChain)
        refuse("more than " + std::to_string(kMaxRefChain) +
                   " '$ref' in a chain with no object or array between",
               ref_path, "$ref");
    const std::string outer_recursive_ref = recursive_ref_;
    const bool was_under_id = under_id_;
    if (recursive) recursive_ref_ = ref_path;
    under_id_ = target.under_id;
    ++ref_chain_;
    const Frag f = schema(*target.schema, target.path, depth);
    --ref_chain_;
    under_id_ = was_under_id;
    recursive_ref_ = outer_recursive_ref;
    return f;
}

JsonGrammarBuilder::Frag JsonGrammarBuilder::too_deep(const std::string& what,
                                                      const std::string& path,
                                                      const std::string& keyword) {
    if (recursive_ref_.empty()) refuse(what, path, keyword);
    if (cut_ref_path_.empty()) cut_ref_path_ = recursive_ref_;
    return {add(), add()};  // no move from in to out
}

void JsonGrammarBuilder::trim() {
    // Live: the accepting state can be reached. Moves into other states are dropped, so every
    // set of states the DFA reaches can still complete a value.
    const auto& states = g_->states_;
    std::vector<std::vector<int32_t>> reverse(states.size());
    for (size_t q = 0; q < states.size(); ++q) {
        for (const auto& e : states[q].edges)
            reverse[static_cast<size_t>(e.to)].push_back(static_cast<int32_t>(q));
        for (int32_t t : states[q].epsilon)
            reverse[static_cast<size_t>(t)].push_back(static_cast<int32_t>(q));
    }
    live_.assign(states.size(), 0);
    std::vector<int32_t> stack = {g_->accept_};
    live_[static_cast<size_t>(g_->accept_)] = 1;
    while (!stack.empty()) {
        const int32_t q = stack.back();
        stack.pop_back();
        for (int32_t p : reverse[static_cast<size_t>(q)])
            if (!live_[static_cast<size_t>(p)]) {
                live_[static_cast<size_t>(p)] = 1;
                stack.push_back(p);
            }
    }
    for (auto& st : g_->states_) {
        std::erase_if(st.edges, [&](const JsonGrammar::Edge& e) {
            return !live_[static_cast<size_t>(e.to)];
        });
        std::erase_if(st.epsilon, [&](int32_t t) { return !live_[static_cast<size_t>(t)]; });
    }
}

std::shared_ptr<const JsonGrammar> compile_json_schema(const json& schema) {
    JsonGrammarBuilder b(schema);
    return b.finish(b.schema(schema, "", JsonGrammar::kMaxDepth));
}

std::shared_ptr<const JsonGrammar> json_object_grammar() {
    // The same for every request: built once.
    static const std::shared_ptr<const JsonGrammar> grammar = [] {
        static const json object = {{"type", "object"}};
        JsonGrammarBuilder b(object);
        return b.finish(b.schema(object, "", JsonGrammar::kMaxDepth));
    }();
    return grammar;
}

}  // namespace tmx

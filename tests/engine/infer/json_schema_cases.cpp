#include "tests/engine/infer/json_schema_cases.h"

#include <algorithm>
#include <climits>
#include <cmath>

#include "engine/infer/json_schema.h"

namespace tmx::test {

using nlohmann::json;

namespace {

size_t pick(Rng& rng, size_t n) {
    return static_cast<size_t>(rng.next_u64() % n);
}
bool chance(Rng& rng, double p) {
    return rng.uniform() < p;
}

// Whitespace where the automaton allows one byte of it.
std::string ws(Rng& rng) {
    const double u = rng.uniform();
    return u < 0.6 ? "" : u < 0.85 ? " " : "\n";
}

std::string random_string_body(Rng& rng) {
    static const std::vector<std::string> pieces = {"a",
                                                    "b",
                                                    "Z",
                                                    "7",
                                                    " ",
                                                    "fox",
                                                    "_",
                                                    "\\n",
                                                    "\\\"",
                                                    "\\\\",
                                                    "\\/",
                                                    "\\t",
                                                    "é",
                                                    "漢",
                                                    "😀",
                                                    "\\u00e9",
                                                    "\\uD83D\\uDE00",
                                                    "-",
                                                    ":",
                                                    ","};
    std::string s;
    const size_t n = pick(rng, 6);
    for (size_t i = 0; i < n; ++i) s += pieces[pick(rng, pieces.size())];
    return s;
}

std::string random_number(Rng& rng, bool integer) {
    std::string s = chance(rng, 0.3) ? "-" : "";
    if (chance(rng, 0.2)) {
        s += "0";
    } else {
        s += static_cast<char>('1' + pick(rng, 9));
        const size_t more = pick(rng, 6);
        for (size_t i = 0; i < more; ++i) s += static_cast<char>('0' + pick(rng, 10));
    }
    if (integer) return s;
    if (chance(rng, 0.5)) {
        s += ".";
        const size_t n = 1 + pick(rng, 4);
        for (size_t i = 0; i < n; ++i) s += static_cast<char>('0' + pick(rng, 10));
    }
    if (chance(rng, 0.2)) {
        s += chance(rng, 0.5) ? "e" : "E";
        if (chance(rng, 0.5)) s += chance(rng, 0.5) ? "+" : "-";
        s += static_cast<char>('0' + pick(rng, 10));
    }
    return s;
}

ojson random_scalar(Rng& rng) {
    switch (pick(rng, 6)) {
        case 0:
            return ojson(json::parse("\"" + random_string_body(rng) + "\"").get<std::string>());
        case 1:
            return ojson(static_cast<int64_t>(pick(rng, 2000)) - 1000);
        case 2:
            return ojson(std::round(rng.normal() * 1000) / 100);
        case 3:
            return ojson(chance(rng, 0.5));
        case 4:
            return ojson(nullptr);
        default:
            return ojson(std::string(chance(rng, 0.5) ? "red" : "grün"));
    }
}

// The subschema a local `$ref` ("#", "#/$defs/a~1b", percent-escapes) points at in `root`, as
// RFC 6901 and RFC 3986 say; nullptr when it points at nothing.
const ojson* resolve(const ojson& root, const std::string& ref) {
    if (ref.empty() || ref[0] != '#') return nullptr;
    std::string pointer;
    for (size_t i = 1; i < ref.size(); ++i) {
        if (ref[i] == '%' && i + 2 < ref.size()) {
            pointer += static_cast<char>(std::stoi(ref.substr(i + 1, 2), nullptr, 16));
            i += 2;
        } else {
            pointer += ref[i];
        }
    }
    try {
        return &root.at(ojson::json_pointer(pointer));
    } catch (const nlohmann::json::exception&) {
        return nullptr;
    }
}

constexpr int kUnwritable = INT_MAX / 2;

// The fewest levels of objects and arrays a value valid under `s` nests (kUnwritable: none is
// finite). `open` holds the refs being followed: a value that needs one again is no fewest.
int min_nesting(const ojson& s, const ojson& root, std::vector<const ojson*>& open) {
    if (s.is_boolean()) return s.get<bool>() ? 0 : kUnwritable;
    if (s.contains("$ref")) {
        const ojson* target = resolve(root, s["$ref"].get<std::string>());
        if (!target || std::find(open.begin(), open.end(), target) != open.end())
            return kUnwritable;
        open.push_back(target);
        const int n = min_nesting(*target, root, open);
        open.pop_back();
        return n;
    }
    int best = kUnwritable;
    if (s.contains("anyOf")) {
        for (const ojson& b : s["anyOf"]) best = std::min(best, min_nesting(b, root, open));
        return best;
    }
    if (s.contains("const") || s.contains("enum")) return 0;  // the generated ones are scalars
    if (!s.contains("type")) return 0;
    const std::vector<std::string> types =
        s["type"].is_string() ? std::vector<std::string>{s["type"].get<std::string>()}
                              : s["type"].get<std::vector<std::string>>();
    for (const std::string& t : types) {
        if (t == "object") {
            int inner = 0;
            if (s.contains("required"))
                for (const ojson& name : s["required"])
                    inner = std::max(
                        inner, min_nesting(s["properties"][name.get<std::string>()], root, open));
            best = std::min(best, 1 + inner);
        } else if (t == "array") {
            const bool needs_item = s.value("minItems", int64_t{0}) > 0 && s.contains("items");
            best = std::min(best, 1 + (needs_item ? min_nesting(s["items"], root, open) : 0));
        } else {
            best = 0;
        }
    }
    return best;
}

int min_nesting(const ojson& s, const ojson& root) {
    std::vector<const ojson*> open;
    return min_nesting(s, root, open);
}

std::string any_value_text(Rng& rng, int depth);

std::string any_object_text(Rng& rng, int depth) {
    std::string s = "{" + ws(rng);
    const size_t n = pick(rng, 3);
    for (size_t i = 0; i < n; ++i) {
        if (i) s += "," + ws(rng);
        s += "\"" + random_string_body(rng) + "\":" + ws(rng) + any_value_text(rng, depth);
    }
    return s + ws(rng) + "}";
}

std::string any_value_text(Rng& rng, int depth) {
    switch (pick(rng, depth > 0 ? 7 : 5)) {
        case 0:
            return "\"" + random_string_body(rng) + "\"";
        case 1:
            return random_number(rng, false);
        case 2:
            return chance(rng, 0.5) ? "true" : "false";
        case 3:
            return "null";
        case 4:
            return random_number(rng, true);
        case 5:
            return any_object_text(rng, depth - 1);
        default: {
            std::string s = "[" + ws(rng);
            const size_t n = pick(rng, 3);
            for (size_t i = 0; i < n; ++i)
                s += (i ? "," + ws(rng) : "") + any_value_text(rng, depth - 1);
            return s + ws(rng) + "]";
        }
    }
}

std::vector<std::string> types_of(const ojson& s) {
    if (!s.contains("type"))
        return {"string", "number", "integer", "boolean", "null", "object", "array"};
    if (s["type"].is_string()) return {s["type"].get<std::string>()};
    return s["type"].get<std::vector<std::string>>();
}

// A text valid under `s` nesting at most `budget` levels of objects and arrays (the automaton's
// limit; a recursive schema ends within it).
std::string text_of(const ojson& s, Rng& rng, const ojson& root, int budget) {
    if (s.is_boolean()) return any_value_text(rng, std::min(1, budget));
    if (s.contains("$ref")) return text_of(*resolve(root, s["$ref"]), rng, root, budget);
    if (s.contains("anyOf")) {
        std::vector<const ojson*> fitting;
        for (const ojson& b : s["anyOf"])
            if (min_nesting(b, root) <= budget) fitting.push_back(&b);
        return text_of(*fitting[pick(rng, fitting.size())], rng, root, budget);
    }
    if (s.contains("const")) return s["const"].dump();
    if (s.contains("enum")) {
        // Only values of the schema's type are written.
        std::vector<ojson> ok;
        for (const ojson& v : s["enum"])
            if (validates(json::parse(v.dump()), ojson{{"type", s.value("type", ojson())}}) ||
                !s.contains("type"))
                ok.push_back(v);
        return ok[pick(rng, ok.size())].dump();
    }
    std::vector<std::string> types;
    for (const std::string& t : types_of(s)) {
        ojson alone = s;
        alone["type"] = t;
        if (min_nesting(alone, root) <= budget) types.push_back(t);
    }
    const std::string t = types[pick(rng, types.size())];
    if (t == "string") return "\"" + random_string_body(rng) + "\"";
    if (t == "number" || t == "integer") return random_number(rng, t == "integer");
    if (t == "boolean") return chance(rng, 0.5) ? "true" : "false";
    if (t == "null") return "null";
    if (t == "object") {
        if (!s.contains("properties")) {
            if (s.value("additionalProperties", true) == false) return "{" + ws(rng) + "}";
            return any_object_text(rng, std::min(1, budget - 1));
        }
        const std::vector<std::string> required =
            s.contains("required") ? s["required"].get<std::vector<std::string>>()
                                   : std::vector<std::string>{};
        std::string out = "{" + ws(rng);
        bool first = true;
        for (auto it = s["properties"].begin(); it != s["properties"].end(); ++it) {
            const bool needed =
                std::find(required.begin(), required.end(), it.key()) != required.end();
            if (!needed && (chance(rng, 0.4) || min_nesting(it.value(), root) > budget - 1))
                continue;
            if (!first) out += "," + ws(rng);
            first = false;
            out +=
                json(it.key()).dump() + ":" + ws(rng) + text_of(it.value(), rng, root, budget - 1);
        }
        return out + ws(rng) + "}";
    }
    const int64_t lo = s.value("minItems", int64_t{0});
    int64_t hi = s.contains("maxItems") ? s["maxItems"].get<int64_t>() : lo + 3;
    if (s.contains("items") && min_nesting(s["items"], root) > budget - 1) hi = 0;  // lo is 0
    const int64_t n = lo + static_cast<int64_t>(pick(rng, static_cast<size_t>(hi - lo + 1)));
    std::string out = "[" + ws(rng);
    for (int64_t i = 0; i < n; ++i)
        out += (i ? "," + ws(rng) : "") + (s.contains("items")
                                               ? text_of(s["items"], rng, root, budget - 1)
                                               : any_value_text(rng, std::min(1, budget - 1)));
    return out + ws(rng) + "]";
}

bool has_type(const json& v, const std::string& t) {
    if (t == "string") return v.is_string();
    if (t == "number") return v.is_number();
    if (t == "integer")
        return v.is_number_integer() || (v.is_number_float() && std::isfinite(v.get<double>()) &&
                                         std::floor(v.get<double>()) == v.get<double>());
    if (t == "boolean") return v.is_boolean();
    if (t == "null") return v.is_null();
    if (t == "object") return v.is_object();
    return v.is_array();
}

}  // namespace

std::vector<ojson> sample_schemas() {
    return {
        ojson::parse(R"({"type": "object", "properties": {"name": {"type": "string"},
            "age": {"type": "integer"}, "email": {"type": "string"}},
            "required": ["name", "age"], "additionalProperties": false})"),
        ojson::parse(R"({"type": "object", "properties": {
            "colour": {"enum": ["red", "green", "blue", null]},
            "sizes": {"type": "array", "items": {"type": "number"}, "minItems": 1, "maxItems": 3},
            "ok": {"type": "boolean"}}, "required": ["colour", "sizes", "ok"]})"),
        ojson::parse(R"({"type": "array", "items": {"type": "object", "properties": {
            "id": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"},
            "maxItems": 2}}, "required": ["id"]}, "maxItems": 3})"),
        ojson::parse(R"({"anyOf": [{"type": "string"}, {"type": "null"},
            {"type": "object", "properties": {"x": {"const": 1}}, "required": ["x"]}],
            "title": "T", "description": "anyOf with null"})"),
        ojson::parse(R"({"type": ["integer", "boolean"]})"),
        ojson::parse(R"({"type": "object", "properties": {"inner": {"type": "object"}},
            "required": ["inner"]})"),
        // As Pydantic's model_json_schema() writes nested models, an enum and an Optional.
        ojson::parse(R"({"$defs": {"Kind": {"enum": ["cat", "dog"], "type": "string"},
            "Pet": {"properties": {"name": {"type": "string"}, "kind": {"$ref": "#/$defs/Kind"}},
                    "required": ["name", "kind"], "title": "Pet", "type": "object"}},
            "properties": {"pets": {"items": {"$ref": "#/$defs/Pet"}, "type": "array"},
                           "best": {"anyOf": [{"$ref": "#/$defs/Pet"}, {"type": "null"}],
                                    "default": null}},
            "required": ["pets"], "title": "Household", "type": "object"})"),
        // A recursive tree in `definitions`, the root a `$ref`.
        ojson::parse(R"({"definitions": {"node": {"type": "object", "properties": {
            "name": {"type": "string"}, "children": {"type": "array",
            "items": {"$ref": "#/definitions/node"}, "maxItems": 2}},
            "required": ["name", "children"]}}, "$ref": "#/definitions/node"})"),
    };
}

namespace {

ojson random_subschema(Rng& rng, int depth) {
    ojson s = ojson::object();
    if (chance(rng, 0.1)) s["description"] = "a random schema";
    const size_t kind = pick(rng, depth > 0 ? 11 : 7);
    switch (kind) {
        case 0:
            s["type"] = "string";
            break;
        case 1:
            s["type"] = "number";
            break;
        case 2:
            s["type"] = "integer";
            break;
        case 3:
            s["type"] = chance(rng, 0.5) ? "boolean" : "null";
            break;
        case 4: {
            ojson values = ojson::array();
            const size_t n = 1 + pick(rng, 4);
            // JSON Schema wants an enum's items unique (ajv refuses the schema otherwise).
            for (size_t i = 0; i < n; ++i)
                if (ojson v = random_scalar(rng);
                    std::find(values.begin(), values.end(), v) == values.end())
                    values.push_back(std::move(v));
            s["enum"] = values;
            break;
        }
        case 5:
            s["const"] = random_scalar(rng);
            break;
        case 6:
            s["type"] = ojson::array({"string", chance(rng, 0.5) ? "integer" : "null"});
            break;
        case 7:
        case 8: {
            s["type"] = "object";
            if (chance(rng, 0.15)) break;  // any object
            static const std::vector<std::string> names = {"id",  "name",  "a\"b", "größe",
                                                           "x y", "items", "ok",   "n"};
            ojson properties = ojson::object();
            ojson required = ojson::array();
            const size_t n = pick(rng, 5);
            for (size_t i = 0; i < n; ++i) {
                const std::string& name = names[pick(rng, names.size())];
                if (properties.contains(name)) continue;
                properties[name] = random_subschema(rng, depth - 1);
                if (chance(rng, 0.5)) required.push_back(name);
            }
            s["properties"] = properties;
            if (!required.empty()) s["required"] = required;
            if (chance(rng, 0.5)) s["additionalProperties"] = chance(rng, 0.7) ? false : true;
            break;
        }
        case 9: {
            s["type"] = "array";
            if (chance(rng, 0.8)) s["items"] = random_subschema(rng, depth - 1);
            const int64_t lo = static_cast<int64_t>(pick(rng, 3));
            if (chance(rng, 0.5)) s["minItems"] = lo;
            if (chance(rng, 0.5)) s["maxItems"] = lo + static_cast<int64_t>(pick(rng, 3));
            break;
        }
        default: {
            ojson branches = ojson::array();
            const size_t n = 2 + pick(rng, 2);
            for (size_t i = 0; i < n; ++i) branches.push_back(random_subschema(rng, depth - 1));
            s["anyOf"] = branches;
            break;
        }
    }
    return s;
}

// The subschemas below `s` a `$ref` may stand for (not `s` itself, not refs already).
void ref_candidates(ojson& s, std::vector<ojson*>& out) {
    if (!s.is_object()) return;
    auto visit = [&](ojson& sub) {
        if (sub.is_object() && !sub.contains("$ref")) out.push_back(&sub);
        ref_candidates(sub, out);
    };
    if (s.contains("properties"))
        for (auto& [name, sub] : s["properties"].items()) visit(sub);
    if (s.contains("items")) visit(s["items"]);
    if (s.contains("anyOf"))
        for (ojson& sub : s["anyOf"]) visit(sub);
}

// `name` as a token of a `$ref`'s JSON Pointer in a URI fragment.
std::string pointer_token(const std::string& name) {
    std::string out;
    for (char c : name) {
        if (c == '~')
            out += "~0";
        else if (c == '/')
            out += "~1";
        else if (c == ' ')
            out += "%20";
        else
            out += c;
    }
    return out;
}

// Rewrites `root` the way Pydantic and zod write schemas: some subschemas moved into `$defs` or
// `definitions` and referred to by `$ref`, sometimes a recursive one (a tree node), sometimes
// the root itself a `$ref`.
void add_refs(ojson& root, Rng& rng) {
    const std::string container = chance(rng, 0.5) ? "$defs" : "definitions";
    ojson defs = ojson::object();
    static const std::vector<std::string> names = {"Pet", "a/b", "t~x", "sp ace", "Item"};
    auto ref_to = [&](const std::string& name) {
        ojson r = {{"$ref", "#/" + container + "/" + pointer_token(name)}};
        if (chance(rng, 0.3)) r["description"] = "see " + name;
        return r;
    };
    const size_t moved = pick(rng, 3);
    for (size_t k = 0; k < moved; ++k) {
        std::vector<ojson*> candidates;
        ref_candidates(root, candidates);
        if (candidates.empty()) break;
        const std::string& name = names[pick(rng, names.size())];
        if (defs.contains(name)) continue;
        ojson* at = candidates[pick(rng, candidates.size())];
        defs[name] = std::move(*at);
        *at = ref_to(name);
    }
    if (chance(rng, 0.5)) {
        // A tree: each node's kids and next refer to the node again.
        const ojson node_ref = ref_to("Node");
        ojson node = {{"type", "object"},
                      {"properties",
                       {{"v", random_subschema(rng, 0)},
                        {"kids", {{"type", "array"}, {"items", node_ref}, {"maxItems", 2}}}}},
                      {"required", ojson::array({"v"})}};
        if (chance(rng, 0.5))
            node["properties"]["next"] = {{"anyOf", ojson::array({node_ref, {{"type", "null"}}})}};
        if (chance(rng, 0.5)) node["required"].push_back("kids");
        defs["Node"] = node;
        std::vector<ojson*> candidates;
        ref_candidates(root, candidates);
        if (candidates.empty())
            root = {{"anyOf", ojson::array({root, node_ref})}};
        else
            *candidates[pick(rng, candidates.size())] = node_ref;
    }
    if (defs.empty()) return;
    if (chance(rng, 0.2)) {
        defs["Root"] = std::move(root);
        root = ref_to("Root");
    }
    root[container] = std::move(defs);
}

bool validates_at(const json& v, const ojson& s, const ojson& root);

}  // namespace

ojson random_schema(Rng& rng, int depth) {
    ojson s = random_subschema(rng, depth);
    if (chance(rng, 0.35)) add_refs(s, rng);
    return s;
}

std::string random_valid_text(const ojson& schema, Rng& rng) {
    return ws(rng) + text_of(schema, rng, schema, JsonGrammar::kMaxDepth);
}

bool validates(const json& v, const ojson& s) {
    return validates_at(v, s, s);
}

namespace {

bool validates_at(const json& v, const ojson& s, const ojson& root) {
    if (s.is_boolean()) return s.get<bool>();
    if (s.contains("$ref")) {
        const ojson* target = resolve(root, s["$ref"].get<std::string>());
        if (!target || !validates_at(v, *target, root)) return false;
    }
    if (s.contains("anyOf"))
        return std::any_of(s["anyOf"].begin(), s["anyOf"].end(),
                           [&](const ojson& b) { return validates_at(v, b, root); });
    if (s.contains("const") && json::parse(s["const"].dump()) != v) return false;
    if (s.contains("enum") && std::none_of(s["enum"].begin(), s["enum"].end(), [&](const ojson& e) {
            return json::parse(e.dump()) == v;
        }))
        return false;
    if (s.contains("type") && !s["type"].is_null()) {
        const std::vector<std::string> types = types_of(s);
        if (std::none_of(types.begin(), types.end(),
                         [&](const std::string& t) { return has_type(v, t); }))
            return false;
    }
    if (v.is_object()) {
        const ojson props = s.value("properties", ojson::object());
        for (auto it = v.begin(); it != v.end(); ++it) {
            if (props.contains(it.key())) {
                if (!validates_at(it.value(), props[it.key()], root)) return false;
            } else if (s.value("additionalProperties", true) == false) {
                return false;
            }
        }
        if (s.contains("required"))
            for (const ojson& name : s["required"])
                if (!v.contains(name.get<std::string>())) return false;
    }
    if (v.is_array()) {
        if (s.contains("items"))
            for (const json& x : v)
                if (!validates_at(x, s["items"], root)) return false;
        if (s.contains("minItems") && static_cast<int64_t>(v.size()) < s["minItems"].get<int64_t>())
            return false;
        if (s.contains("maxItems") && static_cast<int64_t>(v.size()) > s["maxItems"].get<int64_t>())
            return false;
    }
    return true;
}

}  // namespace

}  // namespace tmx::test

#include "tests/engine/infer/json_schema_cases.h"

#include <algorithm>
#include <cmath>

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

std::string text_of(const ojson& s, Rng& rng) {
    if (s.is_boolean()) return any_value_text(rng, 1);
    if (s.contains("anyOf")) return text_of(s["anyOf"][pick(rng, s["anyOf"].size())], rng);
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
    const std::vector<std::string> types = types_of(s);
    const std::string t = types[pick(rng, types.size())];
    if (t == "string") return "\"" + random_string_body(rng) + "\"";
    if (t == "number" || t == "integer") return random_number(rng, t == "integer");
    if (t == "boolean") return chance(rng, 0.5) ? "true" : "false";
    if (t == "null") return "null";
    if (t == "object") {
        if (!s.contains("properties")) {
            if (s.value("additionalProperties", true) == false) return "{" + ws(rng) + "}";
            return any_object_text(rng, 1);
        }
        const std::vector<std::string> required =
            s.contains("required") ? s["required"].get<std::vector<std::string>>()
                                   : std::vector<std::string>{};
        std::string out = "{" + ws(rng);
        bool first = true;
        for (auto it = s["properties"].begin(); it != s["properties"].end(); ++it) {
            const bool needed =
                std::find(required.begin(), required.end(), it.key()) != required.end();
            if (!needed && chance(rng, 0.4)) continue;
            if (!first) out += "," + ws(rng);
            first = false;
            out += json(it.key()).dump() + ":" + ws(rng) + text_of(it.value(), rng);
        }
        return out + ws(rng) + "}";
    }
    const int64_t lo = s.value("minItems", int64_t{0});
    const int64_t hi = s.contains("maxItems") ? s["maxItems"].get<int64_t>() : lo + 3;
    const int64_t n = lo + static_cast<int64_t>(pick(rng, static_cast<size_t>(hi - lo + 1)));
    std::string out = "[" + ws(rng);
    for (int64_t i = 0; i < n; ++i)
        out += (i ? "," + ws(rng) : "") +
               (s.contains("items") ? text_of(s["items"], rng) : any_value_text(rng, 1));
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
    };
}

ojson random_schema(Rng& rng, int depth) {
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
                properties[name] = random_schema(rng, depth - 1);
                if (chance(rng, 0.5)) required.push_back(name);
            }
            s["properties"] = properties;
            if (!required.empty()) s["required"] = required;
            if (chance(rng, 0.5)) s["additionalProperties"] = chance(rng, 0.7) ? false : true;
            break;
        }
        case 9: {
            s["type"] = "array";
            if (chance(rng, 0.8)) s["items"] = random_schema(rng, depth - 1);
            const int64_t lo = static_cast<int64_t>(pick(rng, 3));
            if (chance(rng, 0.5)) s["minItems"] = lo;
            if (chance(rng, 0.5)) s["maxItems"] = lo + static_cast<int64_t>(pick(rng, 3));
            break;
        }
        default: {
            ojson branches = ojson::array();
            const size_t n = 2 + pick(rng, 2);
            for (size_t i = 0; i < n; ++i) branches.push_back(random_schema(rng, depth - 1));
            s["anyOf"] = branches;
            break;
        }
    }
    return s;
}

std::string random_valid_text(const ojson& schema, Rng& rng) {
    return ws(rng) + text_of(schema, rng);
}

bool validates(const json& v, const ojson& s) {
    if (s.is_boolean()) return s.get<bool>();
    if (s.contains("anyOf"))
        return std::any_of(s["anyOf"].begin(), s["anyOf"].end(),
                           [&](const ojson& b) { return validates(v, b); });
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
                if (!validates(it.value(), props[it.key()])) return false;
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
                if (!validates(x, s["items"])) return false;
        if (s.contains("minItems") && static_cast<int64_t>(v.size()) < s["minItems"].get<int64_t>())
            return false;
        if (s.contains("maxItems") && static_cast<int64_t>(v.size()) > s["maxItems"].get<int64_t>())
            return false;
    }
    return true;
}

}  // namespace tmx::test

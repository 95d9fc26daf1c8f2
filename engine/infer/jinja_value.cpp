// The Jinja subset's values (jinja_detail.h): Python's truth, equality, ordering, str() and
// float repr, json.dumps for tojson, and text as code points.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "engine/infer/jinja_detail.h"

namespace tmx::jinja::detail {

void fail(std::string message) {
    throw Failure{std::move(message)};
}

void Budget::built(size_t bytes) {
    built_ += static_cast<int64_t>(std::min<size_t>(bytes, INT64_MAX / 2));
    if (built_ > limits_.max_built_bytes)
        fail("the template built more than " + std::to_string(limits_.max_built_bytes) +
             " bytes of strings and lists (limit)");
}

const Value* DictData::find(std::string_view key) const {
    for (const auto& [k, v] : items)
        if (k == key) return &v;
    return nullptr;
}

Value Value::undefined(std::string why) {
    Value v;
    v.text = std::move(why);
    return v;
}
Value Value::none() {
    Value v;
    v.type = Type::None;
    return v;
}
Value Value::of(bool b) {
    Value v;
    v.type = Type::Bool;
    v.boolean = b;
    return v;
}
Value Value::of(int64_t i) {
    Value v;
    v.type = Type::Int;
    v.integer = i;
    return v;
}
Value Value::of(double d) {
    Value v;
    v.type = Type::Float;
    v.number = d;
    return v;
}
Value Value::of(std::string s) {
    Value v;
    v.type = Type::String;
    v.text = std::move(s);
    return v;
}

namespace {
// The nesting a container of these values has; namespaces are refused inside containers.
int depth_of(const Value& v) {
    if (v.is(Value::Type::Namespace)) fail("a namespace cannot be put in a list or dict");
    return v.list ? v.list->depth : v.dict ? v.dict->depth : 0;
}
void check_depth(int depth) {
    if (depth > kMaxValueDepth)
        fail("lists and dicts nested more than " + std::to_string(kMaxValueDepth) + " deep");
}
}  // namespace

Value Value::of_list(std::vector<Value> items) {
    auto data = std::make_shared<ListData>();
    for (const Value& item : items) data->depth = std::max(data->depth, depth_of(item) + 1);
    check_depth(data->depth);
    data->items = std::move(items);
    Value v;
    v.type = Type::List;
    v.list = std::move(data);
    return v;
}
Value Value::of_dict(std::vector<std::pair<std::string, Value>> items) {
    auto data = std::make_shared<DictData>();
    for (auto& [key, value] : items) {
        data->depth = std::max(data->depth, depth_of(value) + 1);
        bool replaced = false;  // a repeated key keeps its first place, as in Python
        for (auto& [k, v] : data->items)
            if (k == key) v = value, replaced = true;
        if (!replaced) data->items.emplace_back(std::move(key), std::move(value));
    }
    check_depth(data->depth);
    Value v;
    v.type = Type::Dict;
    v.dict = std::move(data);
    return v;
}

bool truthy(const Value& v) {
    switch (v.type) {
        case Value::Type::Undefined:
        case Value::Type::None:
            return false;
        case Value::Type::Bool:
            return v.boolean;
        case Value::Type::Int:
            return v.integer != 0;
        case Value::Type::Float:
            return v.number != 0;
        case Value::Type::String:
            return !v.text.empty();
        case Value::Type::List:
            return !v.list->items.empty();
        case Value::Type::Dict:
            return !v.dict->items.empty();
        case Value::Type::Namespace:
        case Value::Type::Function:
            return true;
    }
    return false;
}

std::string type_name(const Value& v) {
    switch (v.type) {
        case Value::Type::Undefined:
            return "Undefined";
        case Value::Type::None:
            return "NoneType";
        case Value::Type::Bool:
            return "bool";
        case Value::Type::Int:
            return "int";
        case Value::Type::Float:
            return "float";
        case Value::Type::String:
            return "str";
        case Value::Type::List:
            return "list";
        case Value::Type::Dict:
            return "dict";
        case Value::Type::Namespace:
            return "Namespace";
        case Value::Type::Function:
            return "function";
    }
    return "?";
}

// Python's repr(float): the shortest digits that read back the same, in positional notation
// for exponents from -4 to 15 and scientific otherwise; ".0" on whole numbers.
std::string float_repr(double d) {
    if (std::isnan(d)) return "nan";
    if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
    char buf[64];
    const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
    (void)ec;
    const std::string sci(buf, end);  // [-]D[.DDD]e[+-]XX
    const size_t e = sci.find('e');
    const bool negative = sci[0] == '-';
    std::string digits = sci.substr(negative ? 1 : 0, e - (negative ? 1 : 0));
    digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
    const int exponent = std::stoi(sci.substr(e + 1));
    std::string out = negative ? "-" : "";
    if (exponent < -4 || exponent >= 16) {
        out += digits.substr(0, 1);
        if (digits.size() > 1) out += "." + digits.substr(1);
        char exp[16];
        std::snprintf(exp, sizeof exp, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
        return out + exp;
    }
    if (exponent < 0) return out + "0." + std::string(-exponent - 1, '0') + digits;
    const size_t int_digits = static_cast<size_t>(exponent) + 1;
    if (digits.size() <= int_digits)
        return out + digits + std::string(int_digits - digits.size(), '0') + ".0";
    return out + digits.substr(0, int_digits) + "." + digits.substr(int_digits);
}

std::string to_str(const Value& v) {
    switch (v.type) {
        case Value::Type::Undefined:
            return "";
        case Value::Type::None:
            return "None";
        case Value::Type::Bool:
            return v.boolean ? "True" : "False";
        case Value::Type::Int:
            return std::to_string(v.integer);
        case Value::Type::Float:
            return float_repr(v.number);
        case Value::Type::String:
            return v.text;
        default:
            fail("a " + type_name(v) +
                 " cannot be turned into text here (the subset prints strings, numbers, "
                 "booleans and none; use |tojson)");
    }
}

bool equal(const Value& a, const Value& b) {
    using T = Value::Type;
    if (a.is_number() && b.is_number()) {
        if (a.is(T::Float) || b.is(T::Float)) {
            auto as_double = [](const Value& v) {
                return v.is(T::Float) ? v.number : v.is(T::Int) ? double(v.integer) : v.boolean;
            };
            return as_double(a) == as_double(b);
        }
        auto as_int = [](const Value& v) { return v.is(T::Int) ? v.integer : int64_t{v.boolean}; };
        return as_int(a) == as_int(b);
    }
    if (a.type != b.type) return false;
    switch (a.type) {
        case T::Undefined:
        case T::None:
            return true;
        case T::String:
            return a.text == b.text;
        case T::List:
            return a.list->items.size() == b.list->items.size() &&
                   std::equal(a.list->items.begin(), a.list->items.end(), b.list->items.begin(),
                              equal);
        case T::Dict:
            if (a.dict->items.size() != b.dict->items.size()) return false;
            for (const auto& [k, v] : a.dict->items) {
                const Value* other = b.dict->find(k);
                if (!other || !equal(v, *other)) return false;
            }
            return true;
        case T::Namespace:
            return a.ns == b.ns;
        case T::Function:
            return a.function == b.function;
        default:
            return false;
    }
}

namespace {
// Python's ordering: numbers with numbers, strings by code point (UTF-8's byte order is the
// same), lists item by item. Returns <0, 0, >0.
int order(const Value& a, const Value& b, std::string_view op) {
    using T = Value::Type;
    if (a.is(T::Undefined)) fail(a.text);
    if (b.is(T::Undefined)) fail(b.text);
    if (a.is_number() && b.is_number()) {
        auto as_double = [](const Value& v) {
            return v.is(T::Float) ? v.number : v.is(T::Int) ? double(v.integer) : v.boolean;
        };
        if (!a.is(T::Float) && !b.is(T::Float)) {
            const int64_t x = a.is(T::Int) ? a.integer : a.boolean;
            const int64_t y = b.is(T::Int) ? b.integer : b.boolean;
            return x < y ? -1 : x > y;
        }
        const double x = as_double(a), y = as_double(b);
        return x < y ? -1 : x > y ? 1 : 0;
    }
    if (a.is(T::String) && b.is(T::String))
        return a.text.compare(b.text) < 0 ? -1 : a.text > b.text;
    if (a.is(T::List) && b.is(T::List)) {
        const auto& x = a.list->items;
        const auto& y = b.list->items;
        for (size_t i = 0; i < x.size() && i < y.size(); ++i)
            if (!equal(x[i], y[i])) return order(x[i], y[i], op);
        return x.size() < y.size() ? -1 : x.size() > y.size();
    }
    fail("'" + std::string(op) + "' is not supported between instances of '" + type_name(a) +
         "' and '" + type_name(b) + "'");
}
}  // namespace

bool less(const Value& a, const Value& b, std::string_view op) {
    const int c = order(a, b, op);
    if (op == "<") return c < 0;
    if (op == "<=") return c <= 0;
    if (op == ">") return c > 0;
    return c >= 0;
}

namespace {
void json_string(const std::string& s, bool ensure_ascii, std::string& out) {
    out += '"';
    for (const char32_t c : decode(s)) {
        switch (c) {
            case U'"':
                out += "\\\"";
                continue;
            case U'\\':
                out += "\\\\";
                continue;
            case U'\n':
                out += "\\n";
                continue;
            case U'\r':
                out += "\\r";
                continue;
            case U'\t':
                out += "\\t";
                continue;
            case U'\b':
                out += "\\b";
                continue;
            case U'\f':
                out += "\\f";
                continue;
            default:
                break;
        }
        char buf[16];
        if (c < 0x20 || (ensure_ascii && c > 0x7e)) {
            if (c >= 0x10000) {
                const uint32_t u = c - 0x10000;
                std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + (u >> 10),
                              0xDC00 + (u & 0x3FF));
            } else {
                std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
            }
            out += buf;
        } else {
            out += encode(std::u32string(1, c));
        }
    }
    out += '"';
}

void json_value(const Value& v, const JsonStyle& style, int level, std::string& out) {
    using T = Value::Type;
    if (out.size() > style.max_bytes)
        fail("tojson's text is over " + std::to_string(style.max_bytes) + " bytes (limit)");
    auto newline = [&](int at) {
        if (!style.indent) return;
        out += '\n';
        out.append(static_cast<size_t>(*style.indent) * static_cast<size_t>(at), ' ');
    };
    switch (v.type) {
        case T::None:
            out += "null";
            return;
        case T::Bool:
            out += v.boolean ? "true" : "false";
            return;
        case T::Int:
            out += std::to_string(v.integer);
            return;
        case T::Float:
            if (std::isnan(v.number))
                out += "NaN";
            else if (std::isinf(v.number))
                out += v.number < 0 ? "-Infinity" : "Infinity";
            else
                out += float_repr(v.number);
            return;
        case T::String:
            json_string(v.text, style.ensure_ascii, out);
            return;
        case T::List: {
            if (v.list->items.empty()) {
                out += "[]";
                return;
            }
            out += '[';
            for (size_t i = 0; i < v.list->items.size(); ++i) {
                if (i) out += style.item_separator;
                newline(level + 1);
                json_value(v.list->items[i], style, level + 1, out);
            }
            newline(level);
            out += ']';
            return;
        }
        case T::Dict: {
            if (v.dict->items.empty()) {
                out += "{}";
                return;
            }
            std::vector<const std::pair<std::string, Value>*> items;
            for (const auto& item : v.dict->items) items.push_back(&item);
            if (style.sort_keys)
                std::stable_sort(items.begin(), items.end(),
                                 [](auto* x, auto* y) { return x->first < y->first; });
            out += '{';
            for (size_t i = 0; i < items.size(); ++i) {
                if (i) out += style.item_separator;
                newline(level + 1);
                json_string(items[i]->first, style.ensure_ascii, out);
                out += style.key_separator;
                json_value(items[i]->second, style, level + 1, out);
            }
            newline(level);
            out += '}';
            return;
        }
        default:
            fail("Object of type " + type_name(v) + " is not JSON serializable");
    }
}
}  // namespace

std::string to_json(const Value& v, const JsonStyle& style) {
    std::string out;
    json_value(v, style, 0, out);
    return out;
}

Value from_json(const nlohmann::ordered_json& j, int depth) {
    using J = nlohmann::ordered_json::value_t;
    if (depth > kMaxValueDepth)
        fail("input values nested more than " + std::to_string(kMaxValueDepth) + " deep");
    switch (j.type()) {
        case J::null:
            return Value::none();
        case J::boolean:
            return Value::of(j.get<bool>());
        case J::number_integer:
            return Value::of(j.get<int64_t>());
        case J::number_unsigned: {
            const uint64_t u = j.get<uint64_t>();
            if (u > static_cast<uint64_t>(INT64_MAX)) fail("an integer over 2^63-1 in the input");
            return Value::of(static_cast<int64_t>(u));
        }
        case J::number_float:
            return Value::of(j.get<double>());
        case J::string:
            return Value::of(j.get<std::string>());
        case J::array: {
            std::vector<Value> items;
            for (const auto& item : j) items.push_back(from_json(item, depth + 1));
            return Value::of_list(std::move(items));
        }
        case J::object: {
            std::vector<std::pair<std::string, Value>> items;
            for (const auto& [k, item] : j.items())
                items.emplace_back(k, from_json(item, depth + 1));
            return Value::of_dict(std::move(items));
        }
        default:
            fail("a value of JSON type " + std::string(j.type_name()) + " in the input");
    }
}

char32_t next_code_point(std::string_view s, size_t& at) {
    const auto byte = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
    const unsigned char b0 = byte(at);
    size_t len = b0 < 0x80 ? 1 : (b0 >> 5) == 6 ? 2 : (b0 >> 4) == 14 ? 3 : (b0 >> 3) == 30 ? 4 : 0;
    char32_t c = len == 1 ? b0 : len == 2 ? b0 & 0x1F : len == 3 ? b0 & 0x0F : b0 & 0x07;
    bool ok = len > 0 && at + len <= s.size();
    for (size_t k = 1; ok && k < len; ++k) {
        ok = (byte(at + k) & 0xC0) == 0x80;
        c = (c << 6) | (byte(at + k) & 0x3F);
    }
    // Overlong forms, surrogates and values past U+10FFFF are not UTF-8 either.
    ok = ok && !(len == 2 && c < 0x80) && !(len == 3 && c < 0x800) && !(len == 4 && c < 0x10000) &&
         !(c >= 0xD800 && c <= 0xDFFF) && c <= 0x10FFFF;
    if (!ok) {
        ++at;
        return 0xDC00 + b0;  // as Python's surrogateescape
    }
    at += len;
    return c;
}

std::u32string decode(std::string_view s) {
    std::u32string out;
    out.reserve(s.size());
    for (size_t at = 0; at < s.size();) out += next_code_point(s, at);
    return out;
}

std::string encode(std::u32string_view text) {
    std::string out;
    out.reserve(text.size());
    for (const char32_t c : text) {
        if (c >= 0xDC80 && c <= 0xDCFF) {
            out += static_cast<char>(c - 0xDC00);
        } else if (c < 0x80) {
            out += static_cast<char>(c);
        } else if (c < 0x800) {
            out += static_cast<char>(0xC0 | (c >> 6));
            out += static_cast<char>(0x80 | (c & 0x3F));
        } else if (c < 0x10000) {
            out += static_cast<char>(0xE0 | (c >> 12));
            out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (c & 0x3F));
        } else {
            out += static_cast<char>(0xF0 | (c >> 18));
            out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
            out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (c & 0x3F));
        }
    }
    return out;
}

bool is_space(char32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left,
                     bool right) {
    const std::u32string text = decode(s);
    const std::u32string set = chars ? decode(*chars) : std::u32string();
    auto strip = [&](char32_t c) {
        return chars ? set.find(c) != std::u32string::npos : is_space(c);
    };
    size_t begin = 0, end = text.size();
    while (left && begin < end && strip(text[begin])) ++begin;
    while (right && end > begin && strip(text[end - 1])) --end;
    return encode(std::u32string_view(text).substr(begin, end - begin));
}

std::vector<std::optional<Value>> bind(const Args& args, const std::vector<std::string>& names,
                                       const std::string& what) {
    if (args.positional.size() > names.size())
        fail(what + " takes at most " + std::to_string(names.size()) + " argument(s), got " +
             std::to_string(args.positional.size()));
    std::vector<std::optional<Value>> out(names.size());
    for (size_t i = 0; i < args.positional.size(); ++i) out[i] = args.positional[i];
    for (const auto& [key, value] : args.keyword) {
        const auto it = std::find(names.begin(), names.end(), key);
        if (it == names.end()) fail(what + " got an unexpected keyword argument '" + key + "'");
        std::optional<Value>& slot = out[static_cast<size_t>(it - names.begin())];
        if (slot) fail(what + " got multiple values for the argument '" + key + "'");
        slot = value;
    }
    return out;
}

}  // namespace tmx::jinja::detail

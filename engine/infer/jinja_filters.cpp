// The Jinja subset's filters (jinja_detail.h), each as Jinja2 3.1 defines it, and tojson as
// transformers defines it.
#include <algorithm>
#include <cmath>
#include <set>

#include "engine/infer/jinja_detail.h"

namespace tmx::jinja::detail {
namespace {

using T = Value::Type;

const std::set<std::string_view> kFilters = {
    "abs",    "capitalize", "count",   "d",       "default", "first",  "float",      "indent",
    "int",    "items",      "join",    "last",    "length",  "list",   "lower",      "map",
    "reject", "rejectattr", "replace", "reverse", "safe",    "select", "selectattr", "sort",
    "string", "title",      "tojson",  "trim",    "upper"};

// Jinja 3.1's indent: lines after the first (and the first with first=True) get `width`
// spaces (or the string), blank lines only with blank=True.
std::string indent(const std::string& s, const Args& args, const Limits& limits) {
    const auto a = bind(args, {"width", "first", "blank"}, "indent()");
    std::string pad = "    ";
    if (a[0] && a[0]->is(T::String)) {
        pad = a[0]->text;
    } else if (a[0]) {
        const int64_t width = int_arg(a[0], 4, "indent width");
        if (width > 1000) fail("indent width over 1000");
        pad = std::string(static_cast<size_t>(std::max<int64_t>(width, 0)), ' ');
    }
    const std::vector<std::u32string> lines = split_lines(decode(s + "\n"));
    if (s.size() + lines.size() * (pad.size() + 1) > limits.max_output_bytes)
        fail("indent's text would be over " + std::to_string(limits.max_output_bytes) +
             " bytes (limit)");
    std::string out;
    for (size_t i = 0; i < lines.size(); ++i) {
        const std::string line = encode(lines[i]);
        if (i > 0) out += (flag_arg(a[2]) || !line.empty()) ? "\n" + pad : "\n";
        out += line;
    }
    if (flag_arg(a[1])) out = pad + out;
    return out;
}

Value attribute_path(const Value& item, const std::string& path) {
    Value v = item;
    size_t start = 0;
    while (true) {
        const size_t dot = path.find('.', start);
        const std::string part = path.substr(start, dot - start);
        const bool number = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) {
            return c >= '0' && c <= '9';
        }) && part.size() < 18;
        v = get_item(v,
                     number ? Value::of(static_cast<int64_t>(std::stoll(part))) : Value::of(part));
        if (dot == std::string::npos) return v;
        start = dot + 1;
    }
}

// select/reject/selectattr/rejectattr: items whose value (the item, or its attribute) passes
// the named test (truth without one).
Value select_items(std::string_view filter, const Value& seq, const Args& args) {
    const bool by_attribute = filter.ends_with("attr");
    const bool keep = filter.starts_with("select");
    Args test_args;
    size_t at = 0;
    std::string attribute;
    if (by_attribute) {
        if (args.positional.empty()) fail(std::string(filter) + "() needs an attribute name");
        attribute = to_str(args.positional[at++]);
    }
    std::string test;
    if (at < args.positional.size()) test = to_str(args.positional[at++]);
    if (!test.empty() && !is_test(test)) fail("unknown test '" + test + "'");
    test_args.positional.assign(args.positional.begin() + static_cast<ptrdiff_t>(at),
                                args.positional.end());
    test_args.keyword = args.keyword;
    std::vector<Value> out;
    for (const Value& item : iterate(seq)) {
        const Value v = by_attribute ? attribute_path(item, attribute) : item;
        const bool pass = test.empty() ? truthy(v) : apply_test(test, v, test_args);
        if (pass == keep) out.push_back(item);
    }
    return Value::of_list(std::move(out));
}

Value map_items(const Value& seq, const Args& args, Budget& budget) {
    std::vector<Value> out;
    if (args.positional.empty()) {
        const auto a = bind(args, {"attribute", "default"}, "map()");
        if (!a[0]) fail("map() needs a filter name or attribute=");
        const std::string attribute = to_str(*a[0]);
        for (const Value& item : iterate(seq)) {
            Value v = attribute_path(item, attribute);
            out.push_back(v.is(T::Undefined) && a[1] ? *a[1] : v);
        }
        return Value::of_list(std::move(out));
    }
    const std::string filter = to_str(args.positional[0]);
    if (!is_filter(filter)) fail("unknown filter '" + filter + "'");
    Args rest{{args.positional.begin() + 1, args.positional.end()}, args.keyword};
    for (const Value& item : iterate(seq)) out.push_back(apply_filter(filter, item, rest, budget));
    return Value::of_list(std::move(out));
}

std::optional<int64_t> parse_int(std::string s) {
    s = py_strip(s, std::nullopt, true, true);
    size_t i = s.size() > 0 && (s[0] == '-' || s[0] == '+') ? 1 : 0;
    if (i >= s.size()) return std::nullopt;
    int64_t v = 0;
    for (size_t k = i; k < s.size(); ++k) {
        if (s[k] == '_' && k > i && k + 1 < s.size() && s[k - 1] != '_') continue;
        if (s[k] < '0' || s[k] > '9') return std::nullopt;
        if (v > (INT64_MAX - (s[k] - '0')) / 10) return std::nullopt;
        v = v * 10 + (s[k] - '0');
    }
    return s[0] == '-' ? -v : v;
}
std::optional<double> parse_float(std::string s) {
    s = py_strip(s, std::nullopt, true, true);
    if (s.empty() || s.find_first_of("xXpP") != std::string::npos) return std::nullopt;
    std::string digits;
    for (size_t k = 0; k < s.size(); ++k)  // '_' only between digits, as Python reads them
        if (s[k] != '_' ||
            (k > 0 && k + 1 < s.size() && std::isdigit(s[k - 1]) && std::isdigit(s[k + 1])))
            digits += s[k];
    char* end = nullptr;
    const double d = std::strtod(digits.c_str(), &end);
    if (end != digits.c_str() + digits.size()) return std::nullopt;
    return d;
}

Value to_int(const Value& v, const Args& args) {
    const auto a = bind(args, {"default", "base"}, "int()");
    if (int_arg(a[1], 10, "base") != 10) fail("int() with a base other than 10 is not supported");
    const Value fallback = a[0] ? *a[0] : Value::of(int64_t{0});
    switch (v.type) {
        case T::Undefined:
            fail(v.text);
        case T::Int:
            return v;
        case T::Bool:
            return Value::of(int64_t{v.boolean});
        case T::Float:
            if (!std::isfinite(v.number) || std::fabs(v.number) >= 9.2e18) return fallback;
            return Value::of(static_cast<int64_t>(std::trunc(v.number)));
        case T::String: {
            if (const auto i = parse_int(v.text)) return Value::of(*i);
            const auto d = parse_float(v.text);
            if (!d || !std::isfinite(*d) || std::fabs(*d) >= 9.2e18) return fallback;
            return Value::of(static_cast<int64_t>(std::trunc(*d)));
        }
        default:
            return fallback;
    }
}

Value to_float(const Value& v, const Args& args) {
    const auto a = bind(args, {"default"}, "float()");
    const Value fallback = a[0] ? *a[0] : Value::of(0.0);
    switch (v.type) {
        case T::Undefined:
            fail(v.text);
        case T::Float:
            return v;
        case T::Int:
            return Value::of(static_cast<double>(v.integer));
        case T::Bool:
            return Value::of(v.boolean ? 1.0 : 0.0);
        case T::String: {
            const auto d = parse_float(v.text);
            return d ? Value::of(*d) : fallback;
        }
        default:
            return fallback;
    }
}

// transformers' tojson: json.dumps(x, ensure_ascii=False, indent=None, separators=None,
// sort_keys=False), in that order.
std::string tojson(const Value& v, const Args& args, const Limits& limits) {
    const auto a = bind(args, {"ensure_ascii", "indent", "separators", "sort_keys"}, "tojson()");
    JsonStyle style;
    style.ensure_ascii = flag_arg(a[0]);
    if (a[1] && !a[1]->is(T::None)) {
        const int64_t width = int_arg(a[1], 0, "tojson indent");
        if (width > 1000) fail("tojson indent over 1000");
        style.indent = std::max<int64_t>(width, 0);
        style.item_separator = ",";
    }
    if (a[2] && !a[2]->is(T::None)) {
        if (!a[2]->is(T::List) || a[2]->list->items.size() != 2)
            fail("tojson separators must be a pair of strings");
        style.item_separator = to_str(a[2]->list->items[0]);
        style.key_separator = to_str(a[2]->list->items[1]);
    }
    style.sort_keys = flag_arg(a[3]);
    style.max_bytes = limits.max_output_bytes;
    return to_json(v, style);
}

Value sorted(const Value& seq, const Args& args) {
    const auto a = bind(args, {"reverse", "case_sensitive", "attribute"}, "sort()");
    const bool reverse = flag_arg(a[0]), case_sensitive = flag_arg(a[1]);
    const std::optional<std::string> attribute =
        a[2] && !a[2]->is(T::None) ? std::optional(to_str(*a[2])) : std::nullopt;
    std::vector<std::pair<Value, Value>> keyed;
    for (const Value& item : iterate(seq)) {
        Value key = attribute ? attribute_path(item, *attribute) : item;
        if (!case_sensitive && key.is(T::String)) key.text = ascii_case(key.text, false, "sort");
        keyed.emplace_back(std::move(key), item);
    }
    std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
        return reverse ? less(y.first, x.first, "<") : less(x.first, y.first, "<");
    });
    std::vector<Value> out;
    for (auto& [key, item] : keyed) out.push_back(std::move(item));
    return Value::of_list(std::move(out));
}

}  // namespace

bool is_filter(std::string_view name) {
    return kFilters.contains(name);
}

Value apply_filter(std::string_view name, const Value& v, const Args& args, Budget& budget) {
    const std::string what = std::string(name) + "()";
    if (name == "default" || name == "d") {
        const auto a = bind(args, {"default_value", "boolean"}, what);
        const bool use = v.is(T::Undefined) || (flag_arg(a[1]) && !truthy(v));
        return use ? (a[0] ? *a[0] : Value::of(std::string())) : v;
    }
    if (name == "length" || name == "count") {
        bind(args, {}, what);
        switch (v.type) {
            case T::Undefined:
                return Value::of(int64_t{0});
            case T::String:
                return Value::of(static_cast<int64_t>(decode(v.text).size()));
            case T::List:
                return Value::of(static_cast<int64_t>(v.list->items.size()));
            case T::Dict:
                return Value::of(static_cast<int64_t>(v.dict->items.size()));
            default:
                fail("object of type '" + type_name(v) + "' has no len()");
        }
    }
    if (name == "trim") {
        const auto a = bind(args, {"chars"}, what);
        return Value::of(py_strip(
            to_str(v), a[0] && !a[0]->is(T::None) ? std::optional(to_str(*a[0])) : std::nullopt,
            true, true));
    }
    if (name == "string" || name == "safe") return bind(args, {}, what), Value::of(to_str(v));
    if (name == "upper")
        return bind(args, {}, what), Value::of(ascii_case(to_str(v), true, "upper"));
    if (name == "lower")
        return bind(args, {}, what), Value::of(ascii_case(to_str(v), false, "lower"));
    if (name == "capitalize") return bind(args, {}, what), Value::of(capitalized(to_str(v)));
    if (name == "title") return bind(args, {}, what), Value::of(jinja_title(to_str(v)));
    if (name == "tojson") {
        std::string json = tojson(v, args, budget.limits());
        budget.built(json.size());
        return Value::of(std::move(json));
    }
    if (name == "join") {
        const auto a = bind(args, {"d", "attribute"}, what);
        const std::string sep = text_arg(a[0], "");
        std::string out;
        bool first = true;
        for (const Value& item : iterate(v)) {
            if (!first) out += sep;
            first = false;
            out += to_str(a[1] ? attribute_path(item, to_str(*a[1])) : item);
            budget.built(sep.size() + 16);
        }
        budget.built(out.size());
        return Value::of(std::move(out));
    }
    if (name == "first" || name == "last") {
        bind(args, {}, what);
        if (v.is(T::Undefined)) return v;
        const std::vector<Value> items = iterate(v);
        if (items.empty())
            return Value::undefined("No " + std::string(name) + " item, sequence was empty.");
        return name == "first" ? items.front() : items.back();
    }
    if (name == "replace") {
        const auto a = bind(args, {"old", "new", "count"}, what);
        if (!a[0] || !a[1]) fail("replace() needs the old and new text");
        std::string out = py_replace(to_str(v), to_str(*a[0]), to_str(*a[1]),
                                     int_arg(a[2], -1, "replace count"), budget);
        return Value::of(std::move(out));
    }
    if (name == "int") return to_int(v, args);
    if (name == "float") return to_float(v, args);
    if (name == "abs") {
        bind(args, {}, what);
        if (v.is(T::Float)) return Value::of(std::fabs(v.number));
        if (v.is(T::Bool)) return Value::of(int64_t{v.boolean});
        if (!v.is(T::Int)) fail("bad operand type for abs(): '" + type_name(v) + "'");
        if (v.integer == INT64_MIN) fail("integer overflow (the subset's integers are 64-bit)");
        return Value::of(v.integer < 0 ? -v.integer : v.integer);
    }
    if (name == "list") {
        bind(args, {}, what);
        std::vector<Value> items = iterate(v);
        budget.built(8 * items.size());
        return Value::of_list(std::move(items));
    }
    if (name == "items") {
        bind(args, {}, what);
        if (v.is(T::Undefined)) return Value::of_list({});
        if (!v.is(T::Dict)) fail("Can only get item pairs from a mapping.");
        std::vector<Value> pairs;
        for (const auto& [k, item] : v.dict->items)
            pairs.push_back(Value::of_list({Value::of(k), item}));
        budget.built(16 * pairs.size());
        return Value::of_list(std::move(pairs));
    }
    if (name == "reverse") {
        bind(args, {}, what);
        if (v.is(T::String)) {
            std::u32string text = decode(v.text);
            std::reverse(text.begin(), text.end());
            return Value::of(encode(text));
        }
        std::vector<Value> items = iterate(v);
        std::reverse(items.begin(), items.end());
        return Value::of_list(std::move(items));
    }
    if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr")
        return select_items(name, v, args);
    if (name == "map") return map_items(v, args, budget);
    if (name == "indent") {
        if (v.is(T::Undefined)) fail(v.text);
        std::string out = indent(to_str(v), args, budget.limits());
        budget.built(out.size());
        return Value::of(std::move(out));
    }
    if (name == "sort") return sorted(v, args);
    fail("unknown filter '" + std::string(name) + "'");
}

}  // namespace tmx::jinja::detail

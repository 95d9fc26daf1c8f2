// The Jinja subset's tests, str and dict methods, global functions and item and attribute
// access (jinja_detail.h), each as Jinja2 3.1 and Python define them.
#include <algorithm>
#include <cmath>
#include <ctime>
#include <set>

#include "engine/infer/jinja_detail.h"

namespace tmx::jinja::detail {
namespace {

using T = Value::Type;

const std::set<std::string_view> kTests = {
    "defined",  "undefined", "none",   "boolean", "true",        "false",
    "integer",  "float",     "number", "string",  "mapping",     "iterable",
    "sequence", "callable",  "odd",    "even",    "divisibleby", "eq",
    "equalto",  "==",        "ne",     "!=",      "lt",          "lessthan",
    "<",        "le",        "<=",     "gt",      "greaterthan", ">",
    "ge",       ">=",        "in",     "sameas",  "lower",       "upper"};
const std::set<std::string_view> kStrMethods = {
    "startswith", "endswith", "strip", "lstrip",     "rstrip",  "split", "rsplit",
    "upper",      "lower",    "title", "capitalize", "replace", "join",  "find"};
const std::set<std::string_view> kDictMethods = {"items", "keys", "values", "get"};
// Python's own methods on these types, which getattr finds before any dict key: the subset
// refuses reading them as values rather than returning something else.
const std::set<std::string_view> kOtherDictMethods = {"pop",   "update",  "copy",    "setdefault",
                                                      "clear", "popitem", "fromkeys"};
const std::set<std::string_view> kListMethods = {"append",  "extend", "insert", "pop",
                                                 "remove",  "index",  "count",  "sort",
                                                 "reverse", "copy",   "clear"};
const std::set<std::string_view> kGlobals = {"range", "namespace", "dict", "raise_exception",
                                             "strftime_now"};

}  // namespace

std::string describe_object(const Value& v) {
    if (v.is(T::None)) return "'None'";
    std::string name = "'";
    name += type_name(v);
    return name + " object'";
}

std::string text_arg(const std::optional<Value>& v, const std::string& fallback) {
    return v ? to_str(*v) : fallback;
}
bool flag_arg(const std::optional<Value>& v) {
    return v && truthy(*v);
}
int64_t int_arg(const std::optional<Value>& v, int64_t fallback, const std::string& what) {
    if (!v || v->is(T::None)) return fallback;
    if (v->is(T::Int)) return v->integer;
    if (v->is(T::Bool)) return v->boolean;
    fail(what + " must be an integer, not '" + type_name(*v) + "'");
}

// The items a for loop or filter walks: a list's items, a dict's keys, a string's characters;
// Undefined walks as empty, as in Jinja.

std::vector<Value> iterate(const Value& v) {
    switch (v.type) {
        case T::Undefined:
            return {};
        case T::List:
            return v.list->items;
        case T::Dict: {
            std::vector<Value> keys;
            for (const auto& [k, item] : v.dict->items) keys.push_back(Value::of(k));
            return keys;
        }
        case T::String: {
            std::vector<Value> chars;
            for (const char32_t c : decode(v.text)) chars.push_back(Value::of(encode({&c, 1})));
            return chars;
        }
        default:
            fail("'" + type_name(v) + "' object is not iterable");
    }
}

bool is_test(std::string_view name) {
    return kTests.contains(name);
}
bool is_method(std::string_view name) {
    return kStrMethods.contains(name) || kDictMethods.contains(name);
}
bool is_global_function(std::string_view name) {
    return kGlobals.contains(name);
}

bool contains(const Value& container, const Value& item) {
    switch (container.type) {
        case T::Undefined:
            return false;
        case T::String:
            if (!item.is(T::String))
                fail("'in <string>' requires string as left operand, not " + type_name(item));
            return container.text.find(item.text) != std::string::npos;
        case T::List:
            return std::any_of(container.list->items.begin(), container.list->items.end(),
                               [&](const Value& v) { return equal(v, item); });
        case T::Dict:
            return item.is(T::String) && container.dict->find(item.text);
        default:
            fail("argument of type '" + type_name(container) + "' is not iterable");
    }
}

bool apply_test(std::string_view name, const Value& v, const Args& args) {
    const std::string what = "the test '" + std::string(name) + "'";
    const bool compares = name == "eq" || name == "equalto" || name == "==" || name == "ne" ||
                          name == "!=" || name == "lt" || name == "lessthan" || name == "<" ||
                          name == "le" || name == "<=" || name == "gt" || name == "greaterthan" ||
                          name == ">" || name == "ge" || name == ">=";
    if (compares || name == "in" || name == "sameas" || name == "divisibleby") {
        const auto a = bind(args, {"other"}, what);
        if (!a[0]) fail(what + " needs an argument");
        const Value& other = *a[0];
        if (name == "in") return contains(other, v);
        if (name == "eq" || name == "equalto" || name == "==") return equal(v, other);
        if (name == "ne" || name == "!=") return !equal(v, other);
        if (name == "lt" || name == "lessthan" || name == "<") return less(v, other, "<");
        if (name == "le" || name == "<=") return less(v, other, "<=");
        if (name == "gt" || name == "greaterthan" || name == ">") return less(v, other, ">");
        if (name == "ge" || name == ">=") return less(v, other, ">=");
        if (name == "sameas") {
            if (!(v.is(T::None) || v.is(T::Bool)) || !(other.is(T::None) || other.is(T::Bool)))
                fail("'sameas' compares none, true and false only here");
            return v.type == other.type && v.boolean == other.boolean;
        }
        const int64_t d = int_arg(other, 1, "divisibleby's argument");
        const int64_t x = int_arg(v, 0, "divisibleby's value");
        if (d == 0) fail("integer division or modulo by zero");
        return d == -1 || x % d == 0;
    }
    bind(args, {}, what);
    if (name == "defined") return !v.is(T::Undefined);
    if (name == "undefined") return v.is(T::Undefined);
    if (name == "none") return v.is(T::None);
    if (name == "boolean") return v.is(T::Bool);
    if (name == "true") return v.is(T::Bool) && v.boolean;
    if (name == "false") return v.is(T::Bool) && !v.boolean;
    if (name == "integer") return v.is(T::Int);
    if (name == "float") return v.is(T::Float);
    if (name == "number") return v.is_number();
    if (name == "string") return v.is(T::String);
    if (name == "mapping") return v.is(T::Dict);
    if (name == "iterable" || name == "sequence")
        return v.is(T::List) || v.is(T::Dict) || v.is(T::String) || v.is(T::Undefined);
    if (name == "callable") return v.is(T::Function);
    if (name == "odd" || name == "even") {
        const int64_t x = int_arg(v, 0, "the value of '" + std::string(name) + "'");
        return (x % 2 != 0) == (name == "odd");
    }
    if (name == "lower" || name == "upper")
        return ascii_cased_all(to_str(v), name == "lower", name);
    fail("unknown test '" + std::string(name) + "'");
}

Value call_method(const Value& receiver, std::string_view name, const Args& args, Budget& budget) {
    const std::string what = std::string(name) + "()";
    if (receiver.is(T::Undefined)) fail(receiver.text);
    if (receiver.is(T::String) && kStrMethods.contains(name)) {
        const std::string& s = receiver.text;
        if (name == "startswith" || name == "endswith") {
            const auto a = bind(args, {"affix"}, what);
            if (!a[0]) fail(what + " needs an argument");
            const std::vector<Value> affixes =
                a[0]->is(T::List) ? a[0]->list->items : std::vector<Value>{*a[0]};
            for (const Value& affix : affixes) {
                if (!affix.is(T::String))
                    fail(what + " takes str or a tuple of str, not " + type_name(affix));
                if (name == "startswith" ? s.starts_with(affix.text) : s.ends_with(affix.text))
                    return Value::of(true);
            }
            return Value::of(false);
        }
        if (name == "strip" || name == "lstrip" || name == "rstrip") {
            const auto a = bind(args, {"chars"}, what);
            std::optional<std::string> chars;
            if (a[0] && !a[0]->is(T::None)) {
                if (!a[0]->is(T::String)) fail(what + " takes str or None as chars");
                chars = a[0]->text;
            }
            return Value::of(py_strip(s, chars, name != "rstrip", name != "lstrip"));
        }
        if (name == "split" || name == "rsplit") {
            const auto a = bind(args, {"sep", "maxsplit"}, what);
            return py_split(s, a[0], int_arg(a[1], -1, "maxsplit"), name == "rsplit", budget);
        }
        bind(args,
             name == "replace"                  ? std::vector<std::string>{"old", "new", "count"}
             : name == "join" || name == "find" ? std::vector<std::string>{"arg"}
                                                : std::vector<std::string>{},
             what);
        if (name == "upper") return Value::of(ascii_case(s, true, "upper"));
        if (name == "lower") return Value::of(ascii_case(s, false, "lower"));
        if (name == "title") return Value::of(py_title(s));
        if (name == "capitalize") return Value::of(capitalized(s));
        if (name == "replace") {
            if (args.positional.size() < 2 || !args.positional[0].is(T::String) ||
                !args.positional[1].is(T::String))
                fail("replace() takes two strings");
            return Value::of(py_replace(
                s, args.positional[0].text, args.positional[1].text,
                args.positional.size() > 2 ? int_arg(args.positional[2], -1, "replace count") : -1,
                budget));
        }
        if (args.positional.empty()) fail(what + " needs an argument");
        const Value& arg = args.positional[0];
        if (name == "find") {
            if (!arg.is(T::String)) fail("find() takes a str, not " + type_name(arg));
            const size_t at = s.find(arg.text);
            return Value::of(at == std::string::npos
                                 ? int64_t{-1}
                                 : static_cast<int64_t>(decode(s.substr(0, at)).size()));
        }
        std::string out;  // join
        bool first = true;
        for (const Value& item : iterate(arg)) {
            if (!item.is(T::String))
                fail("sequence item: expected str instance, " + type_name(item) + " found");
            if (!first) out += s;
            first = false;
            out += item.text;
            budget.built(s.size() + item.text.size());
        }
        return Value::of(std::move(out));
    }
    if (receiver.is(T::Dict) && kDictMethods.contains(name)) {
        if (name == "get") {
            const auto a = bind(args, {"key", "default"}, what);
            if (!a[0]) fail("get() needs a key");
            const Value* found = a[0]->is(T::String) ? receiver.dict->find(a[0]->text) : nullptr;
            return found ? *found : a[1] ? *a[1] : Value::none();
        }
        bind(args, {}, what);
        std::vector<Value> out;
        for (const auto& [k, item] : receiver.dict->items)
            out.push_back(name == "keys"     ? Value::of(k)
                          : name == "values" ? item
                                             : Value::of_list({Value::of(k), item}));
        budget.built(16 * out.size());
        return Value::of_list(std::move(out));
    }
    fail(describe_object(receiver) + " has no method '" + std::string(name) + "'");
}

Value call_global(std::string_view name, const Args& args, Budget& budget) {
    if (name == "range") {
        if (!args.keyword.empty()) fail("range() takes no keyword arguments");
        const size_t n = args.positional.size();
        if (n < 1 || n > 3) fail("range() takes 1 to 3 arguments");
        std::vector<int64_t> a;
        for (const Value& v : args.positional) a.push_back(int_arg(v, 0, "range()'s argument"));
        const int64_t start = n == 1 ? 0 : a[0], stop = n == 1 ? a[0] : a[1];
        const int64_t step = n == 3 ? a[2] : 1;
        if (step == 0) fail("range() arg 3 must not be zero");
        const long double count = step > 0
                                      ? std::ceil((static_cast<long double>(stop) - start) / step)
                                      : std::ceil((static_cast<long double>(start) - stop) / -step);
        if (count > 100000) fail("range() of more than 100000 items (the sandbox's limit)");
        std::vector<Value> items;
        for (int64_t i = 0; i < static_cast<int64_t>(std::max<long double>(count, 0)); ++i)
            items.push_back(Value::of(start + i * step));
        budget.built(8 * items.size());
        return Value::of_list(std::move(items));
    }
    if (name == "namespace" || name == "dict") {
        if (args.positional.size() > 1) fail(std::string(name) + "() takes at most 1 argument");
        std::vector<std::pair<std::string, Value>> items;
        if (!args.positional.empty()) {
            const Value& from = args.positional[0];
            if (from.is(T::Dict)) {
                items = from.dict->items;
            } else {
                for (const Value& pair : iterate(from)) {
                    if (!pair.is(T::List) || pair.list->items.size() != 2 ||
                        !pair.list->items[0].is(T::String))
                        fail(std::string(name) + "() takes a dict or (str, value) pairs");
                    items.emplace_back(pair.list->items[0].text, pair.list->items[1]);
                }
            }
        }
        for (const auto& kw : args.keyword) items.push_back(kw);
        Value d = Value::of_dict(std::move(items));
        if (name == "dict") return d;
        Value ns;
        ns.type = T::Namespace;
        ns.ns = std::make_shared<DictData>(*d.dict);
        return ns;
    }
    if (name == "strftime_now") {
        const auto a = bind(args, {"format"}, "strftime_now()");
        if (!a[0] || !a[0]->is(T::String)) fail("strftime_now() takes a format string");
        if (a[0]->text.size() > 256) fail("strftime_now() format over 256 bytes");
        const std::time_t now = std::time(nullptr);
        std::tm local{};
        localtime_r(&now, &local);
        std::string out(4096, '\0');
        out.resize(std::strftime(out.data(), out.size(), a[0]->text.c_str(), &local));
        return Value::of(std::move(out));
    }
    fail("unknown function '" + std::string(name) + "'");
}

Value get_attr(const Value& object, std::string_view name) {
    switch (object.type) {
        case T::Undefined:
            fail(object.text);
        case T::Dict:
            if (const Value* v = object.dict->find(name);
                v && !kDictMethods.contains(name) && !kOtherDictMethods.contains(name))
                return *v;
            if (kDictMethods.contains(name) || kOtherDictMethods.contains(name))
                fail("'" + std::string(name) +
                     "' is a dict method here: call it, or read the "
                     "key as ['" +
                     std::string(name) + "']");
            break;
        case T::Namespace:
            if (const Value* v = object.ns->find(name)) return *v;
            break;
        case T::String:
            if (kStrMethods.contains(name))
                fail("'" + std::string(name) + "' is a str method: call it");
            break;
        case T::List:
            if (kListMethods.contains(name))
                fail("list methods such as '" + std::string(name) + "' are not supported");
            break;
        default:
            break;
    }
    return Value::undefined(describe_object(object) + " has no attribute '" + std::string(name) +
                            "'");
}

Value get_item(const Value& object, const Value& key) {
    if (object.is(T::Undefined)) fail(object.text);
    if ((object.is(T::List) || object.is(T::String)) && (key.is(T::Int) || key.is(T::Bool))) {
        const int64_t i = key.is(T::Int) ? key.integer : key.boolean;
        if (object.is(T::List)) {
            const auto n = static_cast<int64_t>(object.list->items.size());
            if (i >= -n && i < n) return object.list->items[static_cast<size_t>(i < 0 ? i + n : i)];
        } else {
            const std::u32string text = decode(object.text);
            const auto n = static_cast<int64_t>(text.size());
            if (i >= -n && i < n)
                return Value::of(encode(text.substr(static_cast<size_t>(i < 0 ? i + n : i), 1)));
        }
        return Value::undefined(describe_object(object) + " has no element " + std::to_string(i));
    }
    if (object.is(T::Dict) && key.is(T::String)) {
        if (const Value* v = object.dict->find(key.text)) return *v;
    }
    if (key.is(T::String)) return get_attr(object, key.text);
    return Value::undefined(describe_object(object) + " has no element " +
                            (key.is(T::Int) ? std::to_string(key.integer) : type_name(key)));
}

}  // namespace tmx::jinja::detail

// Inside the Jinja subset (jinja.h): values, tokens, the syntax tree, and the seams between the
// lexer (jinja_lexer.cpp), the parser (jinja_parser.h: jinja_parse.cpp, jinja_expressions.cpp),
// the values (jinja_value.cpp), Python's str operations (jinja_text.cpp), the filters
// (jinja_filters.cpp), the tests, methods and functions (jinja_builtins.cpp) and the
// interpreter (jinja_render.cpp). Not for callers.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/infer/jinja.h"

namespace tmx::jinja::detail {

// A failure inside parsing or rendering, without its place; Template adds the source and line.
struct Failure {
    std::string message;
};
[[noreturn]] void fail(std::string message);
// raise_exception(message) in a template.
struct Raised {
    std::string message;
};

struct Node;
struct Value;

// Lists and dicts are immutable once built and shared; `depth` is how deeply containers nest
// inside (1: none), bounded so that every recursion over a value is. Dicts keep insertion order
// and have string keys (what chat templates and JSON need).
struct ListData {
    std::vector<Value> items;
    int depth = 1;
};
struct DictData {
    std::vector<std::pair<std::string, Value>> items;
    int depth = 1;
    const Value* find(std::string_view key) const;
};
// A function: a global (range, namespace, ...) or a macro of the template being rendered.
struct Callable {
    std::string name;
    const Node* macro = nullptr;  // null for a global
};

struct Value {
    enum class Type { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Function };
    Type type = Type::Undefined;
    bool boolean = false;
    int64_t integer = 0;
    double number = 0;
    // The text of a String; for Undefined, why it is undefined ("'x' is undefined"), the message
    // of the error that using it raises.
    std::string text;
    std::shared_ptr<const ListData> list;
    std::shared_ptr<const DictData> dict;
    // A namespace() is the one mutable value ({% set ns.x = ... %}); it is never stored inside
    // a list, dict or namespace (make_list and friends refuse it), so values cannot form cycles.
    std::shared_ptr<DictData> ns;
    std::shared_ptr<const Callable> function;

    static Value undefined(std::string why);
    static Value none();
    static Value of(bool b);
    static Value of(int64_t i);
    static Value of(double d);
    static Value of(std::string s);
    static Value of_list(std::vector<Value> items);
    static Value of_dict(std::vector<std::pair<std::string, Value>> items);

    bool is(Type t) const { return type == t; }
    bool is_number() const {
        return type == Type::Int || type == Type::Float || type == Type::Bool;
    }
};

inline constexpr int kMaxValueDepth = 256;

// Python's truth, type name (for messages), str() and repr() of a float.
bool truthy(const Value& v);
std::string type_name(const Value& v);
std::string to_str(const Value& v);  // Undefined is ""; a list or dict is refused
std::string float_repr(double d);
// Python's ==, and <, <=, >, >= (op is one of those), failing for unorderable types.
bool equal(const Value& a, const Value& b);
bool less(const Value& a, const Value& b, std::string_view op);
// json.dumps as transformers' tojson calls it.
struct JsonStyle {
    std::optional<int64_t> indent;
    std::string item_separator = ", ", key_separator = ": ";
    bool sort_keys = false, ensure_ascii = false;
    size_t max_bytes = SIZE_MAX;  // fails past this size
};
std::string to_json(const Value& v, const JsonStyle& style);
Value from_json(const nlohmann::ordered_json& j, int depth = 1);

// Text as Python sees a str: a sequence of code points. Bytes that are not UTF-8 map to lone
// surrogates U+DC80..U+DCFF and back, so any bytes survive unchanged.
std::u32string decode(std::string_view utf8);
char32_t next_code_point(std::string_view utf8, size_t& at);  // the one at `at`; advances it
std::string encode(std::u32string_view text);
bool is_space(char32_t c);  // str.isspace()
std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left,
                     bool right);

// The work one render may do (Limits): each expression evaluated is a step; each byte of a
// string or 8 bytes per list item built counts toward max_built_bytes.
class Budget {
  public:
    explicit Budget(const Limits& limits) : limits_(limits) {}
    void step() {
        if (++steps_ > limits_.max_steps)
            fail("the template took more than " + std::to_string(limits_.max_steps) +
                 " steps (limit)");
    }
    void built(size_t bytes);
    const Limits& limits() const { return limits_; }

  private:
    const Limits& limits_;
    int64_t steps_ = 0, built_ = 0;
};

// Arguments of a call, filter or test, evaluated.
struct Args {
    std::vector<Value> positional;
    std::vector<std::pair<std::string, Value>> keyword;
};
// Binds args to parameter names as Python does (positional first, then by keyword); a missing
// one is nullopt. Fails naming `what` for too many, unknown or repeated arguments.
std::vector<std::optional<Value>> bind(const Args& args, const std::vector<std::string>& names,
                                       const std::string& what);

// Shared by the filters, tests and methods: arguments of a given kind (absent: the fallback),
// the items a for loop or filter walks (a list's items, a dict's keys, a string's characters;
// none for Undefined), and an object's name in messages ("'dict object'").
std::string text_arg(const std::optional<Value>& v, const std::string& fallback);
bool flag_arg(const std::optional<Value>& v);
int64_t int_arg(const std::optional<Value>& v, int64_t fallback, const std::string& what);
std::vector<Value> iterate(const Value& v);
std::string describe_object(const Value& v);

// Python's str operations (jinja_text.cpp). Case mapping covers ASCII; other text fails.
void require_ascii(const std::string& s, std::string_view what);
std::string ascii_case(std::string s, bool upper, std::string_view what);
std::string capitalized(std::string s);
std::string py_title(std::string s);                                            // str.title()
std::string jinja_title(const std::string& s);                                  // the title filter
bool ascii_cased_all(const std::string& s, bool lower, std::string_view what);  // islower()
std::string py_replace(const std::string& s, const std::string& old, const std::string& with,
                       int64_t count, Budget& budget);
Value py_split(const std::string& s, const std::optional<Value>& sep, int64_t maxsplit,
               bool from_right, Budget& budget);
std::vector<std::u32string> split_lines(const std::u32string& text);  // str.splitlines()

bool is_filter(std::string_view name);
bool is_test(std::string_view name);
bool is_method(std::string_view name);
bool is_global_function(std::string_view name);
Value apply_filter(std::string_view name, const Value& operand, const Args& args, Budget& budget);
bool apply_test(std::string_view name, const Value& operand, const Args& args);
Value call_method(const Value& receiver, std::string_view name, const Args& args, Budget& budget);
Value call_global(std::string_view name, const Args& args, Budget& budget);
// Python's `item in container` (a substring, a list item, a dict key; nothing in Undefined).
bool contains(const Value& container, const Value& item);
// An item or attribute as Jinja's getattr/getitem find it: a missing one is Undefined, and
// using Undefined's fails with its message.
Value get_attr(const Value& object, std::string_view name);
Value get_item(const Value& object, const Value& key);

// --- Tokens and the syntax tree ---

enum class Tok {
    Text,
    VarBegin,
    VarEnd,
    BlockBegin,
    BlockEnd,
    Name,
    String,
    Integer,
    Float,
    Operator,
    Eof
};

struct Token {
    Tok kind;
    std::string value;
    int line;
};
[[noreturn]] void fail_at(int line, const std::string& what);  // "line N: WHAT"
std::vector<Token> lex(std::string_view text);                 // jinja_lexer.cpp

struct Expr {
    enum class Kind {
        Literal,
        Name,
        List,        // args: the items
        Dict,        // args: key, value, key, value, ...
        Attr,        // args[0].name
        Item,        // args[0][args[1]]
        Slice,       // args[0][args[1]:args[2]:args[3]], each bound may be null
        Call,        // name(args, kwargs): a global function or a macro
        MethodCall,  // args[0].name(args[1..], kwargs)
        Filter,      // args[0] | name(args[1..], kwargs)
        Test,        // args[0] is [not] name(args[1..], kwargs)
        Unary,       // name: "-", "+" or "not"
        Binary,      // name: "+", "-", "*", "/", "//", "%", "**", "~", "and", "or", "in", "not in"
        Compare,     // args[0] ops[0] args[1] ops[1] args[2] ... (chained as Python)
        Cond,        // args[1] if args[0] else args[2] (args[2] null: undefined)
    };
    Kind kind;
    int line = 0;
    int depth = 1;  // nodes on the longest path down, bounded by Limits::max_nesting
    Value literal;
    std::string name;
    std::vector<std::unique_ptr<Expr>> args;
    std::vector<std::pair<std::string, std::unique_ptr<Expr>>> kwargs;
    std::vector<std::string> ops;
    bool negated = false;
};
using ExprPtr = std::unique_ptr<Expr>;

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;

struct Node {
    enum class Kind {
        Text,      // text
        Output,    // {{ expr }}
        If,        // conds[i] -> bodies[i]; bodies[conds.size()] if present is the else
        For,       // for targets in expr [if filter]: bodies[0], else bodies[1]
        Set,       // set targets = expr
        SetAttr,   // set targets[0].attr = expr (a namespace)
        SetBlock,  // set targets[0] %} bodies[0] {% endset
        Macro,     // macro text(params = defaults) bodies[0]
        Break,
        Continue,
        Generation,  // {% generation %} bodies[0] {% endgeneration %}: transformers' marker
    };
    Kind kind;
    int line = 0;
    std::string text;
    std::vector<std::string> targets;
    std::string attr;
    ExprPtr expr, filter;
    std::vector<ExprPtr> conds;
    std::vector<Body> bodies;
    std::vector<std::string> params;
    std::vector<ExprPtr> defaults;  // one per param, null where none
};

}  // namespace tmx::jinja::detail

namespace tmx::jinja {

struct Template::Impl {
    std::string source;
    Limits limits;
    detail::Body body;
};

namespace detail {
// The parser's product: the template's body (jinja_parse.cpp).
Body parse_template(std::string_view text, const Limits& limits);
// Renders a parsed template (jinja_render.cpp).
std::string render_template(const Template::Impl& t, const nlohmann::ordered_json& vars);
}  // namespace detail

}  // namespace tmx::jinja

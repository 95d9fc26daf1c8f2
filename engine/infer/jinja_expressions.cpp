// The Jinja subset's expressions (jinja_parser.h): Jinja2's grammar and operator precedence
// (if-else, or, and, not, comparisons, + -, ~, * / // %, **, unary - +, then . [] () and
// filters and tests). Filters, tests, functions and methods the subset lacks are refused here
// by name.
#include <algorithm>
#include <cstdlib>

#include "engine/infer/jinja_parser.h"

namespace tmx::jinja::detail {

// Recursion of the parser itself: parentheses, brackets and unary operators nest.
struct ExpressionParser::Nest {
    ExpressionParser& p;
    explicit Nest(ExpressionParser& parser) : p(parser) {
        if (++p.nest_ > p.limits_.max_nesting)
            fail_at(p.peek().line, "an expression nested more than " +
                                       std::to_string(p.limits_.max_nesting) + " deep (limit)");
    }
    ~Nest() { --p.nest_; }
};

ExprPtr ExpressionParser::make(Expr::Kind kind, int line, std::vector<ExprPtr> args,
                               std::string name) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    e->name = std::move(name);
    e->args = std::move(args);
    return finish(std::move(e));
}

ExprPtr ExpressionParser::finish(ExprPtr e) {
    for (const ExprPtr& a : e->args)
        if (a) e->depth = std::max(e->depth, a->depth + 1);
    for (const auto& [k, v] : e->kwargs) e->depth = std::max(e->depth, v->depth + 1);
    if (e->depth > limits_.max_nesting)
        fail_at(e->line, "an expression nested more than " + std::to_string(limits_.max_nesting) +
                             " deep (limit)");
    return e;
}
// `a` or `a, b, ...` (a tuple, a list value here).
ExprPtr ExpressionParser::parse_tuple(bool with_condexpr) {
    const int line = peek().line;
    ExprPtr first = parse_expression(with_condexpr);
    if (!is_op(",")) return first;
    std::vector<ExprPtr> items;
    items.push_back(std::move(first));
    while (is_op(",")) {
        next();
        if (ends_tuple()) break;
        items.push_back(parse_expression(with_condexpr));
    }
    return make(Expr::Kind::List, line, std::move(items));
}

bool ExpressionParser::ends_tuple() const {
    const Token& t = peek();
    return t.kind == Tok::VarEnd || t.kind == Tok::BlockEnd || t.kind == Tok::Eof || is_op(")") ||
           is_op("]") || is_name("if") || is_name("in");
}

ExprPtr ExpressionParser::parse_expression(bool with_condexpr) {
    ExprPtr e = parse_or();
    if (!with_condexpr) return e;
    while (is_name("if")) {
        const int line = next().line;
        ExprPtr cond = parse_or();
        ExprPtr otherwise;
        if (is_name("else")) {
            next();
            otherwise = parse_expression(true);
        }
        std::vector<ExprPtr> args;
        args.push_back(std::move(cond));
        args.push_back(std::move(e));
        args.push_back(std::move(otherwise));
        e = make(Expr::Kind::Cond, line, std::move(args));
    }
    return e;
}

ExprPtr ExpressionParser::binary(const char* op, ExprPtr left, ExprPtr right, int line) {
    std::vector<ExprPtr> args;
    args.push_back(std::move(left));
    args.push_back(std::move(right));
    return make(Expr::Kind::Binary, line, std::move(args), op);
}

ExprPtr ExpressionParser::parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
        const int line = next().line;
        e = binary("or", std::move(e), parse_and(), line);
    }
    return e;
}

ExprPtr ExpressionParser::parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
        const int line = next().line;
        e = binary("and", std::move(e), parse_not(), line);
    }
    return e;
}

ExprPtr ExpressionParser::parse_not() {
    if (!is_name("not")) return parse_compare();
    const Nest nest(*this);
    const int line = next().line;
    std::vector<ExprPtr> args;
    args.push_back(parse_not());
    return make(Expr::Kind::Unary, line, std::move(args), "not");
}

ExprPtr ExpressionParser::parse_compare() {
    const int line = peek().line;
    ExprPtr first = parse_math1();
    std::vector<ExprPtr> args;
    std::vector<std::string> ops;
    while (true) {
        const Token& t = peek();
        if (t.kind == Tok::Operator && (t.value == "==" || t.value == "!=" || t.value == "<" ||
                                        t.value == "<=" || t.value == ">" || t.value == ">=")) {
            ops.push_back(next().value);
        } else if (is_name("in")) {
            next();
            ops.push_back("in");
        } else if (is_name("not") && is_name("in", 1)) {
            next(), next();
            ops.push_back("not in");
        } else {
            break;
        }
        args.push_back(parse_math1());
    }
    if (ops.empty()) return first;
    args.insert(args.begin(), std::move(first));
    ExprPtr e = make(Expr::Kind::Compare, line, std::move(args));
    e->ops = std::move(ops);
    return e;
}

ExprPtr ExpressionParser::parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
        const Token& op = next();
        e = binary(op.value == "+" ? "+" : "-", std::move(e), parse_concat(), op.line);
    }
    return e;
}

ExprPtr ExpressionParser::parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
        const int line = next().line;
        e = binary("~", std::move(e), parse_math2(), line);
    }
    return e;
}

ExprPtr ExpressionParser::parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
        const Token& op = next();
        const std::string name = op.value;
        e = binary(name == "*"    ? "*"
                   : name == "/"  ? "/"
                   : name == "//" ? "//"
                                  : "%",
                   std::move(e), parse_pow(), op.line);
    }
    return e;
}

ExprPtr ExpressionParser::parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
        const int line = next().line;
        e = binary("**", std::move(e), parse_unary(true), line);
    }
    return e;
}

ExprPtr ExpressionParser::parse_unary(bool with_filter) {
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
        const Nest nest(*this);
        const Token& op = next();
        std::vector<ExprPtr> args;
        args.push_back(parse_unary(false));
        e = make(Expr::Kind::Unary, op.line, std::move(args), op.value == "-" ? "-" : "+");
    } else {
        e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    return with_filter ? parse_filters(std::move(e)) : std::move(e);
}

ExprPtr ExpressionParser::parse_primary() {
    const Token& t = peek();
    const int line = t.line;
    auto literal = [&](Value v) {
        auto e = std::make_unique<Expr>();
        e->kind = Expr::Kind::Literal;
        e->line = line;
        e->literal = std::move(v);
        return e;
    };
    switch (t.kind) {
        case Tok::Name: {
            const std::string name = next().value;
            if (name == "true" || name == "True") return literal(Value::of(true));
            if (name == "false" || name == "False") return literal(Value::of(false));
            if (name == "none" || name == "None") return literal(Value::none());
            if (macro_depth_ > 0 && (name == "varargs" || name == "kwargs" || name == "caller"))
                fail_at(line, "'" + name + "' in a macro is not supported");
            auto e = make(Expr::Kind::Name, line, {}, name);
            return e;
        }
        case Tok::String: {
            std::string s = next().value;
            while (peek().kind == Tok::String) s += next().value;  // adjacent: joined
            return literal(Value::of(std::move(s)));
        }
        case Tok::Integer: {
            const std::string digits = next().value;
            int64_t v = 0;
            for (const char c : digits) {
                if (v > (INT64_MAX - (c - '0')) / 10)
                    fail_at(line, "the integer " + digits + " is too large");
                v = v * 10 + (c - '0');
            }
            return literal(Value::of(v));
        }
        case Tok::Float: {
            const std::string text = next().value;
            return literal(Value::of(std::strtod(text.c_str(), nullptr)));
        }
        case Tok::Operator:
            if (t.value == "(") {
                const Nest nest(*this);
                next();
                if (is_op(")")) {
                    next();
                    return make(Expr::Kind::List, line, {});
                }
                ExprPtr e = parse_tuple(true);
                expect_op(")");
                return e;
            }
            if (t.value == "[" || t.value == "{") {
                const Nest nest(*this);
                const bool dict = t.value == "{";
                next();
                std::vector<ExprPtr> items;
                while (!is_op(dict ? "}" : "]")) {
                    items.push_back(parse_expression(true));
                    if (dict) {
                        expect_op(":");
                        items.push_back(parse_expression(true));
                    }
                    if (!is_op(",")) break;
                    next();
                }
                expect_op(dict ? "}" : "]");
                return make(dict ? Expr::Kind::Dict : Expr::Kind::List, line, std::move(items));
            }
            break;
        default:
            break;
    }
    fail_at(line, "unexpected " + describe(t));
}

ExprPtr ExpressionParser::parse_postfix(ExprPtr e) {
    while (true) {
        if (is_op(".") || is_op("[")) {
            e = parse_subscript(std::move(e));
        } else if (is_op("(")) {
            e = parse_call(std::move(e));
        } else {
            return e;
        }
    }
}

ExprPtr ExpressionParser::parse_subscript(ExprPtr object) {
    const Token& op = next();
    const int line = op.line;
    std::vector<ExprPtr> args;
    args.push_back(std::move(object));
    if (op.value == ".") {
        if (peek().kind == Tok::Integer) {
            args.push_back(parse_primary());
            return make(Expr::Kind::Item, line, std::move(args));
        }
        return make(Expr::Kind::Attr, line, std::move(args), expect_name("an attribute name"));
    }
    // [index] or [start:stop:step], any bound left out.
    std::vector<ExprPtr> bounds;
    bool slice = false;
    bounds.push_back(is_op(":") ? nullptr : parse_expression(true));
    while (is_op(":") && bounds.size() < 3) {
        next();
        slice = true;
        bounds.push_back(is_op(":") || is_op("]") ? nullptr : parse_expression(true));
    }
    if (is_op(",")) fail_at(line, "tuple subscripts are not supported");
    expect_op("]");
    if (!slice) {
        args.push_back(std::move(bounds[0]));
        return make(Expr::Kind::Item, line, std::move(args));
    }
    bounds.resize(3);
    for (ExprPtr& b : bounds) args.push_back(std::move(b));
    return make(Expr::Kind::Slice, line, std::move(args));
}

// (args, name=kwargs) after a callee, filter or test.
void ExpressionParser::parse_call_args(Expr& e) {
    expect_op("(");
    while (!is_op(")")) {
        if (is_op("*") || is_op("**"))
            fail_at(peek().line, "argument unpacking with * and ** is not supported");
        if (peek().kind == Tok::Name && is_op("=", 1)) {
            const std::string key = next().value;
            next();
            for (const auto& [k, v] : e.kwargs)
                if (k == key) fail_at(peek().line, "the argument '" + key + "' appears twice");
            e.kwargs.emplace_back(key, parse_expression(true));
        } else {
            if (!e.kwargs.empty())
                fail_at(peek().line, "a positional argument follows a keyword argument");
            e.args.push_back(parse_expression(true));
        }
        if (!is_op(",")) break;
        next();
    }
    expect_op(")");
}

ExprPtr ExpressionParser::parse_call(ExprPtr callee) {
    const int line = peek().line;
    auto e = std::make_unique<Expr>();
    e->line = line;
    if (callee->kind == Expr::Kind::Name) {
        e->kind = Expr::Kind::Call;
        e->name = callee->name;
        if (!is_global_function(e->name)) called_names_.emplace_back(e->name, line);
    } else if (callee->kind == Expr::Kind::Attr) {
        e->kind = Expr::Kind::MethodCall;
        e->name = callee->name;
        if (!is_method(e->name)) fail_at(line, "unknown method '" + e->name + "'");
        e->args.push_back(std::move(callee->args[0]));
    } else {
        fail_at(line, "only functions, macros and methods can be called");
    }
    parse_call_args(*e);
    return finish(std::move(e));
}

ExprPtr ExpressionParser::parse_filters(ExprPtr e) {
    while (true) {
        if (is_op("|")) {
            const int line = next().line;
            e = parse_named(Expr::Kind::Filter, std::move(e), line);
        } else if (is_name("is")) {
            const int line = next().line;
            bool negated = false;
            if (is_name("not")) {
                next();
                negated = true;
            }
            e = parse_named(Expr::Kind::Test, std::move(e), line);
            e->negated = negated;
        } else if (is_op("(")) {
            e = parse_call(std::move(e));
        } else {
            return e;
        }
    }
}
// A filter or test by name, with its arguments: in parentheses, or for a test one bare
// argument (`is divisibleby 3`, `is sameas none`).
ExprPtr ExpressionParser::parse_named(Expr::Kind kind, ExprPtr operand, int line) {
    const bool filter = kind == Expr::Kind::Filter;
    std::string name = expect_name(filter ? "a filter name" : "a test name");
    while (is_op(".")) {
        next();
        name += '.';
        name += expect_name("a name");
    }
    if (filter ? !is_filter(name) : !is_test(name))
        fail_at(line, std::string("unknown ") + (filter ? "filter '" : "test '") + name + "'");
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    e->name = name;
    e->args.push_back(std::move(operand));
    const Tok k = peek().kind;
    if (is_op("(")) {
        parse_call_args(*e);
    } else if (!filter && !is_name("else") && !is_name("or") && !is_name("and") && !is_name("is") &&
               (k == Tok::Name || k == Tok::String || k == Tok::Integer || k == Tok::Float ||
                is_op("[") || is_op("{"))) {
        e->args.push_back(parse_postfix(parse_primary()));
    }
    check_named_argument(*e);
    return finish(std::move(e));
}
// map('trim'), select('odd'), selectattr('role', 'equalto', ...): a filter or test named
// by a literal is checked here like one written directly.
void ExpressionParser::check_named_argument(const Expr& e) {
    if (e.kind != Expr::Kind::Filter) return;
    size_t at = 0;
    bool names_filter = false;
    if (e.name == "map") {
        at = 1, names_filter = true;
    } else if (e.name == "select" || e.name == "reject") {
        at = 1;
    } else if (e.name == "selectattr" || e.name == "rejectattr") {
        at = 2;
    } else {
        return;
    }
    if (at >= e.args.size() || e.args[at]->kind != Expr::Kind::Literal ||
        !e.args[at]->literal.is(Value::Type::String))
        return;
    const std::string& name = e.args[at]->literal.text;
    if (names_filter ? !is_filter(name) : !is_test(name))
        fail_at(e.line,
                std::string("unknown ") + (names_filter ? "filter '" : "test '") + name + "'");
}

}  // namespace tmx::jinja::detail

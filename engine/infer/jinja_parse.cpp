// The Jinja subset's parser (jinja.h): Jinja2's grammar and operator precedence over the
// lexer's tokens (jinja_lexer.cpp). Every tag, filter, test, function and method the subset
// lacks is refused here by name.
#include <algorithm>
#include <set>

#include "engine/infer/jinja_detail.h"

namespace tmx::jinja::detail {
namespace {

// Tags of Jinja2 that the subset does not have: refused by name rather than as unknown.
const std::set<std::string_view> kUnsupportedTags = {
    "raw",  "include", "import", "from",  "extends",    "block", "call",
    "with", "filter",  "do",     "trans", "autoescape", "print"};

class Parser {
  public:
    Parser(std::vector<Token> tokens, const Limits& limits)
        : tokens_(std::move(tokens)), limits_(limits) {}

    Body run() {
        Body body = parse_body({});
        if (peek().kind != Tok::Eof) {
            next();  // the block's begin
            fail_at(peek().line, "unexpected '" + peek().value + "'");
        }
        for (const auto& [name, line] : called_names_)
            if (!macros_.contains(name)) fail_at(line, "unknown function '" + name + "'");
        return body;
    }

  private:
    const Token& peek(size_t ahead = 0) const {
        return tokens_[std::min(at_ + ahead, tokens_.size() - 1)];
    }
    const Token& next() {
        const Token& t = peek();
        if (at_ < tokens_.size() - 1) ++at_;
        return t;
    }
    bool is_op(const char* op, size_t ahead = 0) const {
        return peek(ahead).kind == Tok::Operator && peek(ahead).value == op;
    }
    bool is_name(const char* name, size_t ahead = 0) const {
        return peek(ahead).kind == Tok::Name && peek(ahead).value == name;
    }
    static std::string describe(const Token& t) {
        switch (t.kind) {
            case Tok::Eof:
                return "end of template";
            case Tok::Text:
                return "text";
            case Tok::VarEnd:
                return "'}}'";
            case Tok::BlockEnd:
                return "'%}'";
            case Tok::VarBegin:
                return "'{{'";
            case Tok::BlockBegin:
                return "'{%'";
            case Tok::String:
                return "a string";
            default:
                return "'" + t.value + "'";
        }
    }
    void expect_op(const char* op) {
        if (!is_op(op))
            fail_at(peek().line, std::string("expected '") + op + "', got " + describe(peek()));
        next();
    }
    void expect_block_end() {
        if (peek().kind != Tok::BlockEnd)
            fail_at(peek().line, "expected '%}', got " + describe(peek()));
        next();
    }
    std::string expect_name(const char* what) {
        if (peek().kind != Tok::Name)
            fail_at(peek().line, std::string("expected ") + what + ", got " + describe(peek()));
        return next().value;
    }

    // --- Statements ---

    // Nodes up to a block tag named in `stop` (left unread) or the end of the template.
    Body parse_body(const std::set<std::string_view>& stop) {
        if (++block_depth_ > limits_.max_nesting)
            fail_at(peek().line, "blocks nested more than " + std::to_string(limits_.max_nesting) +
                                     " deep (limit)");
        Body body;
        while (true) {
            const Token& t = peek();
            if (t.kind == Tok::Eof) break;
            if (t.kind == Tok::Text) {
                if (body.empty() || body.back()->kind != Node::Kind::Text)
                    body.push_back(std::make_unique<Node>(Node{Node::Kind::Text, t.line}));
                body.back()->text += next().value;
            } else if (t.kind == Tok::VarBegin) {
                next();
                auto n = std::make_unique<Node>(Node{Node::Kind::Output, t.line});
                n->expr = parse_tuple(true);
                if (peek().kind != Tok::VarEnd)
                    fail_at(peek().line, "expected '}}', got " + describe(peek()));
                next();
                body.push_back(std::move(n));
            } else if (t.kind == Tok::BlockBegin) {
                if (peek(1).kind == Tok::Name && stop.contains(peek(1).value)) break;
                next();
                body.push_back(parse_statement());
            } else {
                fail_at(t.line, "unexpected " + describe(t));
            }
        }
        --block_depth_;
        return body;
    }
    // After parse_body stopped: reads `{% NAME` (one of its stop names) and returns NAME.
    std::string end_of_body(const char* opened, int line) {
        if (peek().kind != Tok::BlockBegin)
            fail_at(line, std::string("'") + opened + "' is not closed");
        next();
        return next().value;
    }

    std::unique_ptr<Node> parse_statement() {
        const int line = peek().line;
        const std::string tag = expect_name("a tag name");
        auto n = std::make_unique<Node>(Node{Node::Kind::Text, line});
        if (tag == "if") {
            n->kind = Node::Kind::If;
            n->conds.push_back(parse_tuple(true));
            expect_block_end();
            while (true) {
                n->bodies.push_back(parse_body({"elif", "else", "endif"}));
                const std::string end = end_of_body("if", line);
                if (end == "elif") {
                    n->conds.push_back(parse_tuple(true));
                    expect_block_end();
                    continue;
                }
                expect_block_end();
                if (end == "endif") break;
                n->bodies.push_back(parse_body({"endif"}));
                end_of_body("if", line);
                expect_block_end();
                break;
            }
        } else if (tag == "for") {
            n->kind = Node::Kind::For;
            n->targets = parse_targets();
            if (!is_name("in")) fail_at(peek().line, "expected 'in', got " + describe(peek()));
            next();
            n->expr = parse_tuple(false);
            if (is_name("if")) {
                next();
                n->filter = parse_expression(true);
            }
            if (is_name("recursive")) fail_at(peek().line, "recursive loops are not supported");
            expect_block_end();
            ++loop_depth_;
            n->bodies.push_back(parse_body({"else", "endfor"}));
            --loop_depth_;
            if (end_of_body("for", line) == "else") {
                expect_block_end();
                n->bodies.push_back(parse_body({"endfor"}));
                end_of_body("for", line);
            }
            expect_block_end();
        } else if (tag == "set") {
            parse_set(*n);
        } else if (tag == "macro") {
            parse_macro(*n);
        } else if (tag == "break" || tag == "continue") {
            if (loop_depth_ == 0) fail_at(line, "'" + tag + "' outside a loop");
            n->kind = tag == "break" ? Node::Kind::Break : Node::Kind::Continue;
            expect_block_end();
        } else if (tag == "generation") {
            n->kind = Node::Kind::Generation;
            expect_block_end();
            n->bodies.push_back(parse_body({"endgeneration"}));
            end_of_body("generation", line);
            expect_block_end();
        } else if (kUnsupportedTags.contains(tag)) {
            fail_at(line, "the tag '" + tag + "' is not supported");
        } else if (tag == "elif" || tag == "else" || tag.starts_with("end")) {
            fail_at(line, "unexpected '" + tag + "'");
        } else {
            fail_at(line, "unknown tag '" + tag + "'");
        }
        return n;
    }

    // `a` or `a, b` or `(a, b)`: names to bind.
    std::vector<std::string> parse_targets() {
        const bool parens = is_op("(");
        if (parens) next();
        std::vector<std::string> names = {expect_name("a variable name")};
        while (is_op(",")) {
            next();
            if (peek().kind != Tok::Name || is_name("in")) break;
            names.push_back(next().value);
        }
        if (parens) expect_op(")");
        for (const std::string& name : names) check_assignable(name);
        return names;
    }
    void check_assignable(const std::string& name) {
        static const std::set<std::string_view> kConstants = {"true",  "false", "none", "True",
                                                              "False", "None",  "loop"};
        if (kConstants.contains(name)) fail_at(peek().line, "cannot assign to '" + name + "'");
    }

    void parse_set(Node& n) {
        const int line = n.line;
        if (peek().kind == Tok::Name && is_op(".", 1)) {
            n.kind = Node::Kind::SetAttr;
            n.targets = {next().value};
            next();
            n.attr = expect_name("an attribute name");
            expect_op("=");
            n.expr = parse_tuple(true);
            expect_block_end();
            return;
        }
        n.targets = parse_targets();
        if (is_op("=")) {
            next();
            n.kind = Node::Kind::Set;
            n.expr = parse_tuple(true);
            expect_block_end();
            return;
        }
        if (is_op("|")) fail_at(line, "filters on a {% set %} block are not supported");
        if (n.targets.size() != 1) fail_at(line, "a {% set %} block assigns one name");
        n.kind = Node::Kind::SetBlock;
        expect_block_end();
        n.bodies.push_back(parse_body({"endset"}));
        end_of_body("set", line);
        expect_block_end();
    }

    void parse_macro(Node& n) {
        n.kind = Node::Kind::Macro;
        n.text = expect_name("a macro name");
        check_assignable(n.text);
        expect_op("(");
        while (!is_op(")")) {
            const std::string param = expect_name("a parameter name");
            if (param == "varargs" || param == "kwargs" || param == "caller")
                fail_at(peek().line, "the macro parameter '" + param + "' is not supported");
            if (std::find(n.params.begin(), n.params.end(), param) != n.params.end())
                fail_at(peek().line, "the parameter '" + param + "' appears twice");
            n.params.push_back(param);
            ExprPtr default_value;
            if (is_op("=")) {
                next();
                default_value = parse_expression(true);
            } else if (!n.defaults.empty() && n.defaults.back()) {
                fail_at(peek().line, "a parameter without a default follows one with a default");
            }
            n.defaults.push_back(std::move(default_value));
            if (!is_op(",")) break;
            next();
        }
        expect_op(")");
        expect_block_end();
        macros_.insert(n.text);
        const int saved_loops = loop_depth_;
        loop_depth_ = 0;
        ++macro_depth_;
        n.bodies.push_back(parse_body({"endmacro"}));
        --macro_depth_;
        loop_depth_ = saved_loops;
        end_of_body("macro", n.line);
        expect_block_end();
    }

    // --- Expressions, by Jinja2's precedence: if-else, or, and, not, comparisons, + -, ~,
    // * / // %, **, unary - +, then postfix (. [] ()) and filters and tests. ---

    ExprPtr make(Expr::Kind kind, int line, std::vector<ExprPtr> args, std::string name = "") {
        auto e = std::make_unique<Expr>();
        e->kind = kind;
        e->line = line;
        e->name = std::move(name);
        e->args = std::move(args);
        return finish(std::move(e));
    }
    ExprPtr finish(ExprPtr e) {
        for (const ExprPtr& a : e->args)
            if (a) e->depth = std::max(e->depth, a->depth + 1);
        for (const auto& [k, v] : e->kwargs) e->depth = std::max(e->depth, v->depth + 1);
        if (e->depth > limits_.max_nesting)
            fail_at(e->line, "an expression nested more than " +
                                 std::to_string(limits_.max_nesting) + " deep (limit)");
        return e;
    }
    // Recursion of the parser itself: parentheses, brackets and unary operators nest.
    struct Nest {
        Parser& p;
        explicit Nest(Parser& parser) : p(parser) {
            if (++p.nest_ > p.limits_.max_nesting)
                fail_at(p.peek().line, "an expression nested more than " +
                                           std::to_string(p.limits_.max_nesting) + " deep (limit)");
        }
        ~Nest() { --p.nest_; }
    };

    // `a` or `a, b, ...` (a tuple, a list value here).
    ExprPtr parse_tuple(bool with_condexpr) {
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
    bool ends_tuple() const {
        const Token& t = peek();
        return t.kind == Tok::VarEnd || t.kind == Tok::BlockEnd || t.kind == Tok::Eof ||
               is_op(")") || is_op("]") || is_name("if") || is_name("in");
    }

    ExprPtr parse_expression(bool with_condexpr) {
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
    ExprPtr binary(const char* op, ExprPtr left, ExprPtr right, int line) {
        std::vector<ExprPtr> args;
        args.push_back(std::move(left));
        args.push_back(std::move(right));
        return make(Expr::Kind::Binary, line, std::move(args), op);
    }
    ExprPtr parse_or() {
        ExprPtr e = parse_and();
        while (is_name("or")) {
            const int line = next().line;
            e = binary("or", std::move(e), parse_and(), line);
        }
        return e;
    }
    ExprPtr parse_and() {
        ExprPtr e = parse_not();
        while (is_name("and")) {
            const int line = next().line;
            e = binary("and", std::move(e), parse_not(), line);
        }
        return e;
    }
    ExprPtr parse_not() {
        if (!is_name("not")) return parse_compare();
        const Nest nest(*this);
        const int line = next().line;
        std::vector<ExprPtr> args;
        args.push_back(parse_not());
        return make(Expr::Kind::Unary, line, std::move(args), "not");
    }
    ExprPtr parse_compare() {
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
    ExprPtr parse_math1() {
        ExprPtr e = parse_concat();
        while (is_op("+") || is_op("-")) {
            const Token& op = next();
            e = binary(op.value == "+" ? "+" : "-", std::move(e), parse_concat(), op.line);
        }
        return e;
    }
    ExprPtr parse_concat() {
        ExprPtr e = parse_math2();
        while (is_op("~")) {
            const int line = next().line;
            e = binary("~", std::move(e), parse_math2(), line);
        }
        return e;
    }
    ExprPtr parse_math2() {
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
    ExprPtr parse_pow() {
        ExprPtr e = parse_unary(true);
        while (is_op("**")) {
            const int line = next().line;
            e = binary("**", std::move(e), parse_unary(true), line);
        }
        return e;
    }
    ExprPtr parse_unary(bool with_filter) {
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

    ExprPtr parse_primary() {
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

    ExprPtr parse_postfix(ExprPtr e) {
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
    ExprPtr parse_subscript(ExprPtr object) {
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
    void parse_call_args(Expr& e) {
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
    ExprPtr parse_call(ExprPtr callee) {
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

    ExprPtr parse_filters(ExprPtr e) {
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
    ExprPtr parse_named(Expr::Kind kind, ExprPtr operand, int line) {
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
        } else if (!filter && !is_name("else") && !is_name("or") && !is_name("and") &&
                   !is_name("is") &&
                   (k == Tok::Name || k == Tok::String || k == Tok::Integer || k == Tok::Float ||
                    is_op("[") || is_op("{"))) {
            e->args.push_back(parse_postfix(parse_primary()));
        }
        check_named_argument(*e);
        return finish(std::move(e));
    }
    // map('trim'), select('odd'), selectattr('role', 'equalto', ...): a filter or test named
    // by a literal is checked here like one written directly.
    void check_named_argument(const Expr& e) {
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

    std::vector<Token> tokens_;
    size_t at_ = 0;
    const Limits& limits_;
    int block_depth_ = 0, nest_ = 0, loop_depth_ = 0, macro_depth_ = 0;
    std::set<std::string> macros_;
    std::vector<std::pair<std::string, int>> called_names_;
};

}  // namespace

Body parse_template(std::string_view text, const Limits& limits) {
    if (text.size() > limits.max_template_bytes)
        fail("the template is " + std::to_string(text.size()) + " bytes, over the limit of " +
             std::to_string(limits.max_template_bytes));
    return Parser(lex(text), limits).run();
}

}  // namespace tmx::jinja::detail

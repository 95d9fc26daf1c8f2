// The Jinja subset's statements (jinja_parser.h): the template's text, output and tags over the
// lexer's tokens (jinja_lexer.cpp), expressions by jinja_expressions.cpp. Tags the subset lacks
// are refused here by name, and so are calls of functions that are neither global nor macros
// of the template.
#include <algorithm>
#include <set>

#include "engine/infer/jinja_parser.h"

namespace tmx::jinja::detail {
namespace {

// Tags of Jinja2 that the subset does not have: refused by name rather than as unknown.
const std::set<std::string_view> kUnsupportedTags = {
    "raw",  "include", "import", "from",  "extends",    "block", "call",
    "with", "filter",  "do",     "trans", "autoescape", "print"};

class Parser : ExpressionParser {
  public:
    using ExpressionParser::ExpressionParser;

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

    int block_depth_ = 0, loop_depth_ = 0;
    std::set<std::string> macros_;
};

}  // namespace

Body parse_template(std::string_view text, const Limits& limits) {
    if (text.size() > limits.max_template_bytes)
        fail("the template is " + std::to_string(text.size()) + " bytes, over the limit of " +
             std::to_string(limits.max_template_bytes));
    return Parser(lex(text), limits).run();
}

}  // namespace tmx::jinja::detail

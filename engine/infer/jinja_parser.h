// The Jinja subset's parser, inside (jinja.h): the token cursor and the expression grammar
// (jinja_expressions.cpp), under the statement parser (jinja_parse.cpp). Not for callers.
#pragma once

#include <algorithm>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "engine/infer/jinja_detail.h"

namespace tmx::jinja::detail {

class ExpressionParser {
  public:
    ExpressionParser(std::vector<Token> tokens, const Limits& limits)
        : tokens_(std::move(tokens)), limits_(limits) {}

  protected:
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

    // `a` or `a, b, ...` (a tuple, a list value here), and one expression; with_condexpr
    // false leaves a trailing `if` unread (a for loop's filter).
    ExprPtr parse_tuple(bool with_condexpr);
    ExprPtr parse_expression(bool with_condexpr);

    std::vector<Token> tokens_;
    size_t at_ = 0;
    const Limits& limits_;
    int macro_depth_ = 0;  // inside a macro's body, where varargs, kwargs and caller are refused
    // Names called that are not global functions, with their lines: macros, which the
    // statement parser checks once it has seen them all.
    std::vector<std::pair<std::string, int>> called_names_;

  private:
    struct Nest;
    ExprPtr make(Expr::Kind kind, int line, std::vector<ExprPtr> args, std::string name = "");
    ExprPtr finish(ExprPtr e);
    bool ends_tuple() const;
    ExprPtr binary(const char* op, ExprPtr left, ExprPtr right, int line);
    ExprPtr parse_or();
    ExprPtr parse_and();
    ExprPtr parse_not();
    ExprPtr parse_compare();
    ExprPtr parse_math1();
    ExprPtr parse_concat();
    ExprPtr parse_math2();
    ExprPtr parse_pow();
    ExprPtr parse_unary(bool with_filter);
    ExprPtr parse_primary();
    ExprPtr parse_postfix(ExprPtr e);
    ExprPtr parse_subscript(ExprPtr object);
    void parse_call_args(Expr& e);
    ExprPtr parse_call(ExprPtr callee);
    ExprPtr parse_filters(ExprPtr e);
    ExprPtr parse_named(Expr::Kind kind, ExprPtr operand, int line);
    void check_named_argument(const Expr& e);

    int nest_ = 0;
};

}  // namespace tmx::jinja::detail

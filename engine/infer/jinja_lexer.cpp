// The Jinja subset's lexer (jinja.h): Jinja2's lexical rules with trim_blocks and
// lstrip_blocks on, as transformers sets them.
#include <algorithm>
#include <cstdio>

#include "engine/infer/jinja_detail.h"

namespace tmx::jinja::detail {
namespace {

bool is_ascii_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool is_digit(char c) {
    return c >= '0' && c <= '9';
}
bool is_name_start(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_hex(char c) {
    return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

// Jinja2's lexer with trim_blocks and lstrip_blocks: the source's newlines become "\n" and one
// trailing newline is dropped; a "-" beside a delimiter strips the whitespace on that side; a
// block or comment tag alone on its line takes the line's indentation with it, and the newline
// after a block or comment tag goes.
class Lexer {
  public:
    explicit Lexer(std::string_view text) {
        src_.reserve(text.size());
        for (size_t i = 0; i < text.size(); ++i) {
            if (text[i] != '\r') {
                src_ += text[i];
                continue;
            }
            src_ += '\n';
            if (i + 1 < text.size() && text[i + 1] == '\n') ++i;
        }
        if (!src_.empty() && src_.back() == '\n') src_.pop_back();
    }

    std::vector<Token> run() {
        bool line_starting = true;
        while (pos_ < src_.size()) {
            size_t tag = pos_;
            while (tag + 1 < src_.size() &&
                   !(src_[tag] == '{' &&
                     (src_[tag + 1] == '{' || src_[tag + 1] == '%' || src_[tag + 1] == '#')))
                ++tag;
            const int text_line = line_;
            if (tag + 1 >= src_.size()) {
                tokens_.push_back({Tok::Text, src_.substr(pos_), text_line});
                break;
            }
            const char kind = src_[tag + 1];
            const char sign =
                tag + 2 < src_.size() && (src_[tag + 2] == '-' || src_[tag + 2] == '+')
                    ? src_[tag + 2]
                    : 0;
            std::string text = src_.substr(pos_, tag - pos_);
            if (sign == '-') {
                text = py_strip(text, std::nullopt, false, true);
            } else if (sign != '+' && kind != '{') {
                const size_t line_start = text.rfind('\n') + 1;  // npos + 1 == 0
                if ((line_start > 0 || line_starting) && line_start < text.size() &&
                    py_strip(std::string_view(text).substr(line_start), std::nullopt, true, true)
                        .empty())
                    text.resize(line_start);
            }
            if (!text.empty()) tokens_.push_back({Tok::Text, text, text_line});
            advance_to(tag + 2 + (sign ? 1 : 0));
            if (kind == '#')
                skip_comment();
            else
                lex_tag(kind == '{');
            line_starting = src_[pos_ - 1] == '\n';
        }
        tokens_.push_back({Tok::Eof, "", line_});
        return std::move(tokens_);
    }

  private:
    void advance_to(size_t to) {
        line_ += static_cast<int>(std::count(src_.begin() + static_cast<ptrdiff_t>(pos_),
                                             src_.begin() + static_cast<ptrdiff_t>(to), '\n'));
        pos_ = to;
    }
    // After a tag's end: "-" strips the whitespace that follows; otherwise, trim_blocks (for
    // blocks and comments) removes one newline.
    void after_tag_end(char sign, bool block) {
        if (sign == '-') {
            size_t end = pos_;
            for (size_t at = end; at < src_.size() && is_space(next_code_point(src_, at));)
                end = at;
            advance_to(end);
        } else if (sign != '+' && block && pos_ < src_.size() && src_[pos_] == '\n') {
            advance_to(pos_ + 1);
        }
    }
    void skip_comment() {
        const int line = line_;
        const size_t end = src_.find("#}", pos_);
        if (end == std::string::npos) fail_at(line, "unclosed comment: no '#}'");
        const char sign =
            end > pos_ && (src_[end - 1] == '-' || src_[end - 1] == '+') ? src_[end - 1] : 0;
        advance_to(end + 2);
        after_tag_end(sign, true);
    }

    void lex_tag(bool variable) {
        const int line = line_;
        tokens_.push_back({variable ? Tok::VarBegin : Tok::BlockBegin, "", line});
        const std::string_view end = variable ? "}}" : "%}";
        std::vector<char> brackets;
        while (true) {
            while (pos_ < src_.size() && is_ascii_space(src_[pos_])) advance_to(pos_ + 1);
            if (pos_ >= src_.size()) fail_at(line, "unclosed tag: no '" + std::string(end) + "'");
            const std::string_view rest = std::string_view(src_).substr(pos_);
            if (brackets.empty()) {
                for (const char sign : {'-', '+', '\0'}) {
                    const std::string marker =
                        (sign ? std::string(1, sign) : "") + std::string(end);
                    if (rest.substr(0, marker.size()) != marker) continue;
                    if (sign == '+' && variable) continue;
                    tokens_.push_back({variable ? Tok::VarEnd : Tok::BlockEnd, "", line_});
                    advance_to(pos_ + marker.size());
                    after_tag_end(sign, !variable);
                    return;
                }
            }
            lex_token(rest, brackets);
        }
    }

    void lex_token(std::string_view rest, std::vector<char>& brackets) {
        const char c = rest[0];
        if (is_digit(c)) return lex_number(rest);
        if (is_name_start(c)) {
            size_t n = 1;
            while (n < rest.size() && (is_name_start(rest[n]) || is_digit(rest[n]))) ++n;
            tokens_.push_back({Tok::Name, std::string(rest.substr(0, n)), line_});
            return advance_to(pos_ + n);
        }
        if (c == '\'' || c == '"') return lex_string(rest);
        for (const char* op : {"//", "**", "==", "!=", ">=", "<="}) {
            if (rest.substr(0, 2) == op) {
                tokens_.push_back({Tok::Operator, op, line_});
                return advance_to(pos_ + 2);
            }
        }
        if (std::string_view("+-*/%~[](){}><=.:|,;").find(c) == std::string_view::npos) {
            const std::u32string cp = decode(rest.substr(0, 4));
            fail_at(line_, "unexpected character '" + encode(cp.substr(0, 1)) + "'");
        }
        if (c == '(' || c == '[' || c == '{')
            brackets.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
        if (c == ')' || c == ']' || c == '}') {
            if (brackets.empty()) fail_at(line_, std::string("unexpected '") + c + "'");
            if (brackets.back() != c)
                fail_at(line_,
                        std::string("unexpected '") + c + "', expected '" + brackets.back() + "'");
            brackets.pop_back();
        }
        tokens_.push_back({Tok::Operator, std::string(1, c), line_});
        advance_to(pos_ + 1);
    }

    // Digits with single underscores between; a float has a fraction, an exponent or both
    // (Jinja2's number syntax; no float starts right after a '.', so `x.0.1` is two items).
    void lex_number(std::string_view rest) {
        auto digits = [&](size_t at) {  // end of a run of digits at `at`, or `at` if none
            if (at >= rest.size() || !is_digit(rest[at])) return at;
            size_t n = at + 1;
            while (n < rest.size() &&
                   (is_digit(rest[n]) ||
                    (rest[n] == '_' && n + 1 < rest.size() && is_digit(rest[n + 1]))))
                ++n;
            return n;
        };
        size_t n = digits(0);
        bool is_float = false;
        const bool after_dot = pos_ > 0 && src_[pos_ - 1] == '.';
        if (!after_dot && n < rest.size() && rest[n] == '.' && digits(n + 1) > n + 1) {
            n = digits(n + 1);
            is_float = true;
        }
        if (!after_dot && n < rest.size() && (rest[n] == 'e' || rest[n] == 'E')) {
            size_t e = n + 1;
            if (e < rest.size() && (rest[e] == '+' || rest[e] == '-')) ++e;
            if (digits(e) > e) {
                n = digits(e);
                is_float = true;
            }
        }
        std::string number(rest.substr(0, n));
        number.erase(std::remove(number.begin(), number.end(), '_'), number.end());
        tokens_.push_back({is_float ? Tok::Float : Tok::Integer, number, line_});
        advance_to(pos_ + n);
    }

    // A quoted string with Python's escapes (Jinja2 decodes them as "unicode-escape"). A
    // backslash before a non-ASCII character keeps the character's own escape as text, as
    // Jinja2's detour through ASCII with backslashreplace does.
    void lex_string(std::string_view rest) {
        const char quote = rest[0];
        size_t end = 1;  // the closing quote's byte; bytes of a UTF-8 sequence are never '\\'
        while (end < rest.size() && rest[end] != quote) end += rest[end] == '\\' ? 2 : 1;
        if (end >= rest.size()) fail_at(line_, "unclosed string");
        const std::u32string s = decode(rest.substr(0, end + 1));
        std::u32string out;
        size_t i = 1;
        auto hex_value = [&](size_t from, size_t count) {
            if (from + count > s.size()) fail_at(line_, "truncated escape in a string");
            uint32_t v = 0;
            for (size_t k = from; k < from + count; ++k) {
                if (s[k] > 127 || !is_hex(static_cast<char>(s[k])))
                    fail_at(line_, "truncated escape in a string");
                const char h = static_cast<char>(s[k]);
                v = v * 16 + static_cast<uint32_t>(is_digit(h) ? h - '0' : (h | 0x20) - 'a' + 10);
            }
            return v;
        };
        while (true) {
            if (i >= s.size()) fail_at(line_, "unclosed string");
            const char32_t c = s[i];
            if (c == static_cast<char32_t>(quote)) break;
            if (c != U'\\') {
                out += c;
                ++i;
                continue;
            }
            if (i + 1 >= s.size()) fail_at(line_, "unclosed string");
            const char32_t e = s[i + 1];
            i += 2;
            switch (e) {
                case U'\n':
                    break;
                case U'\\':
                    out += U'\\';
                    break;
                case U'\'':
                    out += U'\'';
                    break;
                case U'"':
                    out += U'"';
                    break;
                case U'a':
                    out += U'\a';
                    break;
                case U'b':
                    out += U'\b';
                    break;
                case U'f':
                    out += U'\f';
                    break;
                case U'n':
                    out += U'\n';
                    break;
                case U'r':
                    out += U'\r';
                    break;
                case U't':
                    out += U'\t';
                    break;
                case U'v':
                    out += U'\v';
                    break;
                case U'x':
                    out += hex_value(i, 2), i += 2;
                    break;
                case U'u':
                    out += hex_value(i, 4), i += 4;
                    break;
                case U'U': {
                    const uint32_t v = hex_value(i, 8);
                    if (v > 0x10FFFF) fail_at(line_, "an escape beyond U+10FFFF in a string");
                    out += static_cast<char32_t>(v);
                    i += 8;
                    break;
                }
                case U'N':
                    fail_at(line_, "\\N{...} escapes are not supported");
                default:
                    if (e >= U'0' && e <= U'7') {
                        uint32_t v = e - U'0';
                        for (int k = 0; k < 2 && i < s.size() && s[i] >= U'0' && s[i] <= U'7'; ++k)
                            v = v * 8 + (s[i++] - U'0');
                        out += static_cast<char32_t>(v);
                    } else if (e > 127) {
                        char escaped[16];
                        std::snprintf(escaped, sizeof escaped,
                                      e < 0x100     ? "\\x%02x"
                                      : e < 0x10000 ? "\\u%04x"
                                                    : "\\U%08x",
                                      static_cast<unsigned>(e));
                        for (const char* p = escaped; *p; ++p) out += static_cast<char32_t>(*p);
                    } else {
                        out += U'\\';
                        out += e;
                    }
            }
        }
        tokens_.push_back({Tok::String, encode(out), line_});
        advance_to(pos_ + end + 1);
    }

    std::string src_;
    size_t pos_ = 0;
    int line_ = 1;
    std::vector<Token> tokens_;
};

}  // namespace

[[noreturn]] void fail_at(int line, const std::string& what) {
    fail("line " + std::to_string(line) + ": " + what);
}

std::vector<Token> lex(std::string_view text) {
    return Lexer(text).run();
}

}  // namespace tmx::jinja::detail

// DocumentSplitter::JsonlLine (engine/data/jsonl_reader.h): the streaming JSON parser that
// checks each JSONL line and hands its "text" string to the document as it decodes it.
#include "engine/data/jsonl_reader.h"

#include <utility>

#include "engine/core/errors.h"

namespace tmx {

using corpus_detail::is_space;

namespace {

bool is_json_space(char c) {
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

int hex_digit_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

// Deeper JSON nesting is refused: the parser keeps one byte per level.
constexpr size_t kMaxJsonDepth = 10000;

constexpr const char* kNotADocumentObject = "expected a JSON object with a string field \"text\"";

}  // namespace

void DocumentSplitter::JsonlLine::fail_shape() {
    error_ = kNotADocumentObject;
    state_ = State::Failed;
}

void DocumentSplitter::JsonlLine::reset() {
    utf8_.finish();
    utf8_ok_ = true;
    state_ = State::LineStart;
    odd_space_ = false;
    stack_.clear();
    offset_ = 0;
    role_ = Role::Skip;
    in_key_ = key_is_text_ = next_value_is_text_ = text_seen_ = false;
    key_length_ = 0;
    high_surrogate_ = 0;
    error_.clear();
}

void DocumentSplitter::JsonlLine::bytes(std::string_view b) {
    if (utf8_ok_ && !utf8_.feed(b)) utf8_ok_ = false;
    if (utf8_ok_) {
        size_t i = 0;
        while (i < b.size() && state_ != State::Failed) step(b, i);
    }
    offset_ += b.size();
}

void DocumentSplitter::JsonlLine::end() {
    const bool utf8_ok = utf8_.finish() && utf8_ok_;
    const State state = state_;
    if (state != State::Failed && state != State::Done && state != State::LineStart)
        fail(0, "the line ends before the object is closed");
    const std::string error = std::move(error_);
    const bool text_seen = text_seen_;
    reset();
    const std::string where = s_.name_ + ":" + std::to_string(s_.line_no_) + ": ";
    if (!utf8_ok) {
        s_.doc_mark_invalid_utf8();
        s_.doc_end();
        return;
    }
    if (state == State::LineStart) return;  // a blank line
    if (!error.empty()) throw Error(where + error);
    if (!text_seen) throw Error(where + kNotADocumentObject);
    s_.doc_end();
}

void DocumentSplitter::JsonlLine::step(std::string_view b, size_t& i) {
    const char c = b[i];
    switch (state_) {
        case State::LineStart:
            if (is_space(c)) {
                odd_space_ = odd_space_ || !is_json_space(c);
                ++i;
            } else if (c != '{') {
                fail_shape();
            } else if (odd_space_) {
                fail(i, "\\v or \\f is not JSON whitespace");
            } else {
                open('{', i);
                ++i;
            }
            return;
        case State::KeyOrClose:
        case State::Key:
            if (is_json_space(c)) {
                ++i;
            } else if (c == '"') {
                in_key_ = true;
                role_ = stack_.size() == 1 ? Role::Key : Role::Skip;
                key_length_ = 0;
                key_is_text_ = true;
                state_ = State::String;
                ++i;
            } else if (c == '}' && state_ == State::KeyOrClose) {
                close();
                ++i;
            } else {
                fail(i, "expected a key in double quotes");
            }
            return;
        case State::Colon:
            if (is_json_space(c)) {
                ++i;
            } else if (c == ':') {
                state_ = State::Value;
                ++i;
            } else {
                fail(i, "expected ':' after a key");
            }
            return;
        case State::Value:
        case State::ValueOrClose:
            if (is_json_space(c)) {
                ++i;
            } else if (c == ']' && state_ == State::ValueOrClose) {
                close();
                ++i;
            } else {
                begin_value(c, i);
                if (state_ != State::Failed) ++i;
            }
            return;
        case State::CommaOrClose:
            if (is_json_space(c)) {
                ++i;
            } else if (c == ',') {
                state_ = stack_.back() == '{' ? State::Key : State::Value;
                ++i;
            } else if ((c == '}' && stack_.back() == '{') || (c == ']' && stack_.back() == '[')) {
                close();
                ++i;
            } else {
                fail(i, stack_.back() == '{' ? "expected ',' or '}'" : "expected ',' or ']'");
            }
            return;
        case State::String: {
            size_t j = i;
            while (j < b.size()) {
                const auto u = static_cast<unsigned char>(b[j]);
                if (u == '"' || u == '\\' || u < 0x20) break;
                ++j;
            }
            string_bytes(b.substr(i, j - i));
            i = j;
            if (i == b.size()) return;
            if (b[i] == '"') {
                string_end(i);
            } else if (b[i] == '\\') {
                state_ = State::Escape;
            } else {
                fail(i, "a control character in a string must be escaped");
                return;
            }
            ++i;
            return;
        }
        case State::Escape: {
            static constexpr std::string_view from = "\"\\/bfnrt", to = "\"\\/\b\f\n\r\t";
            const size_t k = from.find(c);
            if (c == 'u') {
                state_ = State::Unicode;
                code_ = 0;
                hex_digits_ = 0;
            } else if (k != std::string_view::npos) {
                string_bytes(to.substr(k, 1));
                state_ = State::String;
            } else {
                fail(i, "invalid escape in a string");
                return;
            }
            ++i;
            return;
        }
        case State::Unicode: {
            const int v = hex_digit_value(c);
            if (v < 0) {
                fail(i, "expected 4 hex digits after \\u");
                return;
            }
            code_ = code_ * 16 + static_cast<uint32_t>(v);
            if (++hex_digits_ == 4) code_point_done(i);
            ++i;
            return;
        }
        case State::SurrogateBackslash:
        case State::SurrogateU:
            if (c != (state_ == State::SurrogateBackslash ? '\\' : 'u')) {
                fail(i, "a high surrogate must be followed by a low one (\\uDC00-\\uDFFF)");
                return;
            }
            if (state_ == State::SurrogateBackslash) {
                state_ = State::SurrogateU;
            } else {
                state_ = State::Unicode;
                code_ = 0;
                hex_digits_ = 0;
            }
            ++i;
            return;
        case State::Number:
            if (number_step(c)) {
                ++i;
            } else if (!number_complete()) {
                fail(i, "invalid number");
            } else {
                value_done();  // c is looked at again in the new state
            }
            return;
        case State::Literal:
            if (c != literal_[literal_matched_]) {
                fail(i, "invalid literal (expected true, false or null)");
                return;
            }
            if (++literal_matched_ == literal_.size()) value_done();
            ++i;
            return;
        case State::Done:
            if (!is_json_space(c)) {
                fail(i, "unexpected text after the object");
                return;
            }
            ++i;
            return;
        case State::Failed:
            return;
    }
}

void DocumentSplitter::JsonlLine::begin_value(char c, size_t i) {
    const bool is_text = std::exchange(next_value_is_text_, false);
    if (is_text && c != '"') {
        fail_shape();
        return;
    }
    in_key_ = false;
    if (c == '"') {
        role_ = is_text ? Role::Text : Role::Skip;
        text_seen_ = text_seen_ || is_text;
        state_ = State::String;
    } else if (c == '{' || c == '[') {
        open(c, i);
    } else if (c == '-' || (c >= '0' && c <= '9')) {
        num_ = c == '-' ? Num::Minus : c == '0' ? Num::Zero : Num::Int;
        state_ = State::Number;
    } else if (c == 't' || c == 'f' || c == 'n') {
        literal_ = c == 't' ? "true" : c == 'f' ? "false" : "null";
        literal_matched_ = 1;
        state_ = State::Literal;
    } else {
        fail(i, "expected a value");
    }
}

void DocumentSplitter::JsonlLine::open(char bracket, size_t i) {
    if (stack_.size() >= kMaxJsonDepth) {
        fail(i, "nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
        return;
    }
    stack_.push_back(bracket);
    state_ = bracket == '{' ? State::KeyOrClose : State::ValueOrClose;
}

void DocumentSplitter::JsonlLine::close() {
    stack_.pop_back();
    value_done();
}

void DocumentSplitter::JsonlLine::string_bytes(std::string_view decoded) {
    if (role_ == Role::Text) {
        s_.doc_append(decoded);
    } else if (role_ == Role::Key && key_is_text_) {
        static constexpr std::string_view text = "text";
        key_is_text_ = key_length_ + decoded.size() <= text.size() &&
                       text.substr(key_length_, decoded.size()) == decoded;
        key_length_ += decoded.size();
    }
}

void DocumentSplitter::JsonlLine::string_end(size_t i) {
    if (!in_key_) {
        value_done();
        return;
    }
    in_key_ = false;
    state_ = State::Colon;
    if (role_ == Role::Key && key_is_text_ && key_length_ == 4) {
        if (text_seen_) {
            fail(i, "the field \"text\" appears more than once");
            return;
        }
        next_value_is_text_ = true;
    }
}

void DocumentSplitter::JsonlLine::code_point_done(size_t i) {
    uint32_t cp = code_;
    if (high_surrogate_ != 0) {
        if (cp < 0xDC00 || cp > 0xDFFF) {
            fail(i, "a high surrogate must be followed by a low one (\\uDC00-\\uDFFF)");
            return;
        }
        cp = 0x10000 + ((high_surrogate_ - 0xD800) << 10) + (cp - 0xDC00);
        high_surrogate_ = 0;
    } else if (cp >= 0xD800 && cp <= 0xDBFF) {
        high_surrogate_ = cp;
        state_ = State::SurrogateBackslash;
        return;
    } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
        fail(i, "a low surrogate (\\uDC00-\\uDFFF) without a high one before it");
        return;
    }
    decoded_.clear();
    append_utf8(cp, decoded_);
    string_bytes(decoded_);
    state_ = State::String;
}

bool DocumentSplitter::JsonlLine::number_step(char c) {
    const bool digit = c >= '0' && c <= '9';
    const bool exp = c == 'e' || c == 'E';
    switch (num_) {
        case Num::Minus:
            if (!digit) return false;
            num_ = c == '0' ? Num::Zero : Num::Int;
            return true;
        case Num::Zero:
        case Num::Int:
            if (digit && num_ == Num::Int) return true;
            if (c == '.')
                num_ = Num::Dot;
            else if (exp)
                num_ = Num::E;
            else
                return false;
            return true;
        case Num::Dot:
        case Num::Frac:
            if (digit)
                num_ = Num::Frac;
            else if (exp && num_ == Num::Frac)
                num_ = Num::E;
            else
                return false;
            return true;
        case Num::E:
            if (c == '+' || c == '-')
                num_ = Num::ESign;
            else if (digit)
                num_ = Num::Exp;
            else
                return false;
            return true;
        case Num::ESign:
        case Num::Exp:
            if (!digit) return false;
            num_ = Num::Exp;
            return true;
    }
    return false;
}

}  // namespace tmx

// The streaming JSONL parser behind DocumentSplitter (engine/data/corpus.h), with the helpers it
// shares with the splitter. Internal to engine/data/: corpus.cpp and jsonl_reader.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "engine/data/corpus.h"

namespace tmx {

namespace corpus_detail {

// The whitespace of the text formats, trimmed from documents (JSON's own is narrower).
inline bool is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

// Checks that bytes fed in parts of any size are valid UTF-8 together.
class Utf8Checker {
  public:
    // False once the bytes so far cannot be valid UTF-8.
    bool feed(std::string_view s) {
        if (!valid_) return false;
        // Complete a character cut at the previous part's end.
        while (!held_.empty() && !s.empty()) {
            held_.push_back(s.front());
            s.remove_prefix(1);
            if (utf8_char_length(held_) == held_.size())
                held_.clear();
            else if (!is_incomplete_utf8(held_))
                return valid_ = false;
        }
        // Hold back a character cut at this part's end.
        size_t keep = 0;
        for (size_t k = 1; k <= 3 && k <= s.size() && keep == 0; ++k)
            if (is_incomplete_utf8(s.substr(s.size() - k))) keep = k;
        if (!is_valid_utf8(s.substr(0, s.size() - keep))) return valid_ = false;
        held_.append(s.substr(s.size() - keep));
        return true;
    }
    // Whether everything fed since the last reset is valid; then starts afresh.
    bool finish() {
        const bool ok = valid_ && held_.empty();
        valid_ = true;
        held_.clear();
        return ok;
    }

  private:
    bool valid_ = true;
    std::string held_;  // a character cut short, at most 3 bytes
};

}  // namespace corpus_detail

// ---------------------------------------------------------------------------------------------
// DocumentSplitter::JsonlLine: a streaming JSON parser for one line at a time. It checks the
// whole line's syntax and hands the decoded bytes of the top-level "text" string to the
// document as they arrive, holding nothing that grows with the line. Errors wait for the end
// of the line: a line that is not valid UTF-8 is skipped (and counted) whatever else is wrong
// with it.

class DocumentSplitter::JsonlLine {
  public:
    explicit JsonlLine(DocumentSplitter& splitter) : s_(splitter) {}

    void bytes(std::string_view b);
    void end();

  private:
    enum class State {
        LineStart,     // only whitespace so far
        KeyOrClose,    // after '{'
        Key,           // after ',' in an object
        Colon,         // after a key
        Value,         // after ':', or ',' in an array
        ValueOrClose,  // after '['
        CommaOrClose,  // after a value inside an object or array
        String,
        Escape,              // after a backslash in a string
        Unicode,             // in the 4 hex digits of \u
        SurrogateBackslash,  // after a high surrogate: its low half's backslash
        SurrogateU,          // ... and its 'u'
        Number,
        Literal,
        Done,    // the object is closed; only whitespace may follow
        Failed,  // error_ says what is wrong; the rest of the line is only checked for UTF-8
    };
    enum class Role { Skip, Key, Text };  // what a string's decoded bytes are for
    // A JSON number: -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?
    enum class Num { Minus, Zero, Int, Dot, Frac, E, ESign, Exp };

    void step(std::string_view b, size_t& i);
    void begin_value(char c, size_t i);
    void open(char bracket, size_t i);
    void close();
    void value_done() { state_ = stack_.empty() ? State::Done : State::CommaOrClose; }
    void string_bytes(std::string_view decoded);
    void string_end(size_t i);
    void code_point_done(size_t i);
    bool number_step(char c);
    bool number_complete() const {
        return num_ == Num::Zero || num_ == Num::Int || num_ == Num::Frac || num_ == Num::Exp;
    }
    void fail(size_t i, const std::string& what) {
        error_ =
            "not a valid JSON line (column " + std::to_string(offset_ + i + 1) + ": " + what + ")";
        state_ = State::Failed;
    }
    void fail_shape();
    void reset();

    DocumentSplitter& s_;
    corpus_detail::Utf8Checker utf8_;
    bool utf8_ok_ = true;
    State state_ = State::LineStart;
    bool odd_space_ = false;  // \v or \f before the object: blank to the splitter, not JSON
    std::string stack_;       // the open '{' and '['
    uint64_t offset_ = 0;     // bytes of the line before the current part
    Role role_ = Role::Skip;
    bool in_key_ = false;
    size_t key_length_ = 0;     // Role::Key: bytes of the key so far
    bool key_is_text_ = false;  // ... and they match "text"
    bool next_value_is_text_ = false;
    bool text_seen_ = false;
    uint32_t code_ = 0, high_surrogate_ = 0;
    int hex_digits_ = 0;
    Num num_ = Num::Int;
    std::string_view literal_;
    size_t literal_matched_ = 0;
    std::string error_;
    std::string decoded_;  // an escape's bytes
};

}  // namespace tmx

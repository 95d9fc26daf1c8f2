#include "engine/data/corpus.h"

#include <string.h>  // memrchr
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "engine/core/errors.h"
#include "engine/core/file_io.h"

namespace tmx {

namespace {

bool is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

std::string_view trim(std::string_view s) {
    size_t a = 0, b = s.size();
    while (a < b && is_space(s[a])) ++a;
    while (b > a && is_space(s[b - 1])) --b;
    return s.substr(a, b - a);
}

bool ends_with(std::string_view s, std::string_view suffix) {
    return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Length of the valid UTF-8 sequence at the start of `s`, or 0 when it is not one.
size_t utf8_sequence_length(const unsigned char* s, size_t n) {
    const unsigned char c = s[0];
    if (c < 0x80) return 1;
    auto cont = [&](size_t i, unsigned char lo = 0x80, unsigned char hi = 0xBF) {
        return i < n && s[i] >= lo && s[i] <= hi;
    };
    if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
    if (c == 0xE0) return cont(1, 0xA0) && cont(2) ? 3 : 0;
    if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) return cont(1) && cont(2) ? 3 : 0;
    if (c == 0xED) return cont(1, 0x80, 0x9F) && cont(2) ? 3 : 0;
    if (c == 0xF0) return cont(1, 0x90) && cont(2) && cont(3) ? 4 : 0;
    if (c >= 0xF1 && c <= 0xF3) return cont(1) && cont(2) && cont(3) ? 4 : 0;
    if (c == 0xF4) return cont(1, 0x80, 0x8F) && cont(2) && cont(3) ? 4 : 0;
    return 0;
}

}  // namespace

CorpusFormat parse_corpus_format(std::string_view name) {
    if (name == "auto") return CorpusFormat::Auto;
    if (name == "tinystories") return CorpusFormat::TinyStories;
    if (name == "paragraphs") return CorpusFormat::Paragraphs;
    if (name == "jsonl") return CorpusFormat::Jsonl;
    throw UsageError("--format: expected auto, tinystories, paragraphs or jsonl, got '" +
                     std::string(name) + "'");
}

const char* to_string(CorpusFormat format) {
    switch (format) {
        case CorpusFormat::Auto:
            return "auto";
        case CorpusFormat::TinyStories:
            return "tinystories";
        case CorpusFormat::Paragraphs:
            return "paragraphs";
        case CorpusFormat::Jsonl:
            return "jsonl";
    }
    return "?";
}

CorpusFormat detect_corpus_format(std::string_view head, std::string_view path) {
    if (ends_with(path, ".jsonl") || ends_with(path, ".JSONL")) return CorpusFormat::Jsonl;
    head = head.substr(0, kFormatDetectBytes);
    bool first_nonblank = true;
    size_t pos = 0;
    while (pos < head.size()) {
        size_t end = head.find('\n', pos);
        if (end == std::string_view::npos) end = head.size();
        std::string_view line = trim(head.substr(pos, end - pos));
        if (!line.empty()) {
            if (first_nonblank && line.front() == '{') return CorpusFormat::Jsonl;
            first_nonblank = false;
            if (line == kEndOfTextLine) return CorpusFormat::TinyStories;
        }
        pos = end + 1;
    }
    return CorpusFormat::Paragraphs;
}

size_t utf8_char_length(std::string_view text) {
    if (text.empty()) return 0;
    return utf8_sequence_length(reinterpret_cast<const unsigned char*>(text.data()), text.size());
}

bool is_valid_utf8(std::string_view text) {
    const auto* s = reinterpret_cast<const unsigned char*>(text.data());
    const size_t n = text.size();
    size_t i = 0;
    while (i < n) {
        // ASCII fast path, 8 bytes at a time.
        if (i + 8 <= n) {
            uint64_t w;
            std::memcpy(&w, s + i, 8);
            if ((w & 0x8080808080808080ull) == 0) {
                i += 8;
                continue;
            }
        }
        size_t len = utf8_sequence_length(s + i, n - i);
        if (len == 0) return false;
        i += len;
    }
    return true;
}

bool is_incomplete_utf8(std::string_view text) {
    const auto* p = reinterpret_cast<const unsigned char*>(text.data());
    const unsigned char c = p[0];
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
        need = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        return false;
    }
    if (text.size() >= need) return false;
    for (size_t i = 1; i < text.size(); ++i) {
        const unsigned char l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
        if (p[i] < l || p[i] > h) return false;
    }
    return true;
}

namespace {

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

bool is_json_space(char c) {
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

int hex_digit_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

// Appends code point `cp` (not a surrogate, at most U+10FFFF) as UTF-8.
void append_utf8(uint32_t cp, std::string& out) {
    if (cp < 0x80) {
        out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
        out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
        out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
}

// Deeper JSON nesting is refused: the parser keeps one byte per level.
constexpr size_t kMaxJsonDepth = 10000;

constexpr const char* kNotADocumentObject = "expected a JSON object with a string field \"text\"";

}  // namespace

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
    void fail_shape() {
        error_ = kNotADocumentObject;
        state_ = State::Failed;
    }
    void reset();

    DocumentSplitter& s_;
    Utf8Checker utf8_;
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

// ---------------------------------------------------------------------------------------------
// DocumentSplitter

DocumentSplitter::DocumentSplitter(CorpusFormat format, std::string name)
    : format_(format), name_(std::move(name)) {
    if (format_ == CorpusFormat::Auto)
        throw Error(name_ + ": internal error: DocumentSplitter needs a concrete format");
    if (format_ == CorpusFormat::Jsonl) jsonl_ = std::make_unique<JsonlLine>(*this);
}

DocumentSplitter::~DocumentSplitter() = default;

void DocumentSplitter::feed(std::string_view text, std::vector<DocumentPiece>& out) {
    // The bytes before a NUL are split first, so that an error in them comes first, as it
    // would have had the input arrived in other pieces.
    const auto* nul = static_cast<const char*>(std::memchr(text.data(), '\0', text.size()));
    if (nul) text = text.substr(0, static_cast<size_t>(nul - text.data()));
    const uint64_t nul_offset = static_cast<uint64_t>(stats_.bytes) + text.size();
    stats_.bytes += static_cast<int64_t>(text.size());
    out_ = &out;
    // A CR that ends a feed may be half of a CRLF: it waits for the next byte.
    auto release_pending_cr = [&] {
        if (pending_cr_) line_bytes("\r");
        pending_cr_ = false;
    };
    size_t pos = 0;
    while (pos < text.size()) {
        const void* nl = std::memchr(text.data() + pos, '\n', text.size() - pos);
        const size_t end =
            nl ? static_cast<size_t>(static_cast<const char*>(nl) - text.data()) : text.size();
        std::string_view part = text.substr(pos, end - pos);
        if (part.empty())
            pending_cr_ = false;  // it was the CR of a CRLF
        else
            release_pending_cr();
        const bool cr = !part.empty() && part.back() == '\r';
        if (cr) part.remove_suffix(1);  // CRLF becomes LF
        if (!part.empty()) line_bytes(part);
        if (!nl) {
            pending_cr_ = cr;
            break;
        }
        line_end();
        pos = end + 1;
    }
    out_ = nullptr;
    if (nul)
        throw Error(name_ + ": contains a NUL byte at offset " + std::to_string(nul_offset) +
                    "; this looks like binary data, not a text corpus");
}

void DocumentSplitter::finish(std::vector<DocumentPiece>& out) {
    out_ = &out;
    pending_cr_ = false;  // a final CR goes like the CR of a CRLF
    line_end();           // an unfinished last line ends here
    doc_end();
    out_ = nullptr;
}

void DocumentSplitter::line_bytes(std::string_view bytes) {
    if (jsonl_)
        jsonl_->bytes(bytes);
    else
        text_line_bytes(bytes);
}

void DocumentSplitter::line_end() {
    if (jsonl_)
        jsonl_->end();
    else
        text_line_end();
    ++line_no_;
}

void DocumentSplitter::text_line_bytes(std::string_view b) {
    auto leading_space = [&] {
        size_t i = 0;
        while (i < b.size() && is_space(b[i])) ++i;
        return i;
    };
    while (!b.empty()) {
        switch (line_state_) {
            case LineState::Text:
                doc_append(b);
                return;
            case LineState::Start: {
                const size_t n = leading_space();
                doc_append(b.substr(0, n));  // whitespace: held back or trimmed
                b.remove_prefix(n);
                if (!b.empty()) line_state_ = LineState::Separator;
                break;
            }
            case LineState::Separator:
                while (!b.empty() && sep_matched_ < kEndOfTextLine.size() &&
                       b.front() == kEndOfTextLine[sep_matched_]) {
                    ++sep_matched_;
                    b.remove_prefix(1);
                }
                if (sep_matched_ == kEndOfTextLine.size())
                    line_state_ = LineState::AfterSeparator;
                else if (!b.empty())
                    separator_is_text();
                break;
            case LineState::AfterSeparator: {
                const size_t n = leading_space();
                sep_tail_.append(b.substr(0, n));
                b.remove_prefix(n);
                if (!b.empty() || sep_tail_.size() > kMaxHeldWhitespaceBytes) separator_is_text();
                break;
            }
        }
    }
}

void DocumentSplitter::separator_is_text() {
    line_state_ = LineState::Text;
    doc_append(kEndOfTextLine.substr(0, sep_matched_));
    doc_append(sep_tail_);
    sep_matched_ = 0;
    sep_tail_.clear();
}

void DocumentSplitter::text_line_end() {
    switch (line_state_) {
        case LineState::Start:  // a blank line
            if (format_ == CorpusFormat::Paragraphs)
                doc_end();
            else
                doc_append("\n");
            break;
        case LineState::Separator:
            separator_is_text();
            doc_append("\n");
            break;
        case LineState::AfterSeparator:
            sep_matched_ = 0;
            sep_tail_.clear();
            doc_end();
            break;
        case LineState::Text:
            doc_append("\n");
            break;
    }
    line_state_ = LineState::Start;
}

void DocumentSplitter::doc_append(std::string_view bytes) {
    if (doc_invalid_) return;
    if (!doc_started_) {
        size_t i = 0;
        while (i < bytes.size() && is_space(bytes[i])) ++i;
        bytes.remove_prefix(i);
        if (bytes.empty()) return;
        doc_started_ = true;
    }
    size_t end = bytes.size();
    while (end > 0 && is_space(bytes[end - 1])) --end;
    if (end > 0) {
        doc_text_ += doc_ws_;
        doc_ws_.clear();
        doc_text_.append(bytes.substr(0, end));
        cut_pieces();
    }
    hold_whitespace(bytes.substr(end));
}

void DocumentSplitter::hold_whitespace(std::string_view ws) {
    if (ws.empty() || doc_invalid_) return;
    doc_ws_.append(ws);
    // Too much to hold: pass it on as text, whole multiples of the limit so that the result
    // does not depend on how the input arrived.
    constexpr size_t unit = kMaxHeldWhitespaceBytes + 1;
    if (doc_ws_.size() >= unit) {
        const size_t n = doc_ws_.size() / unit * unit;
        doc_text_.append(doc_ws_, 0, n);
        doc_ws_.erase(0, n);
        cut_pieces();
    }
}

namespace {

// Where to end the next piece of `text` (longer than kMaxDocumentPieceBytes): before the last
// space that starts a word, so that the tokenizer sees whole words; else at a UTF-8 character
// boundary. Looks only at the first kMaxDocumentPieceBytes + 1 bytes, so the cuts do not
// depend on how much text is waiting.
size_t piece_length(std::string_view text) {
    constexpr size_t max = kMaxDocumentPieceBytes;
    size_t last = max - 1;  // search [1, last]: the piece is never empty
    while (last > 0) {
        const void* space = ::memrchr(text.data() + 1, ' ', last);
        if (!space) break;
        const auto p = static_cast<size_t>(static_cast<const char*>(space) - text.data());
        if (!is_space(text[p + 1])) return p;
        last = p - 1;
    }
    size_t p = max;
    while (p > max - 3 && (static_cast<unsigned char>(text[p]) & 0xC0) == 0x80) --p;
    return p;
}

}  // namespace

void DocumentSplitter::cut_pieces() {
    size_t start = 0;
    while (doc_text_.size() - start > kMaxDocumentPieceBytes) {
        const std::string_view rest = std::string_view(doc_text_).substr(start);
        const size_t n = piece_length(rest);
        if (!emit_piece(rest.substr(0, n), false)) return;
        start += n;
    }
    doc_text_.erase(0, start);
}

bool DocumentSplitter::emit_piece(std::string_view text, bool last) {
    if (!is_valid_utf8(text)) {
        doc_mark_invalid_utf8();
        return false;
    }
    out_->push_back(DocumentPiece{std::string(text), !doc_emitted_, last, false});
    doc_emitted_ = true;
    if (last) ++stats_.documents;
    return true;
}

void DocumentSplitter::doc_end() {
    if (doc_started_ && !doc_invalid_) emit_piece(doc_text_, true);
    doc_started_ = doc_emitted_ = doc_invalid_ = false;
    doc_text_.clear();
    doc_ws_.clear();
}

void DocumentSplitter::doc_mark_invalid_utf8() {
    if (doc_invalid_) return;
    ++stats_.invalid_utf8;
    if (doc_emitted_) out_->push_back(DocumentPiece{{}, false, true, true});
    doc_invalid_ = true;
    doc_text_.clear();
    doc_ws_.clear();
}

namespace {

// Joins pieces into whole documents; `partial` carries an unfinished one between calls.
void assemble_documents(std::vector<DocumentPiece>& pieces, std::string& partial,
                        std::vector<std::string>& docs) {
    for (DocumentPiece& p : pieces) {
        if (p.first || p.cancel) partial.clear();
        if (p.cancel) continue;
        if (p.first && p.last) {
            docs.push_back(std::move(p.text));
            continue;
        }
        partial += p.text;
        if (p.last) {
            docs.push_back(std::move(partial));
            partial.clear();
        }
    }
}

}  // namespace

std::vector<std::string> split_documents(std::string_view text, CorpusFormat format,
                                         CorpusStats* stats, std::string_view name) {
    if (format == CorpusFormat::Auto) format = detect_corpus_format(text, name);
    DocumentSplitter splitter(format, std::string(name));
    std::vector<DocumentPiece> pieces;
    splitter.feed(text, pieces);
    splitter.finish(pieces);
    std::vector<std::string> docs;
    std::string partial;
    assemble_documents(pieces, partial, docs);
    if (stats) *stats = splitter.stats();
    return docs;
}

// ---------------------------------------------------------------------------------------------
// CorpusReader

CorpusReader::CorpusReader(std::vector<std::string> paths, CorpusReaderOptions options)
    : options_(options) {
    if (paths.empty()) throw Error("no input files given");
    if (options_.chunk_bytes == 0) options_.chunk_bytes = 1;
    for (auto& p : paths) {
        const int fd = open_regular_file(p);
        struct stat st {};
        const int rc = ::fstat(fd, &st);
        const int err = errno;
        ::close(fd);
        if (rc != 0) throw Error(p + ": cannot stat: " + std::strerror(err));
        CorpusFileInfo info;
        info.path = std::move(p);
        info.bytes = static_cast<uint64_t>(st.st_size);
        total_bytes_ += info.bytes;
        files_.push_back(std::move(info));
    }
}

CorpusReader::~CorpusReader() {
    close_file();
}

void CorpusReader::close_file() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
}

CorpusStats CorpusReader::stats() const {
    CorpusStats s;
    for (size_t i = 0; i < files_.size() && i <= index_; ++i) {
        const CorpusStats& f = (i == index_ && splitter_) ? splitter_->stats() : files_[i].stats;
        s.documents += f.documents;
        s.bytes += f.bytes;
        s.invalid_utf8 += f.invalid_utf8;
    }
    return s;
}

namespace {

// Reads up to buffer.size() bytes at `offset` (or at the file position when offset < 0);
// shrinks `buffer` to what was read.
void read_some(int fd, const std::string& path, std::string& buffer, off_t offset = -1) {
    size_t got = 0;
    while (got < buffer.size()) {
        const ssize_t n = offset < 0 ? ::read(fd, buffer.data() + got, buffer.size() - got)
                                     : ::pread(fd, buffer.data() + got, buffer.size() - got,
                                               offset + static_cast<off_t>(got));
        if (n == 0) break;
        if (n < 0) {
            if (errno == EINTR) continue;
            throw Error(path + ": read error: " + std::strerror(errno));
        }
        got += static_cast<size_t>(n);
    }
    buffer.resize(got);
}

}  // namespace

void CorpusReader::open_next_file() {
    CorpusFileInfo& info = files_[index_];
    fd_ = open_regular_file(info.path);
    CorpusFormat format = options_.format;
    if (format == CorpusFormat::Auto) {
        buffer_.resize(kFormatDetectBytes);
        read_some(fd_, info.path, buffer_, 0);
        format = detect_corpus_format(buffer_, info.path);
    }
    info.format = format;
    splitter_ = std::make_unique<DocumentSplitter>(format, info.path);
}

bool CorpusReader::next(std::vector<DocumentPiece>& pieces) {
    pieces.clear();
    while (index_ < files_.size()) {
        CorpusFileInfo& info = files_[index_];
        if (fd_ < 0) open_next_file();
        buffer_.resize(options_.chunk_bytes);
        read_some(fd_, info.path, buffer_);
        if (!buffer_.empty()) {
            splitter_->feed(buffer_, pieces);
            bytes_read_ += buffer_.size();
            return true;
        }
        // End of this file.
        splitter_->finish(pieces);
        info.stats = splitter_->stats();
        close_file();
        splitter_.reset();
        ++index_;
        if (info.stats.documents == 0) {
            if (info.stats.invalid_utf8 > 0)
                throw Error(info.path + ": no usable documents (all " +
                            std::to_string(info.stats.invalid_utf8) +
                            " documents are invalid UTF-8)");
            throw Error(info.path +
                        ": no documents (the file is empty or holds only blank "
                        "lines and separators)");
        }
        return true;
    }
    return false;
}

bool CorpusReader::next(std::vector<std::string>& docs) {
    docs.clear();
    const bool more = next(pieces_);
    assemble_documents(pieces_, assembling_, docs);
    return more;
}

}  // namespace tmx

// tokenizer.json, as Hugging Face's `tokenizers` library reads and runs it. Every step below is
// the library's documented behaviour (https://huggingface.co/docs/tokenizers/api/...), and the
// tests compare the result with the library itself (npm `tokenizers`) on real models' files.
//
// Encoding: (1) added tokens whose `normalized` is false are found in the raw text (leftmost,
// then longest; `lstrip`/`rstrip` take the whitespace beside them, `single_word` needs word
// boundaries); (2) every other stretch is normalized, and the added tokens whose `normalized`
// is true are found in it; (3) the pre-tokenizer cuts the remaining stretches into words;
// (4) BPE turns each word into tokens: its characters (or their <0xNN> byte pieces, or the
// unknown token), joined pair by pair, the pair of lowest merge rank first (the leftmost of
// equal ranks). Regular expressions are PCRE2's with Unicode properties (the library uses
// Oniguruma; both read these patterns the same way); Unicode normalization is ICU's.
#include "engine/data/tokenizer_json.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <queue>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/core/errors.h"
#include "engine/data/corpus.h"

namespace tmx {

namespace {

using json = nlohmann::json;

constexpr std::string_view kReplacementChar = "\xef\xbf\xbd";  // U+FFFD

// ---- UTF-8

// The code point at s[i] (advancing i), or U+FFFD for a byte that starts no valid character.
char32_t next_code_point(std::string_view s, size_t& i) {
    const size_t len = utf8_char_length(s.substr(i));
    if (len == 0) {
        ++i;
        return 0xFFFD;
    }
    const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
    char32_t c = len == 1   ? b(0)
                 : len == 2 ? (b(0) & 0x1Fu) << 6 | (b(1) & 0x3Fu)
                 : len == 3 ? (b(0) & 0x0Fu) << 12 | (b(1) & 0x3Fu) << 6 | (b(2) & 0x3Fu)
                            : (b(0) & 0x07u) << 18 | (b(1) & 0x3Fu) << 12 | (b(2) & 0x3Fu) << 6 |
                                  (b(3) & 0x3Fu);
    i += len;
    return c;
}

// Valid UTF-8: each byte that starts no valid character becomes U+FFFD (the library takes
// only valid text; this is what a caller's bytes become on the way in).
std::string valid_utf8(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
        const size_t len = utf8_char_length(s.substr(i));
        if (len == 0) {
            out += kReplacementChar;
            ++i;
        } else {
            out.append(s.substr(i, len));
            i += len;
        }
    }
    return out;
}

// Bytes to text as Rust's String::from_utf8_lossy: each maximal invalid sequence one U+FFFD.
std::string lossy_utf8(std::string_view s) {
    std::string out;
    for (size_t i = 0; i < s.size();) {
        const size_t len = utf8_char_length(s.substr(i));
        if (len > 0) {
            out.append(s.substr(i, len));
            i += len;
            continue;
        }
        // The longest prefix of a valid sequence is one error (as the Unicode "maximal
        // subpart" practice Rust follows); a byte that starts none is one error on its own.
        size_t k = 1;
        while (k < 4 && i + k < s.size() && is_incomplete_utf8(s.substr(i, k + 1))) ++k;
        if (!is_incomplete_utf8(s.substr(i, k))) k = 1;
        out += kReplacementChar;
        i += k;
    }
    return out;
}

bool is_whitespace(char32_t c) {
    return u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_WHITE_SPACE);
}
// Rust's char::is_alphanumeric (Alphabetic, or a number: Nd, Nl, No), or '_'.
bool is_word_char(char32_t c) {
    const auto u = static_cast<UChar32>(c);
    const int8_t t = u_charType(u);
    return c == '_' || u_hasBinaryProperty(u, UCHAR_ALPHABETIC) || t == U_DECIMAL_DIGIT_NUMBER ||
           t == U_LETTER_NUMBER || t == U_OTHER_NUMBER;
}
// Rust's char::is_numeric: Nd, Nl or No.
bool is_numeric(char32_t c) {
    const int8_t t = u_charType(static_cast<UChar32>(c));
    return t == U_DECIMAL_DIGIT_NUMBER || t == U_LETTER_NUMBER || t == U_OTHER_NUMBER;
}

// The last code point of s (0 when empty).
char32_t last_code_point(std::string_view s) {
    size_t i = s.size();
    while (i > 0 && (static_cast<unsigned char>(s[i - 1]) & 0xC0) == 0x80) --i;
    if (i > 0) --i;
    return s.empty() ? 0 : next_code_point(s, i);
}

// ---- GPT-2's byte-level alphabet: every byte as a printable character.

struct ByteAlphabet {
    std::array<std::string, 256> char_of;           // byte -> UTF-8 of its character
    std::unordered_map<char32_t, uint8_t> byte_of;  // character -> byte
    ByteAlphabet() {
        int n = 0;
        for (int b = 0; b < 256; ++b) {
            const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
            const char32_t c = printable ? static_cast<char32_t>(b) : 256 + n++;
            append_utf8(c, char_of[b]);
            byte_of[c] = static_cast<uint8_t>(b);
        }
    }
};
const ByteAlphabet& byte_alphabet() {
    static const ByteAlphabet a;
    return a;
}

// ---- regular expressions (PCRE2, UTF and Unicode properties, JIT where available)

class Regex {
  public:
    Regex(const std::string& pattern, const std::string& where) {
        int error = 0;
        PCRE2_SIZE offset = 0;
        code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                              PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
        if (!code_) {
            PCRE2_UCHAR message[256];
            pcre2_get_error_message(error, message, sizeof(message));
            throw Error(where + ": regular expression does not compile at offset " +
                        std::to_string(offset) + ": " + reinterpret_cast<const char*>(message));
        }
        pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // falls back to the interpreter
    }
    Regex(const Regex&) = delete;
    Regex& operator=(const Regex&) = delete;
    ~Regex() { pcre2_code_free(code_); }

    // The non-overlapping matches [start, end) of s, left to right; after an empty match the
    // search goes on one character later (as Rust's find_iter).
    std::vector<std::pair<size_t, size_t>> find_all(std::string_view s) const {
        std::vector<std::pair<size_t, size_t>> out;
        pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
        if (!md) throw Error("tokenizer.json: out of memory for a regular expression match");
        size_t pos = 0;
        while (pos <= s.size()) {
            // The subject's UTF-8 is checked once, at the first search: PCRE2 would otherwise
            // check the whole text again at every match (quadratic in the text's length).
            const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), pos,
                                       out.empty() ? 0 : PCRE2_NO_UTF_CHECK, md, nullptr);
            if (rc == PCRE2_ERROR_NOMATCH) break;
            if (rc < 0) {
                pcre2_match_data_free(md);
                throw Error(
                    "tokenizer.json: a regular expression failed on the text (PCRE2 "
                    "error " +
                    std::to_string(rc) + ")");
            }
            const PCRE2_SIZE* v = pcre2_get_ovector_pointer(md);
            out.emplace_back(v[0], v[1]);
            if (v[1] > v[0]) {
                pos = v[1];
            } else {
                if (v[1] >= s.size()) break;
                pos = v[1] + std::max<size_t>(1, utf8_char_length(s.substr(v[1])));
            }
        }
        pcre2_match_data_free(md);
        return out;
    }

  private:
    pcre2_code* code_ = nullptr;
};

// A Replace or Split pattern: {"String": "..."} (a literal) or {"Regex": "..."}.
struct Pattern {
    std::string literal;
    std::unique_ptr<Regex> regex;
    std::vector<std::pair<size_t, size_t>> find_all(std::string_view s) const {
        if (regex) return regex->find_all(s);
        std::vector<std::pair<size_t, size_t>> out;
        if (literal.empty()) return out;
        for (size_t at = s.find(literal); at != std::string_view::npos;
             at = s.find(literal, at + literal.size()))
            out.emplace_back(at, at + literal.size());
        return out;
    }
};

std::string replace_all(std::string_view s, const Pattern& p, const std::string& content) {
    std::string out;
    size_t last = 0;
    for (const auto& [a, b] : p.find_all(s)) {
        out.append(s.substr(last, a - last));
        out += content;
        last = b;
    }
    out.append(s.substr(last));
    return out;
}

// ---- reading the JSON, with errors that name the field

struct Reader {
    const std::string& name;
    [[noreturn]] void fail(const std::string& field, const std::string& what) const {
        throw Error(name + ": " + field + ": " + what);
    }
    const json& at(const json& obj, const std::string& key, const std::string& field) const {
        if (!obj.is_object() || !obj.contains(key)) fail(field, "missing field '" + key + "'");
        return obj.at(key);
    }
    std::string str(const json& obj, const std::string& key, const std::string& field) const {
        const json& v = at(obj, key, field);
        if (!v.is_string()) fail(field + "." + key, "expected a string");
        return v.get<std::string>();
    }
    bool flag(const json& obj, const std::string& key, const std::string& field,
              bool fallback) const {
        if (!obj.contains(key) || obj.at(key).is_null()) return fallback;
        if (!obj.at(key).is_boolean()) fail(field + "." + key, "expected true or false");
        return obj.at(key).get<bool>();
    }
    int64_t integer(const json& obj, const std::string& key, const std::string& field,
                    int64_t fallback) const {
        if (!obj.contains(key) || obj.at(key).is_null()) return fallback;
        if (!obj.at(key).is_number_integer()) fail(field + "." + key, "expected an integer");
        return obj.at(key).get<int64_t>();
    }
    std::string type(const json& obj, const std::string& field) const {
        if (!obj.is_object()) fail(field, "expected an object");
        return str(obj, "type", field);
    }
    Pattern pattern(const json& obj, const std::string& field) const {
        const json& p = at(obj, "pattern", field);
        Pattern out;
        if (p.is_object() && p.contains("String") && p.at("String").is_string()) {
            out.literal = p.at("String").get<std::string>();
        } else if (p.is_object() && p.contains("Regex") && p.at("Regex").is_string()) {
            out.regex = std::make_unique<Regex>(p.at("Regex").get<std::string>(),
                                                name + ": " + field + ".pattern");
        } else {
            fail(field + ".pattern", "expected {\"String\": ...} or {\"Regex\": ...}");
        }
        return out;
    }
    [[noreturn]] void unsupported(const std::string& field, const std::string& type) const {
        fail(field, "type '" + type + "' is not supported by tmx");
    }
};

// ---- normalizers

struct NormalizerStep {
    enum class Kind { Prepend, Replace, Unicode, Lowercase, Strip, StripAccents } kind;
    std::string text, content;
    Pattern pattern;
    const icu::Normalizer2* unicode = nullptr;
    bool left = false, right = false;
};

void read_normalizer(const Reader& r, const json& j, const std::string& field,
                     std::vector<NormalizerStep>& steps) {
    if (j.is_null()) return;
    const std::string type = r.type(j, field);
    NormalizerStep s{};
    if (type == "Sequence") {
        const json& list = r.at(j, "normalizers", field);
        if (!list.is_array()) r.fail(field + ".normalizers", "expected a list");
        for (size_t i = 0; i < list.size(); ++i)
            read_normalizer(r, list[i], field + ".normalizers[" + std::to_string(i) + "]", steps);
        return;
    }
    if (type == "Prepend") {
        s.kind = NormalizerStep::Kind::Prepend;
        s.text = r.str(j, "prepend", field);
    } else if (type == "Replace") {
        s.kind = NormalizerStep::Kind::Replace;
        s.pattern = r.pattern(j, field);
        s.content = r.str(j, "content", field);
    } else if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
        s.kind = NormalizerStep::Kind::Unicode;
        UErrorCode err = U_ZERO_ERROR;
        s.unicode = type == "NFC"    ? icu::Normalizer2::getNFCInstance(err)
                    : type == "NFD"  ? icu::Normalizer2::getNFDInstance(err)
                    : type == "NFKC" ? icu::Normalizer2::getNFKCInstance(err)
                                     : icu::Normalizer2::getNFKDInstance(err);
        if (U_FAILURE(err)) r.fail(field, "ICU has no " + type + " normalizer");
    } else if (type == "Lowercase") {
        s.kind = NormalizerStep::Kind::Lowercase;
    } else if (type == "Strip") {
        s.kind = NormalizerStep::Kind::Strip;
        s.left = r.flag(j, "strip_left", field, false);
        s.right = r.flag(j, "strip_right", field, false);
    } else if (type == "StripAccents") {
        s.kind = NormalizerStep::Kind::StripAccents;
    } else {
        r.unsupported(field, type);
    }
    steps.push_back(std::move(s));
}

std::string icu_normalize(const icu::Normalizer2& n, std::string_view s) {
    UErrorCode err = U_ZERO_ERROR;
    const icu::UnicodeString in =
        icu::UnicodeString::fromUTF8(icu::StringPiece(s.data(), static_cast<int32_t>(s.size())));
    const icu::UnicodeString out = n.normalize(in, err);
    if (U_FAILURE(err)) throw Error("tokenizer.json: Unicode normalization failed");
    std::string utf8;
    out.toUTF8String(utf8);
    return utf8;
}

void normalize(const std::vector<NormalizerStep>& steps, bool continuation, std::string& s) {
    for (const NormalizerStep& step : steps) {
        switch (step.kind) {
            case NormalizerStep::Kind::Prepend:
                // Before every stretch between added tokens, as the library does; not before
                // a continuation of an earlier piece of text.
                if (!s.empty() && !continuation) s.insert(0, step.text);
                break;
            case NormalizerStep::Kind::Replace:
                s = replace_all(s, step.pattern, step.content);
                break;
            case NormalizerStep::Kind::Unicode:
                s = icu_normalize(*step.unicode, s);
                break;
            case NormalizerStep::Kind::Lowercase: {
                icu::UnicodeString u = icu::UnicodeString::fromUTF8(
                    icu::StringPiece(s.data(), static_cast<int32_t>(s.size())));
                u.toLower(icu::Locale::getRoot());
                s.clear();
                u.toUTF8String(s);
                break;
            }
            case NormalizerStep::Kind::Strip: {
                size_t begin = 0, end = s.size();
                if (step.left)
                    for (size_t i = 0; i < s.size() && is_whitespace(next_code_point(s, i));)
                        begin = i;
                if (step.right)
                    while (end > begin) {
                        size_t k = end - 1;
                        while (k > begin && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
                        size_t i = k;
                        if (!is_whitespace(next_code_point(s, i))) break;
                        end = k;
                    }
                s = s.substr(begin, end - begin);
                break;
            }
            case NormalizerStep::Kind::StripAccents: {
                std::string out;
                for (size_t i = 0; i < s.size();) {
                    const char32_t c = next_code_point(s, i);
                    if (u_charType(static_cast<UChar32>(c)) != U_NON_SPACING_MARK)
                        append_utf8(c, out);
                }
                s = std::move(out);
                break;
            }
        }
    }
}

// ---- pre-tokenizers

enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

struct PreTokenizerStep {
    enum class Kind { Split, ByteLevel, Metaspace, Digits } kind;
    Pattern pattern;
    SplitBehavior behavior = SplitBehavior::Isolated;
    bool invert = false;
    bool add_prefix_space = false, use_regex = false;  // ByteLevel
    std::string replacement;                           // Metaspace
    enum class Prepend { Always, First, Never } prepend = Prepend::Always;
    bool split = false;              // Metaspace
    bool individual_digits = false;  // Digits
};

// GPT-2's pre-tokenizer pattern (the ByteLevel pre-tokenizer's use_regex).
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

SplitBehavior read_behavior(const Reader& r, const json& j, const std::string& field) {
    const std::string b = r.str(j, "behavior", field);
    if (b == "Removed") return SplitBehavior::Removed;
    if (b == "Isolated") return SplitBehavior::Isolated;
    if (b == "MergedWithPrevious") return SplitBehavior::MergedWithPrevious;
    if (b == "MergedWithNext") return SplitBehavior::MergedWithNext;
    if (b == "Contiguous") return SplitBehavior::Contiguous;
    r.fail(field + ".behavior", "unknown behavior '" + b + "'");
}

PreTokenizerStep::Prepend read_prepend_scheme(const Reader& r, const json& j,
                                              const std::string& field) {
    if (j.contains("prepend_scheme") && !j.at("prepend_scheme").is_null()) {
        const std::string s = r.str(j, "prepend_scheme", field);
        if (s == "always") return PreTokenizerStep::Prepend::Always;
        if (s == "first") return PreTokenizerStep::Prepend::First;
        if (s == "never") return PreTokenizerStep::Prepend::Never;
        r.fail(field + ".prepend_scheme", "expected always, first or never, got '" + s + "'");
    }
    // Files written before prepend_scheme existed say add_prefix_space.
    return r.flag(j, "add_prefix_space", field, true) ? PreTokenizerStep::Prepend::Always
                                                      : PreTokenizerStep::Prepend::Never;
}

std::string read_replacement(const Reader& r, const json& j, const std::string& field) {
    const std::string rep = r.str(j, "replacement", field);
    size_t i = 0;
    if (rep.empty() || (next_code_point(rep, i), i != rep.size()))
        r.fail(field + ".replacement", "expected one character");
    return rep;
}

void read_pre_tokenizer(const Reader& r, const json& j, const std::string& field,
                        std::vector<PreTokenizerStep>& steps) {
    if (j.is_null()) return;
    const std::string type = r.type(j, field);
    PreTokenizerStep s{};
    if (type == "Sequence") {
        const json& list = r.at(j, "pretokenizers", field);
        if (!list.is_array()) r.fail(field + ".pretokenizers", "expected a list");
        for (size_t i = 0; i < list.size(); ++i)
            read_pre_tokenizer(r, list[i], field + ".pretokenizers[" + std::to_string(i) + "]",
                               steps);
        return;
    }
    if (type == "Split") {
        s.kind = PreTokenizerStep::Kind::Split;
        s.pattern = r.pattern(j, field);
        s.behavior = read_behavior(r, j, field);
        s.invert = r.flag(j, "invert", field, false);
    } else if (type == "ByteLevel") {
        s.kind = PreTokenizerStep::Kind::ByteLevel;
        s.add_prefix_space = r.flag(j, "add_prefix_space", field, true);
        s.use_regex = r.flag(j, "use_regex", field, true);
        if (s.use_regex) s.pattern.regex = std::make_unique<Regex>(kGpt2Pattern, field);
    } else if (type == "Metaspace") {
        s.kind = PreTokenizerStep::Kind::Metaspace;
        s.replacement = read_replacement(r, j, field);
        s.prepend = read_prepend_scheme(r, j, field);
        s.split = r.flag(j, "split", field, true);
    } else if (type == "Digits") {
        s.kind = PreTokenizerStep::Kind::Digits;
        s.individual_digits = r.flag(j, "individual_digits", field, false);
    } else {
        r.unsupported(field, type);
    }
    steps.push_back(std::move(s));
}

// A stretch of text on its way to the model; `first`: it starts the text (a Metaspace "first"
// prefix goes only there).
struct Stretch {
    std::string text;
    bool first = false;
};

// s cut at the given delimiters (matches; with invert, the matches are what is kept and the
// rest are the delimiters), the delimiters treated as `behavior` says. Empty pieces vanish.
std::vector<std::string> split_by(std::string_view s,
                                  const std::vector<std::pair<size_t, size_t>>& matches,
                                  SplitBehavior behavior, bool invert) {
    struct Piece {
        size_t a, b;
        bool delimiter;
    };
    std::vector<Piece> pieces;
    size_t last = 0;
    for (const auto& [a, b] : matches) {
        if (a > last) pieces.push_back({last, a, invert});
        pieces.push_back({a, b, !invert});
        last = b;
    }
    if (last < s.size()) pieces.push_back({last, s.size(), invert});
    // As the library: a delimiter merges into its neighbour only when that one is not a
    // delimiter too; Contiguous joins runs of delimiters.
    std::vector<std::string> out;
    for (size_t i = 0; i < pieces.size(); ++i) {
        const Piece& p = pieces[i];
        const std::string_view text = s.substr(p.a, p.b - p.a);
        const bool after_delimiter = i > 0 && pieces[i - 1].delimiter;
        switch (behavior) {
            case SplitBehavior::Removed:
                if (!p.delimiter) out.emplace_back(text);
                break;
            case SplitBehavior::Isolated:
                out.emplace_back(text);
                break;
            case SplitBehavior::Contiguous:
                if (p.delimiter && after_delimiter)
                    out.back() += text;
                else
                    out.emplace_back(text);
                break;
            case SplitBehavior::MergedWithPrevious:
                if (p.delimiter && !after_delimiter && !out.empty())
                    out.back() += text;
                else
                    out.emplace_back(text);
                break;
            case SplitBehavior::MergedWithNext:
                if (after_delimiter && !p.delimiter)
                    out.back() += text;
                else
                    out.emplace_back(text);
                break;
        }
    }
    std::erase_if(out, [](const std::string& t) { return t.empty(); });
    return out;
}

// ---- decoders

struct DecoderStep {
    enum class Kind { Replace, ByteFallback, Fuse, Strip, ByteLevel, Metaspace } kind;
    Pattern pattern;
    std::string content;  // Replace: the replacement; Strip: the character stripped
    size_t start = 0, stop = 0;
    std::string replacement;  // Metaspace
    PreTokenizerStep::Prepend prepend = PreTokenizerStep::Prepend::Always;
};

void read_decoder(const Reader& r, const json& j, const std::string& field,
                  std::vector<DecoderStep>& steps) {
    if (j.is_null()) return;
    const std::string type = r.type(j, field);
    DecoderStep s{};
    if (type == "Sequence") {
        const json& list = r.at(j, "decoders", field);
        if (!list.is_array()) r.fail(field + ".decoders", "expected a list");
        for (size_t i = 0; i < list.size(); ++i)
            read_decoder(r, list[i], field + ".decoders[" + std::to_string(i) + "]", steps);
        return;
    }
    if (type == "Replace") {
        s.kind = DecoderStep::Kind::Replace;
        s.pattern = r.pattern(j, field);
        s.content = r.str(j, "content", field);
    } else if (type == "ByteFallback") {
        s.kind = DecoderStep::Kind::ByteFallback;
    } else if (type == "Fuse") {
        s.kind = DecoderStep::Kind::Fuse;
    } else if (type == "Strip") {
        s.kind = DecoderStep::Kind::Strip;
        s.content = read_replacement(r, {{"replacement", r.str(j, "content", field)}}, field);
        const int64_t start = r.integer(j, "start", field, 0),
                      stop = r.integer(j, "stop", field, 0);
        if (start < 0 || stop < 0 || start > 1 << 20 || stop > 1 << 20)
            r.fail(field, "start and stop must be counts of characters");
        s.start = static_cast<size_t>(start);
        s.stop = static_cast<size_t>(stop);
    } else if (type == "ByteLevel") {
        s.kind = DecoderStep::Kind::ByteLevel;
    } else if (type == "Metaspace") {
        s.kind = DecoderStep::Kind::Metaspace;
        s.replacement = read_replacement(r, j, field);
        s.prepend = read_prepend_scheme(r, j, field);
    } else {
        r.unsupported(field, type);
    }
    steps.push_back(std::move(s));
}

// The byte of a "<0xNN>" token, or -1.
int byte_token_value(std::string_view t) {
    if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
    const auto hex = [](char c) {
        return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    };
    const int hi = hex(t[3]), lo = hex(t[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

// A token's bytes through the byte-level alphabet; a token with a character outside it stays
// as its own UTF-8 (as the library's ByteLevel decoder does).
std::string byte_level_bytes(const std::string& token) {
    const ByteAlphabet& a = byte_alphabet();
    std::string bytes;
    for (size_t i = 0; i < token.size();) {
        const auto it = a.byte_of.find(next_code_point(token, i));
        if (it == a.byte_of.end()) return token;
        bytes.push_back(static_cast<char>(it->second));
    }
    return bytes;
}

void run_decoder(const std::vector<DecoderStep>& steps, std::vector<std::string>& tokens) {
    for (const DecoderStep& step : steps) {
        switch (step.kind) {
            case DecoderStep::Kind::Replace:
                for (std::string& t : tokens) t = replace_all(t, step.pattern, step.content);
                break;
            case DecoderStep::Kind::ByteFallback: {
                // Runs of <0xNN> tokens become their bytes as UTF-8, or one U+FFFD per byte
                // when the run is not valid UTF-8.
                std::vector<std::string> out;
                std::string run;
                size_t run_tokens = 0;
                const auto end_run = [&] {
                    if (run_tokens == 0) return;
                    if (lossy_utf8(run) == run) {
                        out.push_back(run);
                    } else {
                        for (size_t i = 0; i < run_tokens; ++i) out.emplace_back(kReplacementChar);
                    }
                    run.clear();
                    run_tokens = 0;
                };
                for (std::string& t : tokens) {
                    const int b = byte_token_value(t);
                    if (b >= 0) {
                        run.push_back(static_cast<char>(b));
                        ++run_tokens;
                        continue;
                    }
                    end_run();
                    out.push_back(std::move(t));
                }
                end_run();
                tokens = std::move(out);
                break;
            }
            case DecoderStep::Kind::Fuse: {
                std::string all;
                for (const std::string& t : tokens) all += t;
                tokens.assign(1, std::move(all));
                break;
            }
            case DecoderStep::Kind::Strip:
                for (std::string& t : tokens) {
                    size_t begin = 0, end = t.size();
                    for (size_t n = 0;
                         n < step.start && t.compare(begin, step.content.size(), step.content) == 0;
                         ++n)
                        begin += step.content.size();
                    for (size_t n = 0; n < step.stop && end >= begin + step.content.size() &&
                                       t.compare(end - step.content.size(), step.content.size(),
                                                 step.content) == 0;
                         ++n)
                        end -= step.content.size();
                    t = t.substr(begin, end - begin);
                }
                break;
            case DecoderStep::Kind::ByteLevel: {
                std::string bytes;
                for (const std::string& t : tokens) bytes += byte_level_bytes(t);
                tokens.assign(1, lossy_utf8(bytes));
                break;
            }
            case DecoderStep::Kind::Metaspace:
                for (size_t i = 0; i < tokens.size(); ++i) {
                    std::string t = replace_all(tokens[i], Pattern{step.replacement, nullptr}, " ");
                    if (i == 0 && step.prepend != PreTokenizerStep::Prepend::Never && !t.empty() &&
                        t[0] == ' ')
                        t.erase(0, 1);
                    tokens[i] = std::move(t);
                }
                break;
        }
    }
}

struct AddedToken {
    int32_t id = 0;
    std::string content;
    bool single_word = false, lstrip = false, rstrip = false, normalized = false, special = false;
};

}  // namespace

// ---------------------------------------------------------------------------------------------

struct TokenizerJson::Impl {
    std::string name;
    std::vector<std::string> tokens;                 // by id
    std::unordered_map<std::string, int32_t> vocab;  // the model's vocabulary
    std::unordered_map<std::string, int32_t> ids;    // every token, added ones included
    // (left id, right id) -> (rank, joined id)
    std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;
    int32_t unk = -1;
    bool byte_fallback = false, fuse_unk = false, ignore_merges = false;
    std::vector<AddedToken> added;  // by content length, longest first
    // By [normalized][first byte]: indices into `added`, longest first.
    std::array<std::array<std::vector<int>, 256>, 2> added_by_first_byte;
    std::vector<bool> special;
    std::vector<NormalizerStep> normalizer;
    std::vector<PreTokenizerStep> pre_tokenizer;
    std::vector<DecoderStep> decoder;

    static uint64_t pair_key(int32_t a, int32_t b) {
        return static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32 | static_cast<uint32_t>(b);
    }

    // The added tokens (with `normalized` as given) found in s, leftmost then longest, as
    // (token index or -1 for text between, begin, end).
    std::vector<std::tuple<int, size_t, size_t>> find_added(std::string_view s,
                                                            bool normalized) const {
        std::vector<std::tuple<int, size_t, size_t>> found;
        size_t covered = 0;  // the end of the last match, lstrip taken into account
        for (size_t i = 0; i < s.size();) {
            int best = -1;
            for (int k : added_by_first_byte[normalized][static_cast<unsigned char>(s[i])])
                if (s.compare(i, added[static_cast<size_t>(k)].content.size(),
                              added[static_cast<size_t>(k)].content) == 0) {
                    best = k;
                    break;  // longest first
                }
            if (best < 0) {
                ++i;
                continue;
            }
            const AddedToken& t = added[static_cast<size_t>(best)];
            size_t begin = i, end = i + t.content.size();
            i = end;  // the next match starts after this one, used or not
            if (t.single_word) {
                const bool before =
                    begin == 0 || !is_word_char(last_code_point(s.substr(0, begin)));
                size_t j = end;
                const bool after = end == s.size() || !is_word_char(next_code_point(s, j));
                if (!before || !after) continue;
            }
            if (t.lstrip) {
                size_t b = begin;
                while (b > covered) {
                    size_t k = b - 1;
                    while (k > covered && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
                    size_t j = k;
                    if (!is_whitespace(next_code_point(s, j))) break;
                    b = k;
                }
                begin = b;
            }
            if (t.rstrip)
                for (size_t j = end; j < s.size();) {
                    if (!is_whitespace(next_code_point(s, j))) break;
                    end = j;
                }
            found.emplace_back(best, begin, end);
            covered = end;
        }
        // Interleave the text between the matches.
        std::vector<std::tuple<int, size_t, size_t>> out;
        size_t last = 0;
        for (const auto& [k, a, b] : found) {
            if (a > last) out.emplace_back(-1, last, a);
            out.emplace_back(k, a, b);
            last = std::max(last, b);
        }
        if (last < s.size()) out.emplace_back(-1, last, s.size());
        return out;
    }

    void pre_tokenize(std::vector<Stretch>& stretches) const {
        const ByteAlphabet& alphabet = byte_alphabet();
        for (const PreTokenizerStep& step : pre_tokenizer) {
            std::vector<Stretch> next;
            for (Stretch& st : stretches) {
                std::vector<std::string> parts;
                switch (step.kind) {
                    case PreTokenizerStep::Kind::Split:
                        parts = split_by(st.text, step.pattern.find_all(st.text), step.behavior,
                                         step.invert);
                        break;
                    case PreTokenizerStep::Kind::ByteLevel: {
                        std::string text = st.text;
                        if (step.add_prefix_space && !text.empty() && text[0] != ' ')
                            text = " " + text;
                        if (step.use_regex)
                            parts = split_by(text, step.pattern.find_all(text),
                                             SplitBehavior::Isolated, false);
                        else
                            parts = {text};
                        for (std::string& p : parts) {
                            std::string mapped;
                            for (unsigned char c : p) mapped += alphabet.char_of[c];
                            p = std::move(mapped);
                        }
                        break;
                    }
                    case PreTokenizerStep::Kind::Metaspace: {
                        std::string text =
                            replace_all(st.text, Pattern{" ", nullptr}, step.replacement);
                        const bool prepend =
                            step.prepend == PreTokenizerStep::Prepend::Always ||
                            (step.prepend == PreTokenizerStep::Prepend::First && st.first);
                        if (prepend && text.compare(0, step.replacement.size(), step.replacement))
                            text.insert(0, step.replacement);
                        if (step.split)
                            parts =
                                split_by(text, Pattern{step.replacement, nullptr}.find_all(text),
                                         SplitBehavior::MergedWithNext, false);
                        else
                            parts = {text};
                        break;
                    }
                    case PreTokenizerStep::Kind::Digits: {
                        std::vector<std::pair<size_t, size_t>> digits;
                        for (size_t i = 0; i < st.text.size();) {
                            const size_t at = i;
                            if (!is_numeric(next_code_point(st.text, i))) continue;
                            if (!step.individual_digits && !digits.empty() &&
                                digits.back().second == at)
                                digits.back().second = i;
                            else
                                digits.emplace_back(at, i);
                        }
                        parts = split_by(st.text, digits, SplitBehavior::Isolated, false);
                        break;
                    }
                }
                for (size_t i = 0; i < parts.size(); ++i)
                    next.push_back({std::move(parts[i]), st.first && i == 0});
            }
            stretches = std::move(next);
        }
    }

    // BPE on one word.
    void bpe(const std::string& word, std::vector<int32_t>& out) const {
        if (ignore_merges)
            if (const auto it = vocab.find(word); it != vocab.end()) {
                out.push_back(it->second);
                return;
            }
        struct Symbol {
            int32_t id;
            int prev, next;
        };
        std::vector<Symbol> sym;
        bool last_unk = false;
        for (size_t i = 0; i < word.size();) {
            const size_t len =
                std::max<size_t>(1, utf8_char_length(std::string_view(word).substr(i)));
            const std::string ch = word.substr(i, len);
            i += len;
            if (const auto it = vocab.find(ch); it != vocab.end()) {
                sym.push_back({it->second, 0, 0});
                last_unk = false;
                continue;
            }
            if (byte_fallback) {
                std::vector<int32_t> bytes;
                for (unsigned char b : ch) {
                    char piece[7];
                    std::snprintf(piece, sizeof(piece), "<0x%02X>", b);
                    const auto it = vocab.find(piece);
                    if (it == vocab.end()) break;
                    bytes.push_back(it->second);
                }
                if (bytes.size() == ch.size()) {
                    for (int32_t b : bytes) sym.push_back({b, 0, 0});
                    last_unk = false;
                    continue;
                }
            }
            if (unk >= 0) {
                if (!(fuse_unk && last_unk)) sym.push_back({unk, 0, 0});
                last_unk = true;
            }
        }
        const int n = static_cast<int>(sym.size());
        for (int k = 0; k < n; ++k) {
            sym[k].prev = k - 1;
            sym[k].next = k + 1 < n ? k + 1 : -1;
        }
        // (rank, position, joined id): the lowest rank first, then the leftmost.
        using Entry = std::tuple<int32_t, int, int32_t>;
        std::priority_queue<Entry, std::vector<Entry>, std::greater<>> queue;
        const auto push = [&](int left) {
            if (left < 0 || sym[left].next < 0) return;
            const auto it = merges.find(pair_key(sym[left].id, sym[sym[left].next].id));
            if (it != merges.end()) queue.emplace(it->second.first, left, it->second.second);
        };
        for (int k = 0; k + 1 < n; ++k) push(k);
        std::vector<bool> gone(static_cast<size_t>(n));
        while (!queue.empty()) {
            const auto [rank, left, joined] = queue.top();
            queue.pop();
            if (gone[left] || sym[left].next < 0) continue;
            const int right = sym[left].next;
            const auto it = merges.find(pair_key(sym[left].id, sym[right].id));
            if (it == merges.end() || it->second.second != joined) continue;  // stale entry
            sym[left].id = joined;
            gone[right] = true;
            sym[left].next = sym[right].next;
            if (sym[right].next >= 0) sym[sym[right].next].prev = left;
            push(sym[left].prev);
            push(left);
        }
        for (int k = 0; k >= 0 && k < n; k = sym[k].next) out.push_back(sym[k].id);
    }

    void encode(std::string_view raw, bool continuation, std::vector<int32_t>& out) const {
        out.clear();
        const std::string text = valid_utf8(raw);
        for (const auto& [k, a, b] : find_added(text, false)) {
            if (k >= 0) {
                out.push_back(added[static_cast<size_t>(k)].id);
                continue;
            }
            std::string segment = text.substr(a, b - a);
            normalize(normalizer, continuation && a == 0, segment);
            std::vector<Stretch> stretches;
            for (const auto& [k2, a2, b2] : find_added(segment, true)) {
                if (k2 >= 0) {
                    // Added tokens found after normalization: flush what came before.
                    pre_tokenize(stretches);
                    for (const Stretch& s : stretches) bpe(s.text, out);
                    stretches.clear();
                    out.push_back(added[static_cast<size_t>(k2)].id);
                    continue;
                }
                stretches.push_back(
                    {segment.substr(a2, b2 - a2), a == 0 && a2 == 0 && !continuation});
            }
            pre_tokenize(stretches);
            for (const Stretch& s : stretches) bpe(s.text, out);
        }
    }
};

TokenizerJson::TokenizerJson(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TokenizerJson::~TokenizerJson() = default;

std::unique_ptr<TokenizerJson> TokenizerJson::parse(std::string_view json_text,
                                                    const std::string& name) {
    json doc;
    try {
        doc = json::parse(json_text);
    } catch (const json::exception& e) {
        throw Error(name + ": not valid JSON (" + e.what() + ")");
    }
    const Reader r{name};
    auto impl = std::make_unique<Impl>();
    impl->name = name;
    const json& model = r.at(doc, "model", "tokenizer.json");
    // Files from before `type` was written hold a BPE model when they have merges.
    const std::string model_type =
        model.is_object() && !model.contains("type") && model.contains("merges")
            ? "BPE"
            : r.type(model, "model");
    if (model_type != "BPE")
        r.fail("model.type", "'" + model_type +
                                 "' models are not supported by tmx (BPE models are: "
                                 "SentencePiece-style with byte fallback, and byte-level)");
    if (model.contains("dropout") && !model.at("dropout").is_null() &&
        !(model.at("dropout").is_number() && model.at("dropout").get<double>() == 0.0))
        r.fail("model.dropout", "BPE dropout (random tokenization) is not supported by tmx");
    for (const char* field : {"continuing_subword_prefix", "end_of_word_suffix"})
        if (model.contains(field) && !model.at(field).is_null() &&
            !(model.at(field).is_string() && model.at(field).get<std::string>().empty()))
            r.fail(std::string("model.") + field, "not supported by tmx (WordPiece-style BPE)");
    impl->byte_fallback = r.flag(model, "byte_fallback", "model", false);
    impl->fuse_unk = r.flag(model, "fuse_unk", "model", false);
    impl->ignore_merges = r.flag(model, "ignore_merges", "model", false);

    const json& vocab = r.at(model, "vocab", "model");
    if (!vocab.is_object()) r.fail("model.vocab", "expected an object of token: id");
    constexpr int64_t kMaxId = int64_t{1} << 24;  // 16M tokens: far above any real vocabulary
    const auto place = [&](const std::string& token, int64_t id, const std::string& field) {
        if (id < 0 || id >= kMaxId)
            r.fail(field, "id " + std::to_string(id) + " out of range [0, 2^24)");
        if (static_cast<size_t>(id) >= impl->tokens.size())
            impl->tokens.resize(static_cast<size_t>(id) + 1);
        impl->tokens[static_cast<size_t>(id)] = token;
        impl->ids[token] = static_cast<int32_t>(id);
    };
    for (const auto& [token, id] : vocab.items()) {
        if (!id.is_number_integer()) r.fail("model.vocab." + token, "expected an integer id");
        place(token, id.get<int64_t>(), "model.vocab." + token);
        impl->vocab[token] = static_cast<int32_t>(id.get<int64_t>());
    }
    const json& merges = r.at(model, "merges", "model");
    if (!merges.is_array()) r.fail("model.merges", "expected a list");
    for (size_t i = 0; i < merges.size(); ++i) {
        const json& m = merges[i];
        const std::string field = "model.merges[" + std::to_string(i) + "]";
        std::string a, b;
        if (m.is_string()) {  // "a b"
            const std::string s = m.get<std::string>();
            const size_t space = s.find(' ');
            if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
                r.fail(field, "expected two tokens separated by one space");
            a = s.substr(0, space);
            b = s.substr(space + 1);
        } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
            a = m[0].get<std::string>();
            b = m[1].get<std::string>();
        } else {
            r.fail(field, "expected \"a b\" or [\"a\", \"b\"]");
        }
        const auto ia = impl->vocab.find(a), ib = impl->vocab.find(b), ij = impl->vocab.find(a + b);
        if (ia == impl->vocab.end() || ib == impl->vocab.end() || ij == impl->vocab.end())
            r.fail(field,
                   "'" + a + "' + '" + b + "': a token (or their join) is not in the vocabulary");
        impl->merges[Impl::pair_key(ia->second, ib->second)] = {static_cast<int32_t>(i),
                                                                ij->second};
    }
    if (model.contains("unk_token") && !model.at("unk_token").is_null()) {
        const std::string unk = r.str(model, "unk_token", "model");
        const auto it = impl->vocab.find(unk);
        if (it == impl->vocab.end())
            r.fail("model.unk_token", "'" + unk + "' is not in the vocabulary");
        impl->unk = it->second;
    }

    if (doc.contains("added_tokens") && !doc.at("added_tokens").is_null()) {
        const json& list = doc.at("added_tokens");
        if (!list.is_array()) r.fail("added_tokens", "expected a list");
        for (size_t i = 0; i < list.size(); ++i) {
            const std::string field = "added_tokens[" + std::to_string(i) + "]";
            const json& t = list[i];
            AddedToken a;
            a.content = r.str(t, "content", field);
            a.id = static_cast<int32_t>(r.integer(t, "id", field, -1));
            place(a.content, a.id, field + ".id");
            a.single_word = r.flag(t, "single_word", field, false);
            a.lstrip = r.flag(t, "lstrip", field, false);
            a.rstrip = r.flag(t, "rstrip", field, false);
            a.special = r.flag(t, "special", field, false);
            a.normalized = r.flag(t, "normalized", field, !a.special);
            impl->added.push_back(std::move(a));
        }
    }
    std::stable_sort(impl->added.begin(), impl->added.end(),
                     [](const AddedToken& x, const AddedToken& y) {
                         return x.content.size() > y.content.size();
                     });
    for (size_t k = 0; k < impl->added.size(); ++k) {
        const AddedToken& a = impl->added[k];
        if (!a.content.empty())
            impl->added_by_first_byte[a.normalized][static_cast<unsigned char>(a.content[0])]
                .push_back(static_cast<int>(k));
    }
    impl->special.assign(impl->tokens.size(), false);
    for (const AddedToken& a : impl->added) impl->special[static_cast<size_t>(a.id)] = a.special;

    read_normalizer(r, doc.value("normalizer", json()), "normalizer", impl->normalizer);
    read_pre_tokenizer(r, doc.value("pre_tokenizer", json()), "pre_tokenizer", impl->pre_tokenizer);
    read_decoder(r, doc.value("decoder", json()), "decoder", impl->decoder);
    // The post-processor adds special tokens around a text (add_special_tokens); tmx adds BOS
    // itself, so it only has to be one of the kinds that add nothing else unawares.
    std::function<void(const json&, const std::string&)> check_post = [&](const json& p,
                                                                          const std::string& f) {
        if (p.is_null()) return;
        const std::string type = r.type(p, f);
        if (type == "Sequence") {
            const json& list = r.at(p, "processors", f);
            if (!list.is_array()) r.fail(f + ".processors", "expected a list");
            for (size_t i = 0; i < list.size(); ++i)
                check_post(list[i], f + ".processors[" + std::to_string(i) + "]");
        } else if (type != "TemplateProcessing" && type != "ByteLevel") {
            r.unsupported(f, type);
        }
    };
    check_post(doc.value("post_processor", json()), "post_processor");
    return std::unique_ptr<TokenizerJson>(new TokenizerJson(std::move(impl)));
}

int32_t TokenizerJson::vocab_size() const {
    return static_cast<int32_t>(impl_->tokens.size());
}

const std::string& TokenizerJson::token(int32_t id) const {
    static const std::string none;
    return id >= 0 && id < vocab_size() ? impl_->tokens[static_cast<size_t>(id)] : none;
}

int32_t TokenizerJson::id_of(std::string_view token) const {
    const auto it = impl_->ids.find(std::string(token));
    return it == impl_->ids.end() ? -1 : it->second;
}

bool TokenizerJson::is_special(int32_t id) const {
    return id >= 0 && id < vocab_size() && impl_->special[static_cast<size_t>(id)];
}

bool TokenizerJson::is_byte_fallback(int32_t id) const {
    return impl_->byte_fallback && byte_token_value(token(id)) >= 0;
}

int32_t TokenizerJson::unk_id() const {
    return impl_->unk;
}

void TokenizerJson::encode(std::string_view text, bool continuation,
                           std::vector<int32_t>& out) const {
    impl_->encode(text, continuation, out);
}

std::string TokenizerJson::decode(const std::vector<int32_t>& ids) const {
    std::vector<std::string> tokens;
    for (int32_t id : ids)
        if (!is_special(id) && !token(id).empty()) tokens.push_back(token(id));
    if (impl_->decoder.empty()) {
        std::string out;
        for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
        return out;
    }
    run_decoder(impl_->decoder, tokens);
    std::string out;
    for (const std::string& t : tokens) out += t;
    return out;
}

TokenizerJson::Piece TokenizerJson::piece(int32_t id) const {
    Piece p;
    if (is_special(id) || token(id).empty()) {
        p.kind = Piece::Kind::Special;
        return p;
    }
    std::string t = token(id);
    for (const DecoderStep& step : impl_->decoder) {
        switch (step.kind) {
            case DecoderStep::Kind::ByteLevel:
                p.kind = Piece::Kind::Bytes;
                p.text = byte_level_bytes(t);
                return p;
            case DecoderStep::Kind::ByteFallback:
                if (const int b = byte_token_value(t); b >= 0) {
                    p.kind = Piece::Kind::Bytes;
                    p.text = std::string(1, static_cast<char>(b));
                    return p;
                }
                break;
            case DecoderStep::Kind::Replace:
                t = replace_all(t, step.pattern, step.content);
                break;
            case DecoderStep::Kind::Strip:
                if (step.start > 0 && step.content == " ") p.strip_first_space = true;
                break;
            case DecoderStep::Kind::Metaspace:
                t = replace_all(t, Pattern{step.replacement, nullptr}, " ");
                if (step.prepend != PreTokenizerStep::Prepend::Never) p.strip_first_space = true;
                break;
            case DecoderStep::Kind::Fuse:
                break;
        }
    }
    p.text = std::move(t);
    return p;
}

}  // namespace tmx

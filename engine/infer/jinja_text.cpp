// Python's str operations for the Jinja subset (jinja_detail.h): case mapping (of ASCII text;
// other text is refused rather than mapped by rules that differ from Python's), replace, split
// and splitlines.
#include <algorithm>

#include "engine/infer/jinja_detail.h"

namespace tmx::jinja::detail {

void require_ascii(const std::string& s, std::string_view what) {
    for (const char c : s)
        if (static_cast<unsigned char>(c) >= 0x80)
            fail(std::string(what) + " of text beyond ASCII is not supported");
}
namespace {
char up(char c) {
    return c >= 'a' && c <= 'z' ? static_cast<char>(c - 32) : c;
}
char down(char c) {
    return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c;
}
bool is_letter(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
}  // namespace

std::string ascii_case(std::string s, bool upper, std::string_view what) {
    require_ascii(s, what);
    std::transform(s.begin(), s.end(), s.begin(), upper ? up : down);
    return s;
}
std::string capitalized(std::string s) {
    s = ascii_case(std::move(s), false, "capitalize");
    if (!s.empty()) s[0] = up(s[0]);
    return s;
}
// str.title(): a letter after a letter is lower case, any other letter upper case.
std::string py_title(std::string s) {
    require_ascii(s, "title");
    bool after_letter = false;
    for (char& c : s) {
        c = is_letter(c) ? (after_letter ? down(c) : up(c)) : c;
        after_letter = is_letter(c);
    }
    return s;
}
// Jinja's title filter: each word after a run of whitespace, '-', '(', '{', '[' or '<' is
// capitalized.
std::string jinja_title(const std::string& s) {
    require_ascii(s, "title");
    std::string out = s;
    bool word_start = true;
    for (char& c : out) {
        const bool separator =
            std::string_view(" \t\n\r\f\v\x1c\x1d\x1e\x1f-({[<").find(c) != std::string_view::npos;
        c = separator ? c : word_start ? up(c) : down(c);
        word_start = separator;
    }
    return out;
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& with,
                       int64_t count, Budget& budget) {
    std::string out;
    if (old.empty()) {  // between every character, and at both ends
        const std::u32string text = decode(s);
        int64_t done = 0;
        for (size_t i = 0; i <= text.size(); ++i) {
            if (count < 0 || done < count) out += with, ++done;
            if (i < text.size()) out += encode(text.substr(i, 1));
            budget.built(with.size() + 4);
        }
        return out;
    }
    size_t from = 0;
    for (int64_t done = 0; count < 0 || done < count; ++done) {
        const size_t at = s.find(old, from);
        if (at == std::string::npos) break;
        out.append(s, from, at - from);
        out += with;
        budget.built(at - from + with.size());
        from = at + old.size();
    }
    return out + s.substr(from);
}

// str.split and str.rsplit: on runs of whitespace without `sep`, else on each `sep`.
Value py_split(const std::string& s, const std::optional<Value>& sep_arg, int64_t maxsplit,
               bool from_right, Budget& budget) {
    std::vector<std::string> parts;
    if (!sep_arg || sep_arg->is(Value::Type::None)) {
        std::u32string text = decode(s);
        if (from_right) std::reverse(text.begin(), text.end());
        size_t i = 0;
        while (true) {
            while (i < text.size() && is_space(text[i])) ++i;
            if (i >= text.size()) break;
            if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
                size_t end = text.size();
                while (end > i && is_space(text[end - 1])) --end;
                std::u32string rest = text.substr(i, end - i);
                if (from_right) std::reverse(rest.begin(), rest.end());
                parts.push_back(encode(rest));
                break;
            }
            const size_t start = i;
            while (i < text.size() && !is_space(text[i])) ++i;
            std::u32string word = text.substr(start, i - start);
            if (from_right) std::reverse(word.begin(), word.end());
            parts.push_back(encode(word));
        }
    } else {
        if (!sep_arg->is(Value::Type::String))
            fail("must be str or None, not " + type_name(*sep_arg));
        const std::string& sep = sep_arg->text;
        if (sep.empty()) fail("empty separator");
        size_t end = s.size();
        size_t start = 0;
        while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
            const size_t at = from_right ? (end >= sep.size() ? s.rfind(sep, end - sep.size())
                                                              : std::string::npos)
                                         : s.find(sep, start);
            if (at == std::string::npos) break;
            if (from_right) {
                parts.push_back(s.substr(at + sep.size(), end - at - sep.size()));
                end = at;
            } else {
                parts.push_back(s.substr(start, at - start));
                start = at + sep.size();
            }
        }
        parts.push_back(from_right ? s.substr(0, end) : s.substr(start));
    }
    if (from_right) std::reverse(parts.begin(), parts.end());
    std::vector<Value> items;
    for (std::string& p : parts) items.push_back(Value::of(std::move(p)));
    budget.built(s.size() + 8 * items.size());
    return Value::of_list(std::move(items));
}

std::vector<std::u32string> split_lines(const std::u32string& text) {
    std::vector<std::u32string> lines;
    size_t start = 0;
    for (size_t i = 0; i < text.size(); ++i) {
        const char32_t c = text[i];
        if (c == U'\n' || c == U'\r' || c == 0x0B || c == 0x0C || (c >= 0x1C && c <= 0x1E) ||
            c == 0x85 || c == 0x2028 || c == 0x2029) {
            lines.push_back(text.substr(start, i - start));
            if (c == U'\r' && i + 1 < text.size() && text[i + 1] == U'\n') ++i;
            start = i + 1;
        }
    }
    if (start < text.size()) lines.push_back(text.substr(start));
    return lines;
}

bool ascii_cased_all(const std::string& s, bool lower, std::string_view what) {
    require_ascii(s, what);
    bool cased = false;
    for (const char c : s) {
        if (!is_letter(c)) continue;
        cased = true;
        if ((c >= 'a' && c <= 'z') != lower) return false;
    }
    return cased;
}

}  // namespace tmx::jinja::detail

#include "engine/core/option_text.h"

namespace tmx {

OptionText::OptionText(std::string text) {
    if (!text.empty()) pieces_.push_back({std::move(text), false});
}

OptionText::OptionText(const char* text) : OptionText(std::string(text)) {}

std::string OptionText::spelled(const OptionSpelling& spell) const {
    std::string out;
    for (const Piece& p : pieces_) out += p.option && spell ? spell(p.text) : p.text;
    return out;
}

OptionText operator+(OptionText a, const OptionText& b) {
    a.pieces_.insert(a.pieces_.end(), b.pieces_.begin(), b.pieces_.end());
    return a;
}

OptionText opt(std::string_view field) {
    OptionText t;
    t.pieces_.push_back({std::string(field), true});
    return t;
}

}  // namespace tmx

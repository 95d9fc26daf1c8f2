// How the engine names the options of whoever called it (a command's flags, a request's fields)
// in its messages and reports, without knowing how that caller spells them.
//
// An option is named by its field: a stable identifier of what it means, the name of the member
// of the options struct that holds it ("train_batch" of BenchOptions, "temperature" of
// SamplingOptions, "overwrite" of the writers' options). Text names it with opt(field); a front
// end spells it its own way when it prints the text (tmx prints the flag that sets it:
// apps/option_flags.h), and a caller that spells nothing sees the field itself:
//
//     throw UsageError(opt("train_batch") + " and " + opt("train_seq") + " go together");
//
// has what() "train_batch and train_seq go together", and tmx prints it with its flags. Two
// structs whose members share a name mean the same option (BenchOptions and ReportOptions both
// have `batch`); a member that means something else gets a field qualified by its struct.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace tmx {

// A front end's spelling of an option's field; an empty one leaves the field as it is.
using OptionSpelling = std::function<std::string(std::string_view field)>;

// Text that names options: plain text and option fields in order, spelt when printed.
class OptionText {
  public:
    OptionText() = default;
    OptionText(std::string text);  // NOLINT: plain text converts implicitly, as in "a" + opt(f)
    OptionText(const char* text);  // NOLINT

    // The text with each option spelt by `spell` (by its field when `spell` is empty).
    std::string spelled(const OptionSpelling& spell = {}) const;

    friend OptionText operator+(OptionText a, const OptionText& b);
    friend OptionText opt(std::string_view field);

  private:
    struct Piece {
        std::string text;     // plain text, or a field
        bool option = false;  // whether `text` is a field
    };
    std::vector<Piece> pieces_;
};

// An option named in a message, by its field: opt("val_fraction") + " must be in [0, 1]".
OptionText opt(std::string_view field);

}  // namespace tmx

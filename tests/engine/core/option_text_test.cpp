// Text that names options (engine/core/option_text.h) and the errors that carry it: what() names
// each option by its field, message() as the caller spells it, and context added on the way up
// keeps the options.
#include <gtest/gtest.h>

#include <cctype>
#include <string>
#include <string_view>

#include "engine/core/errors.h"

namespace tmx {
namespace {

std::string shouted(std::string_view field) {
    std::string s = "<";
    for (char c : field) s += static_cast<char>(c == '_' ? '-' : std::toupper(c));
    return s + ">";
}

TEST(OptionText, SpellsEachOptionInPlaceAndLeavesTheTextAlone) {
    const OptionText t = "tmx bench: " + opt("train_batch") + " " + std::to_string(8) + " and " +
                         opt("train_seq") + ": want {train_batch}";
    EXPECT_EQ(t.spelled(), "tmx bench: train_batch 8 and train_seq: want {train_batch}");
    EXPECT_EQ(t.spelled(shouted), "tmx bench: <TRAIN-BATCH> 8 and <TRAIN-SEQ>: want {train_batch}");
    EXPECT_EQ(OptionText().spelled(shouted), "");
    EXPECT_EQ(OptionText("no options").spelled(shouted), "no options");
}

TEST(OptionText, ErrorsNameOptionsByFieldAndKeepThemThroughContext) {
    const UsageError e(opt("max_new_tokens") + " must be >= 0");
    EXPECT_EQ(std::string(e.what()), "max_new_tokens must be >= 0");
    EXPECT_EQ(e.message(shouted), "<MAX-NEW-TOKENS> must be >= 0");

    const Error wrapped("prompt 2: " + e.text());
    EXPECT_EQ(std::string(wrapped.what()), "prompt 2: max_new_tokens must be >= 0");
    EXPECT_EQ(wrapped.message(shouted), "prompt 2: <MAX-NEW-TOKENS> must be >= 0");

    // A copy (as a thrown exception is) carries the same options.
    const Error copy = wrapped;
    EXPECT_EQ(copy.message(shouted), wrapped.message(shouted));

    // An error built from a string names no option: message() is what().
    const Error plain(std::string("file.json: not valid JSON"));
    EXPECT_EQ(plain.message(shouted), "file.json: not valid JSON");
    EXPECT_EQ(plain.text().spelled(shouted), "file.json: not valid JSON");
}

}  // namespace
}  // namespace tmx

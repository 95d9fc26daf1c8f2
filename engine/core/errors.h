// Errors the engine reports to users. Each carries its context (file, field, option, tensor) in
// the message; the CLI turns it into one line and an exit code (2 for usage, 1 otherwise). A
// message may name options (option_text.h): what() names them by field, message() as the
// caller spells them.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>

#include "engine/core/option_text.h"

namespace tmx {

// Anything wrong with input data, files or the environment.
class Error : public std::runtime_error {
  public:
    using std::runtime_error::runtime_error;
    explicit Error(const OptionText& text)
        : std::runtime_error(text.spelled()), text_(std::make_shared<const OptionText>(text)) {}

    // The message as text that names options: for a caller that adds context and throws again
    // (plain text for an error built from a string).
    OptionText text() const { return text_ ? *text_ : OptionText(what()); }
    // The message with its options spelt by `spell`.
    std::string message(const OptionSpelling& spell) const { return text().spelled(spell); }

  private:
    std::shared_ptr<const OptionText> text_;  // shared: exceptions are copied
};

// Wrong usage (bad option values, conflicting options): exit code 2.
class UsageError : public Error {
  public:
    using Error::Error;
};

}  // namespace tmx

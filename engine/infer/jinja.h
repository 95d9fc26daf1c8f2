// The subset of Jinja2 that chat templates use (the prompt formats in tokenizer_config.json),
// parsed and rendered as transformers renders them: Jinja2 with trim_blocks and lstrip_blocks,
// the loopcontrols extension, its immutable sandbox and transformers' own tojson, raise_exception
// and strftime_now. Values behave as in Python (ints, floats, str, list, dict, None, Jinja's
// Undefined). What the subset lacks (a tag, filter, test, function or method) is refused by name
// when the template is parsed; what only rendering can tell (a type a filter does not take,
// printing a list) fails the render with a message; nothing is approximated. Limits on the
// template's size, its nesting and the work and output of one render bound hostile templates.
//
// chat_template.h builds the chat API on this; jinja_*.cpp hold the lexer, the parser, the
// values and the interpreter.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "engine/core/errors.h"

namespace tmx::jinja {

struct Limits {
    size_t max_template_bytes = 1 << 20;
    // Blocks inside blocks, and operators and calls inside an expression, each.
    int max_nesting = 48;
    int max_call_depth = 16;  // macro calls inside macro calls
    // Per render: the rendered text, expressions evaluated, and bytes of strings and list items
    // built along the way (what bounds a loop that doubles a string).
    size_t max_output_bytes = 8 << 20;
    int64_t max_steps = 5'000'000;
    int64_t max_built_bytes = 256 << 20;
};

// What a template raised through raise_exception(message): its own words, for callers that pass
// them on to a user (a 400 answer), besides the full what() with the template's name.
class TemplateRaised : public Error {
  public:
    TemplateRaised(const std::string& what, std::string message)
        : Error(what), message_(std::move(message)) {}
    const std::string& message() const { return message_; }

  private:
    std::string message_;
};

class Template {
  public:
    // Errors are tmx::Error "SOURCE: line N: WHAT" (a syntax error, or what the subset lacks,
    // by name).
    static Template parse(std::string_view text, const std::string& source,
                          const Limits& limits = {});
    // Renders with `vars` (a JSON object: its keys are the template's variables; objects keep
    // their order, as Python's dicts do). Errors are tmx::Error "SOURCE: line N: WHAT", and
    // TemplateRaised for raise_exception.
    std::string render(const nlohmann::ordered_json& vars) const;

    struct Impl;

  private:
    explicit Template(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
    std::shared_ptr<const Impl> impl_;
};

}  // namespace tmx::jinja

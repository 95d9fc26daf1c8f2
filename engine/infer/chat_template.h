// A chat model's prompt format: the Jinja template of its tokenizer_config.json
// ("chat_template"), rendered from a conversation as transformers' apply_chat_template renders
// it (the Jinja subset of jinja.h), and the reader of that file's chat fields.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/infer/jinja.h"

namespace tmx {

struct ChatMessage {
    std::string role, content;
};

// Variables beside `messages` and `add_generation_prompt`: the special tokens, and any others
// a template reads (e.g. {"enable_thinking": false}, {"tools": [...]}; a JSON object whose
// keys override bos_token and eos_token).
struct ChatTemplateVars {
    std::string bos_token, eos_token;
    nlohmann::ordered_json extra = nlohmann::ordered_json::object();
};

class ChatTemplate {
  public:
    // Errors name `source` (e.g. "model/tokenizer_config.json: chat_template"), the line, and
    // what is wrong or outside the subset.
    static ChatTemplate parse(std::string_view text, const std::string& source,
                              const jinja::Limits& limits = {});
    // The prompt for `messages`, ending with the assistant's header when add_generation_prompt.
    // A template that refuses the conversation (roles out of order) throws jinja::TemplateRaised
    // with its message.
    std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                       const ChatTemplateVars& vars) const;

  private:
    explicit ChatTemplate(jinja::Template t) : template_(std::move(t)) {}
    jinja::Template template_;
};

// The chat fields of a tokenizer_config.json. chat_template is a string, or a list of
// {"name", "template"} (the one named "default" is taken); bos_token and eos_token are strings
// or {"content": ...} objects (null or absent: ""). Errors name the file and the field.
struct TokenizerChatConfig {
    std::optional<std::string> chat_template;  // absent: the tokenizer has none
    std::string chat_template_source;          // "PATH: chat_template", for parse()
    std::string bos_token, eos_token;
};
TokenizerChatConfig parse_tokenizer_chat_config(std::string_view json_text,
                                                const std::string& source);
TokenizerChatConfig read_tokenizer_chat_config(const std::string& path);

}  // namespace tmx

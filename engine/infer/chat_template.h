// A chat model's prompt format: the Jinja template of its tokenizer_config.json
// ("chat_template"), rendered from a conversation as transformers' apply_chat_template renders
// it (the Jinja subset of jinja.h), and the reader of that file's chat fields.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/data/tokenizer.h"
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

// How a conversation becomes a model's prompt (tmx serve's /v1/chat/completions, tmx generate
// --chat): the model's chat template, rendered with a generation prompt and tokenized with its
// special tokens as their ids (no BOS added: the template writes the one it wants); or, for a
// model without one, tmx's plain format after a BOS (where the tokenizer has one): one line
// "role: content" per message, then "assistant:".
class ChatPrompt {
  public:
    // The template of `tokenizer_path`'s tokenizer_config.json (the file beside the tokenizer),
    // or of `template_file` (a Jinja file) when given; the plain format when neither has one.
    static ChatPrompt for_tokenizer(const Tokenizer& tokenizer, const std::string& tokenizer_path,
                                    const std::string& template_file = "");
    // Errors: jinja::TemplateRaised when the template refuses the conversation (roles out of
    // order), with the template's message.
    std::vector<int32_t> tokens(const std::vector<ChatMessage>& messages) const;
    std::string text(const std::vector<ChatMessage>& messages) const;
    // Where the format comes from, for a start-up line: "PATH: chat_template", "FILE", or
    // "built-in (...)".
    const std::string& source() const { return source_; }
    bool built_in() const { return !template_; }

  private:
    ChatPrompt(const Tokenizer& tokenizer) : tokenizer_(&tokenizer) {}
    const Tokenizer* tokenizer_;
    std::optional<ChatTemplate> template_;
    ChatTemplateVars vars_;
    std::string source_;
};

}  // namespace tmx

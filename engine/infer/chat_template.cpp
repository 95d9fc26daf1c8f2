// A chat model's prompt format (chat_template.h): its template over the Jinja subset, and the
// chat fields of tokenizer_config.json.
#include "engine/infer/chat_template.h"

#include <filesystem>

#include "engine/core/errors.h"
#include "engine/core/file_io.h"
#include "engine/core/json_fields.h"

namespace tmx {

ChatTemplate ChatTemplate::parse(std::string_view text, const std::string& source,
                                 const jinja::Limits& limits) {
    return ChatTemplate(jinja::Template::parse(text, source, limits));
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt, const ChatTemplateVars& vars) const {
    // The variables apply_chat_template passes: the special tokens, then the caller's extras,
    // then the conversation.
    nlohmann::ordered_json context = nlohmann::ordered_json::object();
    context["bos_token"] = vars.bos_token;
    context["eos_token"] = vars.eos_token;
    if (!vars.extra.is_object()) throw Error("chat template variables must be a JSON object");
    for (const auto& [key, value] : vars.extra.items()) context[key] = value;
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const ChatMessage& m : messages)
        list.push_back(nlohmann::ordered_json{{"role", m.role}, {"content", m.content}});
    context["messages"] = std::move(list);
    context["add_generation_prompt"] = add_generation_prompt;
    return template_.render(context);
}

namespace {

// A special token: a string, or an AddedToken object {"content": "...", ...}; null is none.
std::string token_field(const nlohmann::json& doc, const std::string& source,
                        const std::string& field) {
    if (!doc.contains(field) || doc[field].is_null()) return "";
    const nlohmann::json& v = doc[field];
    if (v.is_string()) return v.get<std::string>();
    if (v.is_object()) {
        if (!v.contains("content"))
            json_fields::fail(
                source, field,
                "expected a string or {\"content\": ...}, got " + json_fields::describe(v));
        return json_fields::as_string(v["content"], source, field + ".content");
    }
    json_fields::fail(source, field,
                      "expected a string or {\"content\": ...}, got " + json_fields::describe(v));
}

}  // namespace

TokenizerChatConfig parse_tokenizer_chat_config(std::string_view json_text,
                                                const std::string& source) {
    const nlohmann::json doc = json_fields::parse_unique_keys(json_text, source);
    if (!doc.is_object()) throw Error(source + ": expected a JSON object");
    TokenizerChatConfig config;
    config.chat_template_source = source + ": chat_template";
    config.bos_token = token_field(doc, source, "bos_token");
    config.eos_token = token_field(doc, source, "eos_token");
    if (!doc.contains("chat_template") || doc["chat_template"].is_null()) return config;
    const nlohmann::json& t = doc["chat_template"];
    if (t.is_string()) {
        config.chat_template = t.get<std::string>();
        return config;
    }
    if (!t.is_array())
        json_fields::fail(source, "chat_template",
                          "expected a string or a list of {\"name\", \"template\"}, got " +
                              json_fields::describe(t));
    std::string names;
    for (size_t i = 0; i < t.size(); ++i) {
        const std::string at = "chat_template[" + std::to_string(i) + "]";
        const json_fields::Fields entry(t[i], source, at + ".");
        const std::string name = entry.string("name");
        const std::string text = entry.string("template");
        if (name == "default") {
            config.chat_template = text;
            config.chat_template_source = source + ": " + at;
            return config;
        }
        names += (names.empty() ? "\"" : ", \"") + name + "\"";
    }
    json_fields::fail(source, "chat_template",
                      "no template named \"default\" (it has " +
                          (names.empty() ? std::string("none") : names) + ")");
}

TokenizerChatConfig read_tokenizer_chat_config(const std::string& path) {
    return parse_tokenizer_chat_config(read_file(path), path);
}

ChatPrompt ChatPrompt::for_tokenizer(const Tokenizer& tokenizer, const std::string& tokenizer_path,
                                     const std::string& template_file) {
    ChatPrompt p(tokenizer);
    const auto piece = [&](int32_t id) { return id >= 0 ? tokenizer.piece(id) : std::string(); };
    p.vars_.bos_token = piece(tokenizer.bos_id());
    p.vars_.eos_token = piece(tokenizer.eos_id());
    const std::filesystem::path config =
        std::filesystem::path(tokenizer_path).parent_path() / "tokenizer_config.json";
    std::error_code ec;
    if (std::filesystem::is_regular_file(config, ec)) {
        const TokenizerChatConfig c = read_tokenizer_chat_config(config.string());
        if (!c.bos_token.empty()) p.vars_.bos_token = c.bos_token;
        if (!c.eos_token.empty()) p.vars_.eos_token = c.eos_token;
        if (c.chat_template && template_file.empty()) {
            p.template_ = ChatTemplate::parse(*c.chat_template, c.chat_template_source);
            p.source_ = c.chat_template_source;
        }
    }
    if (!template_file.empty()) {
        p.template_ = ChatTemplate::parse(read_file(template_file), template_file);
        p.source_ = template_file;
    }
    if (!p.template_) {
        p.source_ =
            "built-in (one line \"role: content\" per message, then \"assistant:\"; the "
            "model has no chat_template)";
    }
    return p;
}

std::string ChatPrompt::text(const std::vector<ChatMessage>& messages) const {
    if (template_) return template_->render(messages, true, vars_);
    std::string lines;
    for (const ChatMessage& m : messages) lines += m.role + ": " + m.content + "\n";
    return lines + "assistant:";
}

std::vector<int32_t> ChatPrompt::tokens(const std::vector<ChatMessage>& messages) const {
    if (template_) return tokenizer_->encode_with_special_tokens(text(messages));
    std::vector<int32_t> ids;
    if (tokenizer_->bos_id() >= 0) ids.push_back(tokenizer_->bos_id());
    const std::vector<int32_t> body = tokenizer_->encode(text(messages));
    ids.insert(ids.end(), body.begin(), body.end());
    return ids;
}

}  // namespace tmx

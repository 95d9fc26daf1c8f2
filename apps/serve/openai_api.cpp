#include "apps/serve/openai_api.h"

#include <cmath>

namespace tmx::serve {

using nlohmann::json;

json ApiError::body() const {
    return {{"error",
             {{"message", message},
              {"type", type},
              {"param", param.empty() ? json(nullptr) : json(param)},
              {"code", code.empty() ? json(nullptr) : json(code)}}}};
}

namespace {

[[noreturn]] void bad(const std::string& param, const std::string& message) {
    throw ApiError{400, param.empty() ? message : "'" + param + "': " + message, param, "",
                   "invalid_request_error"};
}

int64_t integer(const json& v, const std::string& param, int64_t lo, int64_t hi) {
    // nlohmann keeps every non-negative literal as unsigned; above INT64_MAX it would wrap.
    if (!v.is_number_integer() ||
        (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) ||
        v.get<int64_t>() < lo || v.get<int64_t>() > hi)
        bad(param, "expected an integer from " + std::to_string(lo) + " to " + std::to_string(hi) +
                       ", got " + v.dump());
    return v.get<int64_t>();
}

double number(const json& v, const std::string& param, double lo, double hi) {
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < lo ||
        v.get<double>() > hi)
        bad(param, "expected a number from " + json(lo).dump() + " to " + json(hi).dump() +
                       ", got " + v.dump());
    return v.get<double>();
}

std::string text(const json& v, const std::string& param) {
    if (!v.is_string()) bad(param, "expected a string, got " + v.dump().substr(0, 40));
    return v.get<std::string>();
}

// A non-empty array of token ids (each 0 .. 2^31 - 1; the vocabulary is checked where the
// model is known).
std::vector<int32_t> token_ids(const json& v, const std::string& param) {
    if (!v.is_array() || v.empty()) bad(param, "expected a non-empty array of token ids");
    std::vector<int32_t> out;
    out.reserve(v.size());
    for (size_t i = 0; i < v.size(); ++i)
        out.push_back(static_cast<int32_t>(
            integer(v[i], param + "[" + std::to_string(i) + "]", 0, INT32_MAX)));
    return out;
}

// A string or an array of strings (`max` of them at most).
std::vector<std::string> strings(const json& v, const std::string& param, size_t max) {
    std::vector<std::string> out;
    if (v.is_string()) return {v.get<std::string>()};
    if (!v.is_array() || v.empty()) bad(param, "expected a string or a non-empty array of strings");
    if (v.size() > max) bad(param, "at most " + std::to_string(max) + " entries");
    for (size_t i = 0; i < v.size(); ++i)
        out.push_back(text(v[i], param + "[" + std::to_string(i) + "]"));
    return out;
}

// The body as a JSON object.
json parse_object(const std::string& body) {
    json j;
    try {
        j = json::parse(body);
    } catch (const json::exception& e) {
        bad("", std::string("the body is not valid JSON: ") + e.what());
    }
    if (!j.is_object()) bad("", "the body must be a JSON object");
    return j;
}

}  // namespace

TokenizeRequest parse_tokenize_request(const std::string& body) {
    const json j = parse_object(body);
    if (!j.contains("prompt")) bad("prompt", "required");
    TokenizeRequest r;
    r.prompt = text(j.at("prompt"), "prompt");
    if (j.contains("add_special_tokens") && !j.at("add_special_tokens").is_null()) {
        if (!j.at("add_special_tokens").is_boolean())
            bad("add_special_tokens", "expected true or false");
        r.add_special_tokens = j.at("add_special_tokens").get<bool>();
    }
    return r;
}

std::vector<int32_t> parse_detokenize_request(const std::string& body) {
    const json j = parse_object(body);
    if (!j.contains("tokens")) bad("tokens", "required");
    if (j.at("tokens").is_array() && j.at("tokens").empty()) return {};
    return token_ids(j.at("tokens"), "tokens");
}

namespace {

// OpenAI's response_format: {"type": "text"}, {"type": "json_object"} or {"type":
// "json_schema", "json_schema": {"name", "description", "schema", "strict"}}, as the grammar a
// completion is held to (none for text). `name`, `description` and `strict` are accepted and not
// used: every schema tmx accepts is followed strictly. A schema outside the subset tmx compiles
// is a 400 whose param is the keyword's path.
std::shared_ptr<const JsonGrammar> response_format(const json& rf, const std::string& body) {
    const std::string param = "response_format";
    if (!rf.is_object()) bad(param, "expected an object with a type");
    if (!rf.contains("type") || !rf.at("type").is_string())
        bad(param + ".type", "expected \"text\", \"json_object\" or \"json_schema\"");
    const std::string type = rf.at("type").get<std::string>();
    if (type == "text") return nullptr;
    if (type == "json_object") return json_object_grammar();
    if (type != "json_schema")
        bad(param + ".type",
            "expected \"text\", \"json_object\" or \"json_schema\", got \"" + type + "\"");
    if (!rf.contains("json_schema") || !rf.at("json_schema").is_object())
        bad(param + ".json_schema", "required: an object with the schema");
    const json& js = rf.at("json_schema");
    if (js.contains("name") && !js.at("name").is_string())
        bad(param + ".json_schema.name", "expected a string");
    if (js.contains("strict") && !js.at("strict").is_null() && !js.at("strict").is_boolean())
        bad(param + ".json_schema.strict", "expected true or false");
    if (!js.contains("schema") || js.at("schema").is_null())
        bad(param + ".json_schema.schema", "required");
    // Parsed again keeping the order of keys: properties are written in the schema's order.
    const nlohmann::ordered_json ordered = nlohmann::ordered_json::parse(body);
    const std::string at = param + ".json_schema.schema";
    try {
        return compile_json_schema(ordered.at("response_format").at("json_schema").at("schema"));
    } catch (const JsonSchemaError& e) {
        bad(e.path.empty() ? at : at + "." + e.path, e.what());
    }
}

}  // namespace

CompletionRequest parse_completion_request(const std::string& body, bool chat,
                                           const ApiLimits& limits) {
    const json j = parse_object(body);
    CompletionRequest r;
    r.chat = chat;
    auto has = [&](const char* k) { return j.contains(k) && !j.at(k).is_null(); };
    if (chat) {
        if (!has("messages")) bad("messages", "required");
        const json& m = j.at("messages");
        if (!m.is_array() || m.empty()) bad("messages", "expected a non-empty array of messages");
        for (size_t i = 0; i < m.size(); ++i) {
            const std::string p = "messages[" + std::to_string(i) + "]";
            if (!m[i].is_object()) bad(p, "expected an object with role and content");
            if (!m[i].contains("role")) bad(p + ".role", "required");
            if (!m[i].contains("content")) bad(p + ".content", "required");
            const std::string role = text(m[i].at("role"), p + ".role");
            if (role != "system" && role != "user" && role != "assistant" && role != "developer")
                bad(p + ".role",
                    "expected system, developer, user or assistant, got \"" + role + "\"");
            r.messages.push_back({role, text(m[i].at("content"), p + ".content")});
        }
    } else {
        if (!has("prompt")) bad("prompt", "required");
        // A string, an array of strings, an array of token ids or an array of such arrays.
        const json& p = j.at("prompt");
        if (p.is_array() && !p.empty() && p[0].is_number()) {
            r.prompt_tokens.push_back(token_ids(p, "prompt"));
        } else if (p.is_array() && !p.empty() && p[0].is_array()) {
            if (p.size() > static_cast<size_t>(limits.max_prompts))
                bad("prompt", "at most " + std::to_string(limits.max_prompts) + " entries");
            for (size_t i = 0; i < p.size(); ++i)
                r.prompt_tokens.push_back(token_ids(p[i], "prompt[" + std::to_string(i) + "]"));
        } else {
            r.prompts = strings(p, "prompt", static_cast<size_t>(limits.max_prompts));
        }
    }
    if (has("model")) r.model = text(j.at("model"), "model");
    const char* max_key =
        chat && has("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    if (has(max_key))
        r.max_tokens = integer(j.at(max_key), max_key, 0, limits.max_tokens);
    else if (chat)
        r.max_tokens = std::min<int64_t>(limits.max_tokens, 256);
    r.sampling.temperature =
        has("temperature") ? number(j.at("temperature"), "temperature", 0, 2) : 1.0;
    r.sampling.top_p = has("top_p") ? number(j.at("top_p"), "top_p", 0, 1) : 1.0;
    if (has("top_p") && r.sampling.top_p == 0) bad("top_p", "must be above 0");
    r.sampling.top_k = has("top_k") ? integer(j.at("top_k"), "top_k", 0, 1 << 20) : 0;
    r.sampling.min_p = 0;
    r.sampling.frequency_penalty =
        has("frequency_penalty") ? number(j.at("frequency_penalty"), "frequency_penalty", -2, 2)
                                 : 0.0;
    r.sampling.presence_penalty =
        has("presence_penalty") ? number(j.at("presence_penalty"), "presence_penalty", -2, 2) : 0.0;
    if (has("logit_bias")) {
        // {"token id": bias}: the ids as decimal strings (JSON keys), the vocabulary checked
        // where the model is known.
        const json& b = j.at("logit_bias");
        if (!b.is_object()) bad("logit_bias", "expected an object of token ids to numbers");
        if (b.size() > 1024) bad("logit_bias", "at most 1024 tokens");
        for (const auto& [key, value] : b.items()) {
            const std::string param = "logit_bias." + key;
            if (key.empty() || key.size() > 10 ||
                key.find_first_not_of("0123456789") != std::string::npos ||
                std::stoll(key) > INT32_MAX)
                bad(param, "keys must be token ids (decimal integers)");
            r.sampling.logit_bias.emplace_back(static_cast<int32_t>(std::stoll(key)),
                                               number(value, param, -100, 100));
        }
    }
    if (has("suffix") && !(j.at("suffix").is_string() && j.at("suffix").get<std::string>().empty()))
        bad("suffix", "not supported (tmx's models do not fill in the middle)");
    if (has("best_of") &&
        !(j.at("best_of").is_number_integer() && j.at("best_of").get<int64_t>() == 1))
        bad("best_of", "only 1 is supported (use n for several choices)");
    if (has("seed")) {
        const json& s = j.at("seed");
        if (!s.is_number_integer()) bad("seed", "expected an integer, got " + s.dump());
        r.seed =
            s.is_number_unsigned() ? s.get<uint64_t>() : static_cast<uint64_t>(s.get<int64_t>());
    }
    if (has("stop")) {
        r.stop = strings(j.at("stop"), "stop", 4);
        for (const auto& s : r.stop)
            if (s.empty()) bad("stop", "stop strings must not be empty");
    }
    if (has("n")) r.n = integer(j.at("n"), "n", 1, limits.max_n);
    if (has("stream")) {
        if (!j.at("stream").is_boolean()) bad("stream", "expected true or false");
        r.stream = j.at("stream").get<bool>();
    }
    if (has("stream_options")) {
        const json& so = j.at("stream_options");
        if (!so.is_object()) bad("stream_options", "expected an object");
        if (!r.stream) bad("stream_options", "only allowed when stream is true");
        if (so.contains("include_usage") && !so.at("include_usage").is_null()) {
            if (!so.at("include_usage").is_boolean())
                bad("stream_options.include_usage", "expected true or false");
            r.stream_usage = so.at("include_usage").get<bool>();
        }
    }
    if (!chat && has("echo")) {
        if (!j.at("echo").is_boolean()) bad("echo", "expected true or false");
        r.echo = j.at("echo").get<bool>();
    }
    if (has("ignore_eos")) {
        if (!j.at("ignore_eos").is_boolean()) bad("ignore_eos", "expected true or false");
        r.ignore_eos = j.at("ignore_eos").get<bool>();
    }
    if (has("response_format")) r.json_grammar = response_format(j.at("response_format"), body);
    if (chat) {
        if (has("logprobs")) {
            if (!j.at("logprobs").is_boolean()) bad("logprobs", "expected true or false");
            if (j.at("logprobs").get<bool>())
                r.logprobs =
                    has("top_logprobs") ? integer(j.at("top_logprobs"), "top_logprobs", 0, 20) : 0;
        }
        if (has("top_logprobs") && r.logprobs < 0) bad("top_logprobs", "needs logprobs: true");
    } else if (has("logprobs")) {
        r.logprobs = integer(j.at("logprobs"), "logprobs", 0, 5);
    }
    return r;
}

json logprobs_json(const std::vector<TokenLogprob>& tokens, bool chat) {
    if (chat) {
        auto bytes = [](const std::string& t) {
            json b = json::array();
            for (unsigned char ch : t) b.push_back(ch);
            return b;
        };
        json content = json::array();
        for (const TokenLogprob& t : tokens) {
            json top = json::array();
            for (const auto& [tok, lp] : t.top)
                top.push_back({{"token", tok}, {"logprob", lp}, {"bytes", bytes(tok)}});
            content.push_back({{"token", t.token},
                               {"logprob", t.logprob.value_or(0.0)},
                               {"bytes", bytes(t.token)},
                               {"top_logprobs", top}});
        }
        return {{"content", content}};
    }
    json toks = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
    for (const TokenLogprob& t : tokens) {
        toks.push_back(t.token);
        offsets.push_back(t.text_offset);
        if (!t.logprob) {
            lps.push_back(nullptr);
            tops.push_back(nullptr);
            continue;
        }
        lps.push_back(*t.logprob);
        json top = json::object();
        // Tokens with the same text (a byte piece and a piece) share a key: the likelier one.
        for (const auto& [tok, lp] : t.top)
            if (!top.contains(tok) || top[tok].get<double>() < lp) top[tok] = lp;
        tops.push_back(top);
    }
    return {{"tokens", toks},
            {"token_logprobs", lps},
            {"top_logprobs", tops},
            {"text_offset", offsets}};
}

ApiError api_error(const CompletionError& e, const CompletionRequest& r) {
    using Kind = CompletionError::Kind;
    switch (e.kind) {
        case Kind::TokenOutsideVocabulary: {
            const std::string at = "[" + std::to_string(e.position) + "]";
            const std::string param =
                e.prompt == CompletionError::kLogitBias ? "logit_bias." + std::to_string(e.token)
                : r.prompt_tokens.size() > 1 ? "prompt[" + std::to_string(e.prompt) + "]" + at
                                             : "prompt" + at;
            return {400, e.what(), param, "", "invalid_request_error"};
        }
        case Kind::TooManyScoredTokens:
            return {400, e.what(), "prompt", "", "invalid_request_error"};
        case Kind::Unrunnable:
            return {400, e.what(), r.chat ? "messages" : "prompt", "", ""};
        case Kind::QueueFull:
            return {429, e.what(), "", "queue_full", "rate_limit_error"};
        case Kind::DeviceFailed:
            return {503, e.what(), "", "backend_error", "server_error"};
    }
    return {500, e.what(), "", "", "server_error"};
}

const char* finish_reason(StopReason r) {
    switch (r) {
        case StopReason::Length:
            return "length";
        case StopReason::Cancelled:
            return "cancelled";
        case StopReason::Failed:
            return "error";
        default:
            return "stop";
    }
}

json usage_json(const Completion::Usage& usage) {
    return {{"prompt_tokens", usage.prompt_tokens},
            {"completion_tokens", usage.completion_tokens},
            {"total_tokens", usage.prompt_tokens + usage.completion_tokens}};
}

json ResponseHeader::fields() const {
    return {{"id", id}, {"object", object}, {"created", created}, {"model", model}};
}

json completion_body(const ResponseHeader& header, const Completion& completion, bool chat,
                     bool logprobs) {
    json choices = json::array();
    for (size_t i = 0; i < completion.choices().size(); ++i) {
        const Completion::Choice& c = completion.choices()[i];
        json ch = {{"index", i}, {"finish_reason", finish_reason(c.stop_reason)}};
        if (chat)
            ch["message"] = {{"role", "assistant"}, {"content", c.text}};
        else
            ch["text"] = c.text;
        ch["logprobs"] = logprobs ? logprobs_json(c.logprobs, chat) : json(nullptr);
        choices.push_back(ch);
    }
    json body = header.fields();
    body["choices"] = choices;
    body["usage"] = usage_json(completion.usage());
    return body;
}

json stream_choice(const Completion::Update& update, bool chat, bool logprobs) {
    json ch = {{"index", update.choice}, {"finish_reason", nullptr}};
    if (chat) {
        ch["delta"] = json::object();
        if (update.first) ch["delta"]["role"] = "assistant";
        if (!update.text.empty()) ch["delta"]["content"] = update.text;
    } else {
        ch["text"] = update.text;
    }
    ch["logprobs"] = logprobs ? logprobs_json(update.logprobs, chat) : json(nullptr);
    // A failed choice has no OpenAI finish_reason: the error event after it says what happened.
    if (update.done && update.error.empty())
        ch["finish_reason"] = finish_reason(update.stop_reason);
    return ch;
}

ApiError generation_failed(const std::string& why) {
    return {500, "generation failed: " + why, "", "backend_error", "server_error"};
}

ApiError completion_cancelled(int status) {
    return {status, "the request was cancelled (the server is shutting down or its device failed)",
            "", "cancelled", "server_error"};
}

std::string dump(const json& j) {
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace tmx::serve

// libFuzzer target: the server's request reader (apps/serve/openai_api.h) on arbitrary bodies,
// as /v1/completions, /v1/chat/completions, /tokenize and /detokenize. Anything wrong must be an
// ApiError with a 4xx status; what it accepts must be within the limits, and a chat request must
// render.
#include <cstdint>
#include <string>

#include "apps/serve/openai_api.h"
#include "engine/infer/chat_template.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

void refused(const tmx::serve::ApiError& e) {
    using tmx::fuzz::require;
    require(e.status >= 400 && e.status < 500, "a refused request is a 4xx");
    require(!e.message.empty(), "a refused request says why");
    (void)e.body().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using tmx::fuzz::require;
    const std::string body(tmx::fuzz::as_text(data, size));
    const tmx::serve::ApiLimits limits;
    for (bool chat : {false, true}) {
        try {
            const tmx::serve::CompletionRequest r =
                tmx::serve::parse_completion_request(body, chat, limits);
            require(r.max_tokens >= 0 && r.max_tokens <= limits.max_tokens, "max_tokens in range");
            require(r.n >= 1 && r.n <= limits.max_n, "n in range");
            require(r.logprobs >= -1 && r.logprobs <= 20, "logprobs in range");
            require(chat ? !r.messages.empty() : !r.prompts.empty() || !r.prompt_tokens.empty(),
                    "something to continue");
            if (chat) {  // the messages through a chat template, as the server renders them
                static const tmx::ChatTemplate plain = tmx::ChatTemplate::parse(
                    "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
                    "{% if add_generation_prompt %}assistant:{% endif %}",
                    "fuzz");
                (void)plain.render(r.messages, true, {});
            }
            require(r.sampling.frequency_penalty >= -2 && r.sampling.frequency_penalty <= 2 &&
                        r.sampling.presence_penalty >= -2 && r.sampling.presence_penalty <= 2,
                    "penalties in range");
            for (const auto& [id, bias] : r.sampling.logit_bias)
                require(id >= 0 && bias >= -100 && bias <= 100, "logit_bias in range");
            for (const auto& ids : r.prompt_tokens)
                for (int32_t id : ids) require(id >= 0, "token ids are not negative");
        } catch (const tmx::serve::ApiError& e) {
            refused(e);
        }
    }
    try {
        (void)tmx::serve::parse_tokenize_request(body);
    } catch (const tmx::serve::ApiError& e) {
        refused(e);
    }
    try {
        for (int32_t id : tmx::serve::parse_detokenize_request(body))
            require(id >= 0, "token ids are not negative");
    } catch (const tmx::serve::ApiError& e) {
        refused(e);
    }
    return 0;
}

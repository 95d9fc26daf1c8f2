// libFuzzer target: the server's request reader (apps/serve/openai_api.h) on arbitrary bodies,
// as /v1/completions and as /v1/chat/completions. Anything wrong must be an ApiError with a 4xx
// status; what it accepts must be within the limits, and a chat request must render.
#include <cstdint>
#include <string>

#include "apps/serve/openai_api.h"
#include "tests/fuzz/fuzz_util.h"

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
            if (chat) (void)tmx::serve::render_chat(r.messages, "{{messages}}\n");
            (void)r.sampling;
        } catch (const tmx::serve::ApiError& e) {
            require(e.status >= 400 && e.status < 500, "a refused request is a 4xx");
            require(!e.message.empty(), "a refused request says why");
            (void)e.body().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
        }
    }
    return 0;
}

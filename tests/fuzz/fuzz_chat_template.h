// The chat template fuzz entry (tests/fuzz/fuzz_chat_template.cpp), shared with the unit test
// that runs it on random mutations of the real templates: the bytes as a template, parsed and
// rendered for a fixed conversation, and as a tokenizer_config.json. Anything wrong must be a
// tmx::Error; what renders stays within the limits.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "engine/core/errors.h"
#include "engine/infer/chat_template.h"
#include "tests/fuzz/fuzz_util.h"

namespace tmx::fuzz {

// Smaller than the defaults, so that each input runs quickly; the same checks guard both.
inline jinja::Limits chat_template_fuzz_limits() {
    jinja::Limits limits;
    limits.max_steps = 200'000;
    limits.max_built_bytes = 16 << 20;
    limits.max_output_bytes = 1 << 20;
    return limits;
}

inline void chat_template_one_input(std::string_view bytes) {
    static const std::vector<ChatMessage> conversation = {
        {"system", "Be brief."},
        {"user", "Hi {{ there }} \"quoted\" 'single' \\ {% raw %}"},
        {"assistant", "<think>\nhm\n</think>\n\nHello — ünïcödé 🤖"},
        {"user", ""}};
    const jinja::Limits limits = chat_template_fuzz_limits();
    try {
        const ChatTemplate t = ChatTemplate::parse(bytes, "fuzz", limits);
        for (const bool generation_prompt : {false, true}) {
            try {
                ChatTemplateVars vars{"<s>", "</s>"};
                vars.extra["enable_thinking"] = generation_prompt;
                const std::string out = t.render(conversation, generation_prompt, vars);
                require(out.size() <= limits.max_output_bytes, "output within the limit");
            } catch (const Error& e) {
                require(std::string(e.what()).starts_with("fuzz: "), "errors name the source");
            }
        }
    } catch (const Error& e) {
        require(std::string(e.what()).starts_with("fuzz: "), "errors name the source");
    }
    try {
        (void)parse_tokenizer_chat_config(bytes, "fuzz.json");
    } catch (const Error&) {
    }
}

}  // namespace tmx::fuzz

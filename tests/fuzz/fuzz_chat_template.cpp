// libFuzzer target: the chat template renderer (engine/infer/chat_template.h, the Jinja subset
// of engine/infer/jinja.h) on arbitrary template bytes, parsed and rendered for a fixed
// conversation, and the tokenizer_config.json reader on the same bytes. Anything wrong must be
// a tmx::Error (tests/fuzz/fuzz_chat_template.h).
#include "tests/fuzz/fuzz_chat_template.h"

#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    tmx::fuzz::chat_template_one_input(tmx::fuzz::as_text(data, size));
    return 0;
}

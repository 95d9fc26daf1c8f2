// libFuzzer target: the JSON Schema compiler (engine/infer/json_schema.h) on arbitrary input,
// and its automaton on arbitrary bytes. The input is a schema's text, then a NUL, then bytes
// that steer a walk through the automaton (each byte taken when the automaton allows it, else
// mapped onto the bytes it allows). A schema is compiled or refused with a tmx::Error; every
// state the walk reaches can go on or is a whole value; a whole value parses as JSON.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "engine/core/errors.h"
#include "engine/infer/json_schema.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view input = tmx::fuzz::as_text(data, size);
    const size_t split = input.find('\0');
    const std::string_view schema_text = input.substr(0, split);
    const std::string_view steer =
        split == std::string_view::npos ? std::string_view() : input.substr(split + 1);
    const nlohmann::ordered_json schema =
        nlohmann::ordered_json::parse(schema_text, nullptr, /*allow_exceptions=*/false);
    if (schema.is_discarded()) return 0;
    std::shared_ptr<const tmx::JsonGrammar> grammar;
    try {
        grammar = tmx::compile_json_schema(schema);
    } catch (const tmx::Error&) {
        return 0;
    }
    tmx::JsonDfa dfa(grammar);
    int32_t s = dfa.start();
    std::string text;
    try {
        for (char c : steer) {
            tmx::fuzz::require(dfa.accepting(s) || dfa.can_continue(s), "a dead end");
            int32_t next = dfa.next(s, static_cast<uint8_t>(c));
            if (next == tmx::JsonDfa::kDead) {
                std::vector<uint8_t> allowed;
                for (int b = 0; b < 256; ++b)
                    if (dfa.next(s, static_cast<uint8_t>(b)) != tmx::JsonDfa::kDead)
                        allowed.push_back(static_cast<uint8_t>(b));
                if (allowed.empty()) break;
                c = static_cast<char>(allowed[static_cast<uint8_t>(c) % allowed.size()]);
                next = dfa.next(s, static_cast<uint8_t>(c));
            }
            text.push_back(c);
            s = next;
        }
    } catch (const tmx::Error&) {
        return 0;  // the automaton grew past its limit
    }
    if (dfa.accepting(s))
        tmx::fuzz::require(!nlohmann::json::parse(text, nullptr, false).is_discarded(),
                           "an accepted text is not JSON");
    return 0;
}

// libFuzzer target: a Hugging Face tokenizer.json and its tokenizer_config.json
// (engine/data/tokenizer_json.h through Tokenizer::from_json). Byte 0 picks what the rest is: a
// tokenizer.json, or the tokenizer_config.json of a small valid one. Whatever loads then encodes
// text (special tokens, bytes outside the vocabulary, invalid UTF-8) and decodes ids, whole and
// streamed. Anything wrong must be a tmx::Error.
#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/errors.h"
#include "engine/data/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

// A byte-level BPE with a regex pre-tokenizer and two added tokens.
constexpr const char* kSmallTokenizer = R"({
  "added_tokens": [{"id": 5, "content": "<s>", "special": true},
                   {"id": 6, "content": "</s>", "special": true}],
  "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
  "decoder": {"type": "ByteLevel"},
  "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "Ġ": 3, "Ġab": 4},
            "merges": ["a b", "Ġ ab"]}})";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 1) return 0;
    const std::string_view rest = tmx::fuzz::as_text(data + 1, size - 1);
    try {
        const tmx::Tokenizer tok =
            data[0] % 2 == 0
                ? tmx::Tokenizer::from_json(rest, "", "fuzz/tokenizer.json")
                : tmx::Tokenizer::from_json(kSmallTokenizer, rest, "fuzz/tokenizer.json");
        for (const char* text : {"", "ab ab</s>", " \t\n\xc3\xa9\xf0\x9f\xa4\x96\xff<s>x"}) {
            std::vector<int32_t> ids = tok.encode(text);
            for (int32_t id : ids)
                tmx::fuzz::require(id >= 0 && id < tok.vocab_size(), "id outside the vocabulary");
            tok.encode_continuation(text, ids);
            const std::string whole = tok.decode(ids);
            tmx::StreamDecoder stream(tok);
            for (int32_t id : ids) (void)stream.push(id);
            (void)stream.flush();
            (void)whole;
        }
    } catch (const tmx::Error&) {
    }
    return 0;
}

// libFuzzer target: a SentencePiece .model file (a checkpoint's tokenizer.model, a user's
// --tokenizer): loaded by SentencePiece, then read by our own protobuf reader (the model's
// spec, the continuation model without a dummy prefix) and written as a tokenizer.json.
// Anything wrong must be a tmx::Error.
#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/errors.h"
#include "engine/data/tokenizer.h"
#include "engine/interop/hf_tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    try {
        const tmx::Tokenizer tok =
            tmx::Tokenizer::from_bytes(tmx::fuzz::as_text(data, size), "fuzz.model");
        const tmx::Tokenizer::ModelSpec spec = tok.model_spec();
        for (int32_t id : spec.user_defined)
            tmx::fuzz::require(id >= 0 && id < tok.vocab_size(), "user-defined id");
        std::vector<int32_t> ids = tok.encode("Once upon a time, \xe6\x97\xa5 \xf0\x9f\xa4\x96");
        tok.encode_continuation(" upon a time", ids);
        (void)tok.decode(ids);
        (void)tmx::interop::tokenizer_json(tok, true);
    } catch (const tmx::Error&) {
    }
    return 0;
}

// A SentencePiece model file (its ModelProto, protobuf wire format) written from a vocabulary:
// how a GGUF file's tokenizer.ggml.* becomes tokenizer.model again. The model is a byte-fallback
// BPE with the Llama conventions (identity normalisation, a dummy prefix, whitespace kept), as
// GGUF's `llama` tokenizer model assumes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tmx::interop {

struct VocabPiece {
    std::string piece;
    float score = 0;
    int32_t type = 1;  // SentencePiece's: NORMAL 1, UNKNOWN 2, CONTROL 3, USER_DEFINED 4,
                       // UNUSED 5, BYTE 6 (GGUF's token_type uses the same numbers)
};

struct VocabSpecialIds {
    int32_t unk = 0, bos = 1, eos = 2, pad = -1;  // -1: none
};

// The serialized ModelProto; a tmx::Error naming `source` when a piece type is unknown or the
// special ids are outside the vocabulary.
std::string sentencepiece_model_proto(const std::vector<VocabPiece>& pieces,
                                      const VocabSpecialIds& ids, const std::string& source);

}  // namespace tmx::interop

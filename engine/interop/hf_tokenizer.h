// A checkpoint's SentencePiece tokenizer as Hugging Face's tokenizer.json (the file the
// `tokenizers` library, and so transformers, loads as it is): a BPE model with byte fallback
// whose merges, normalizer and decoder reproduce SentencePiece's encoding and decoding
// (docs/interop.md#tokenizers says what was checked, against what).
#pragma once

#include <string>

#include "engine/data/tokenizer.h"

namespace tmx::interop {

// The tokenizer.json text for `tok`, or a tmx::Error saying which part of the model
// tokenizer.json cannot express exactly (a unigram model, a normalization map, whitespace as a
// suffix, ...): never an approximation. `add_bos`: the post-processor adds BOS to every text,
// as our datasets start every document with it.
std::string tokenizer_json(const Tokenizer& tok, bool add_bos);

}  // namespace tmx::interop

// A tmx model as llama.cpp's GGUF `llama` architecture (with experts: Mixtral's mapping) and
// back: metadata keys, the SentencePiece vocabulary as tokenizer.ggml.*, tensor names and
// shapes, the RoPE row order llama.cpp expects, and the tensor types (engine/interop/gguf.h is
// the file format itself).
#pragma once

#include <cstdint>
#include <string>

#include "engine/interop/gguf.h"
#include "engine/interop/interop.h"

namespace tmx::interop {

// --dtype of a GGUF export: f32, f16, bf16 or q8_0 (a UsageError naming `flag` otherwise).
gguf::TensorType parse_gguf_dtype(const std::string& text, const std::string& flag);

struct GgufExportOptions {
    gguf::TensorType dtype = gguf::TensorType::F32;
    bool overwrite = false;
    ProgressFn progress;
};

struct GgufExportReport {
    int64_t tensors = 0;
    uint64_t bytes = 0;  // the file's size
};

GgufExportReport export_gguf(const std::string& checkpoint, const std::string& out_file,
                             const GgufExportOptions& options);

ImportReport import_gguf(const std::string& gguf_file, const std::string& checkpoint,
                         const ImportOptions& options);

// llama.cpp's `llama` architecture rotates adjacent pairs (2j, 2j+1) of each head, ours (and
// Hugging Face's) the halves (j, j + head_dim/2). A q or k projection [heads*head_dim, cols]
// (row-major) is rearranged so that llama.cpp's rotation of its output equals ours of the
// original: output row h*hd + 2j + t is input row h*hd + t*hd/2 + j. unpermute is the inverse.
void permute_rope_rows(const float* in, float* out, int64_t heads, int64_t head_dim, int64_t cols);
void unpermute_rope_rows(const float* in, float* out, int64_t heads, int64_t head_dim,
                         int64_t cols);

}  // namespace tmx::interop

// Moving models between tmx checkpoints and other tools' formats: Hugging Face directories
// (config.json + safetensors + tokenizer files) and GGUF files (llama.cpp). Every conversion
// streams tensor by tensor (memory stays near the largest tensor), writes atomically (a killed
// conversion leaves nothing under the final name), and refuses what it cannot express exactly
// before writing anything, naming the config field or tensor.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "engine/model/config.h"
#include "engine/model/safetensors.h"

namespace tmx::interop {

// Where a conversion is: called after each tensor.
struct Progress {
    int64_t tensors_done = 0, tensors_total = 0;
    uint64_t bytes_done = 0, bytes_total = 0;  // of the output
};
using ProgressFn = std::function<void(const Progress&)>;

// ------------------------------------------------------------------------------------------
// Hugging Face (engine/interop/hf_*.cpp)

struct HfExportOptions {
    StorageType dtype = StorageType::F32;  // F32, BF16 or F16
    uint64_t shard_bytes = 5'000'000'000;  // a file holds at most this much (one tensor more)
    bool overwrite = false;                // replace an existing export directory
    ProgressFn progress;
};

struct HfExportReport {
    std::string architecture;  // MixtralForCausalLM, MistralForCausalLM or LlamaForCausalLM
    int64_t tensors = 0;
    int shards = 0;
    uint64_t bytes = 0;  // tensor data written
    bool tokenizer = false;
    // Why tokenizer.json was not written beside tokenizer.model (empty when it was, or when
    // there is no tokenizer).
    std::string tokenizer_json_skipped;
};

// Writes checkpoint `checkpoint` as a Hugging Face model directory `out_dir`.
HfExportReport export_hf(const std::string& checkpoint, const std::string& out_dir,
                         const HfExportOptions& options);

// The Hugging Face class that computes exactly what `config` does, or a tmx::Error naming
// `source`, the config field, its value and what the class needs.
std::string hf_architecture(const ModelConfig& config, const std::string& source);

// config.json of that class for `config`; bos/eos ids < 0 are written as null.
nlohmann::json hf_config_json(const ModelConfig& config, const std::string& source, int32_t bos_id,
                              int32_t eos_id, StorageType dtype);

// A native tensor name as Hugging Face's class names it (only the dense FFN differs:
// mlp.w1/w2/w3 are mlp.gate_proj/down_proj/up_proj), and back.
std::string hf_tensor_name(const std::string& native);
std::string native_tensor_name(const std::string& hf);

// "5GB", "500MB", "2GiB", "123" (bytes) as Hugging Face's max_shard_size reads them; a
// UsageError naming `flag` otherwise.
uint64_t parse_byte_size(const std::string& text, const std::string& flag);

struct ImportOptions {
    // Of the native checkpoint's weights: F32, BF16, F16 or Q8_0; unset, the source's own (that
    // of its first query projection; F64 becomes F32), so that an F16 or Q8_0 GGUF file stays so.
    std::optional<StorageType> dtype;
    bool overwrite = false;
    ProgressFn progress;
};

struct ImportReport {
    ModelConfig config;
    std::string source_kind;               // "Hugging Face mixtral", "GGUF llama", ...
    StorageType dtype = StorageType::F32;  // the checkpoint's weights
    int64_t params = 0;
};

// A Hugging Face llama / mistral / mixtral directory (single or sharded safetensors in F32,
// BF16 or F16, tokenizer.model) as a native checkpoint.
ImportReport import_hf(const std::string& hf_dir, const std::string& checkpoint,
                       const ImportOptions& options);

}  // namespace tmx::interop

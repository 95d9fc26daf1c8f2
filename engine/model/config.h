// The native model config (docs/design.md#2-model-config): fields, defaults, validation.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "engine/compute/op_kinds.h"

namespace tmx {

enum class FfnType { Mlp, SwiGlu };

struct ModelConfig {
    int64_t vocab_size = 32000;
    int64_t d_model = 512;
    int64_t n_layers = 8;
    int64_t n_heads = 8;
    int64_t n_kv_heads = 2;
    int64_t head_dim = 64;
    FfnType ffn_type = FfnType::Mlp;
    Activation activation = Activation::Gelu;
    int64_t d_ff = 2048;
    bool ffn_bias = true;
    bool attn_bias = false;
    NormType norm_type = NormType::LayerNorm;
    double norm_eps = 1e-5;
    int64_t n_experts = 8;
    int64_t top_k = 2;
    double router_aux_loss_coef = 0.02;
    double rope_theta = 10000.0;
    int64_t max_seq_len = 512;
    int64_t sliding_window = 256;
    bool tie_embeddings = false;

    bool is_moe() const { return n_experts > 0; }
    bool has_norm_bias() const { return norm_type == NormType::LayerNorm; }
    int64_t q_dim() const { return n_heads * head_dim; }
    int64_t kv_dim() const { return n_kv_heads * head_dim; }
    // Number of keys a query can see: the window, or the whole context when unlimited.
    int64_t attention_span() const { return sliding_window > 0 ? sliding_window : max_seq_len; }
};

// Version written into a checkpoint's config.json as "format_version".
inline constexpr int kCheckpointFormatVersion = 1;

// Sanity bounds on model sizes, far above any real model (the largest published ones have
// ~2 * 10^12 parameters, ~1,000 layers, ~15,000 experts in all), so that a typo or a hostile
// config is refused before anything is allocated and no size arithmetic can overflow: 16 bytes
// per parameter (AdamW) of kMaxParams still fit in an int64_t with room to spare.
inline constexpr int64_t kMaxParams = int64_t{1} << 48;  // 281,474,976,710,656
inline constexpr int64_t kMaxLayers = 4096;
// Layers x experts: the engine keeps one named tensor per expert matrix.
inline constexpr int64_t kMaxLayerExperts = int64_t{1} << 16;
// Memory estimates (`tmx params --batch`) above this many bytes (1 EiB) are refused.
inline constexpr double kMaxMemoryBytes = 1152921504606846976.0;  // 2^60

// Parses and validates a native config. `source` names the file in error messages.
// Missing keys take the defaults; unknown keys, wrong types and impossible values throw
// tmx::Error naming the source and the field.
ModelConfig config_from_json(const nlohmann::json& j, const std::string& source);
ModelConfig load_config(const std::string& path);
nlohmann::json config_to_json(const ModelConfig& c);

// Checks the cross-field rules and the size bounds above (also run by config_from_json).
void validate_config(const ModelConfig& c, const std::string& source);

// The number of parameters the model instantiates (model_param_layout's total), computed with
// overflow-checked arithmetic: a tmx::Error naming `source` when it does not fit in int64_t.
int64_t param_count(const ModelConfig& c, const std::string& source);

const char* to_string(FfnType t);
const char* to_string(Activation a);
const char* to_string(NormType n);

}  // namespace tmx

// The Hugging Face side of the mapping: which class computes a native config, its config.json,
// its tensor names, and shard sizes. The reverse (an HF config -> a native config) is the
// parameter report's engine_config_for, shared with `tmx params`.
#include <cctype>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/core/errors.h"
#include "engine/interop/interop.h"

namespace tmx::interop {

using nlohmann::json;

namespace {

[[noreturn]] void refuse(const std::string& source, const std::string& field,
                         const std::string& value, const std::string& why) {
    throw Error(source + ": field '" + field + "' is " + value + ": " + why);
}

const char* torch_dtype(StorageType t) {
    switch (t) {
        case StorageType::BF16:
            return "bfloat16";
        case StorageType::F16:
            return "float16";
        default:
            return "float32";
    }
}

json id_or_null(int32_t id) {
    return id >= 0 ? json(id) : json(nullptr);
}

}  // namespace

std::string hf_architecture(const ModelConfig& c, const std::string& source) {
    const std::string classes = "Hugging Face's Mixtral, Mistral and Llama classes";
    if (c.ffn_type != FfnType::SwiGlu)
        refuse(source, "ffn_type", std::string("\"") + to_string(c.ffn_type) + "\"",
               classes + " compute a SwiGLU FFN (\"swiglu\"); a " + to_string(c.activation) +
                   " MLP has no class there");
    if (c.norm_type != NormType::RmsNorm)
        refuse(source, "norm_type", std::string("\"") + to_string(c.norm_type) + "\"",
               classes + " use RMSNorm (\"rmsnorm\"), without a bias");
    if (c.is_moe() || c.sliding_window > 0) {
        const std::string cls = c.is_moe() ? "MixtralForCausalLM" : "MistralForCausalLM";
        if (c.ffn_bias)
            refuse(source, "ffn_bias", "true", cls + " has no biases on its FFN weights");
        if (c.attn_bias)
            refuse(source, "attn_bias", "true", cls + " has no biases on q, k, v and o");
        return cls;
    }
    return "LlamaForCausalLM";  // its attention_bias and mlp_bias carry ours
}

json hf_config_json(const ModelConfig& c, const std::string& source, int32_t bos_id, int32_t eos_id,
                    StorageType dtype) {
    const std::string arch = hf_architecture(c, source);
    json j;
    j["architectures"] = {arch};
    j["model_type"] = arch == "MixtralForCausalLM"   ? "mixtral"
                      : arch == "MistralForCausalLM" ? "mistral"
                                                     : "llama";
    j["vocab_size"] = c.vocab_size;
    j["hidden_size"] = c.d_model;
    j["intermediate_size"] = c.d_ff;
    j["num_hidden_layers"] = c.n_layers;
    j["num_attention_heads"] = c.n_heads;
    j["num_key_value_heads"] = c.n_kv_heads;
    j["head_dim"] = c.head_dim;
    j["hidden_act"] = "silu";
    j["max_position_embeddings"] = c.max_seq_len;
    j["rms_norm_eps"] = c.norm_eps;
    j["rope_theta"] = c.rope_theta;
    j["rope_scaling"] = nullptr;
    j["tie_word_embeddings"] = c.tie_embeddings;
    j["attention_dropout"] = 0.0;
    j["initializer_range"] = 0.02;
    j["use_cache"] = true;
    j["bos_token_id"] = id_or_null(bos_id);
    j["eos_token_id"] = id_or_null(eos_id);
    j["torch_dtype"] = torch_dtype(dtype);
    if (arch == "LlamaForCausalLM") {
        j["attention_bias"] = c.attn_bias;
        j["mlp_bias"] = c.ffn_bias;
        j["pretraining_tp"] = 1;
    } else {
        j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
    }
    if (arch == "MixtralForCausalLM") {
        j["num_local_experts"] = c.n_experts;
        j["num_experts_per_tok"] = c.top_k;
        j["router_aux_loss_coef"] = c.router_aux_loss_coef;
        j["output_router_logits"] = false;
        j["router_jitter_noise"] = 0.0;
    }
    return j;
}

namespace {

// Native dense-FFN names and Hugging Face's (Llama, Mistral): w1 = gate, w3 = up, w2 = down.
constexpr std::pair<const char*, const char*> kDenseNames[] = {{".mlp.w1.", ".mlp.gate_proj."},
                                                               {".mlp.w2.", ".mlp.down_proj."},
                                                               {".mlp.w3.", ".mlp.up_proj."}};

std::string replace_part(const std::string& name, const char* from, const char* to) {
    const size_t at = name.find(from);
    if (at == std::string::npos) return name;
    return name.substr(0, at) + to + name.substr(at + std::string(from).size());
}

}  // namespace

std::string hf_tensor_name(const std::string& native) {
    for (const auto& [ours, theirs] : kDenseNames)
        if (native.find(ours) != std::string::npos) return replace_part(native, ours, theirs);
    return native;
}

std::string native_tensor_name(const std::string& hf) {
    for (const auto& [ours, theirs] : kDenseNames)
        if (hf.find(theirs) != std::string::npos) return replace_part(hf, theirs, ours);
    return hf;
}

uint64_t parse_byte_size(const std::string& text, const std::string& flag) {
    size_t i = 0;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
    std::string unit = text.substr(i);
    for (char& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    const std::pair<const char*, uint64_t> units[] = {{"", 1},
                                                      {"B", 1},
                                                      {"KB", 1000},
                                                      {"MB", 1000000},
                                                      {"GB", 1000000000},
                                                      {"KIB", 1ull << 10},
                                                      {"MIB", 1ull << 20},
                                                      {"GIB", 1ull << 30}};
    for (const auto& [name, scale] : units) {
        if (i == 0 || unit != name || i > 15) continue;
        const uint64_t n = std::stoull(text.substr(0, i));
        if (n == 0) break;
        if (n > UINT64_MAX / scale) break;
        return n * scale;
    }
    throw UsageError(flag +
                     ": expected a positive size such as 5GB, 500MB, 2GiB or a byte count, got \"" +
                     text + "\"");
}

}  // namespace tmx::interop

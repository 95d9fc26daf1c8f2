// The counts of a config in any supported format: the group names, a block's total, the config
// format and Hugging Face model_type, and the dispatch to the family counters (count_model).
#include <string>
#include <vector>

#include "engine/core/checked_math.h"
#include "engine/core/errors.h"
#include "engine/report/count_util.h"
#include "engine/report/param_report.h"

namespace tmx {
namespace report_detail {
namespace {

const std::vector<std::string>& hf_model_types() {
    static const std::vector<std::string> types = {
        "llama", "mistral",  "mixtral", "qwen2_moe",
        "olmoe", "deepseek", "gpt2",    "switch_transformers"};
    return types;
}

}  // namespace

Format detect_format(const json& j, const std::string& src) {
    if (!j.is_object()) throw Error(src + ": expected a JSON object with the model's fields");
    if (j.contains("model_type")) return Format::HuggingFace;
    for (const char* k : {"sequence_len", "n_layer", "n_head", "n_kv_head", "n_embd"})
        if (j.contains(k)) return Format::Nanochat;
    return Format::Native;
}

std::string hf_model_type(const json& j, const std::string& src) {
    const json& v = j.at("model_type");
    std::string list;
    for (const auto& t : hf_model_types()) list += (list.empty() ? "" : ", ") + t;
    if (!v.is_string())
        throw Error(src + ": field 'model_type': expected a string, got " + describe(v));
    std::string type = v.get<std::string>();
    for (const auto& t : hf_model_types())
        if (t == type) return type;
    throw Error(src + ": field 'model_type': unsupported model type \"" + type +
                "\" (supported: " + list + ")");
}

}  // namespace report_detail

using namespace report_detail;

// ------------------------------------------------------------------------------------------

const char* group_key(ParamGroup g) {
    switch (g) {
        case ParamGroup::Embedding:
            return "embedding";
        case ParamGroup::Positional:
            return "positional_embedding";
        case ParamGroup::Attention:
            return "attention";
        case ParamGroup::Norms:
            return "norms";
        case ParamGroup::Router:
            return "router";
        case ParamGroup::RoutedExperts:
            return "routed_experts";
        case ParamGroup::SharedExperts:
            return "shared_experts";
        case ParamGroup::DenseFfn:
            return "dense_ffn";
        case ParamGroup::LmHead:
            return "lm_head";
    }
    return "?";
}

const char* group_label(ParamGroup g) {
    switch (g) {
        case ParamGroup::Embedding:
            return "embedding";
        case ParamGroup::Positional:
            return "positional embedding";
        case ParamGroup::Attention:
            return "attention";
        case ParamGroup::Norms:
            return "norms";
        case ParamGroup::Router:
            return "router";
        case ParamGroup::RoutedExperts:
            return "experts (routed)";
        case ParamGroup::SharedExperts:
            return "shared experts";
        case ParamGroup::DenseFfn:
            return "dense FFN";
        case ParamGroup::LmHead:
            return "LM head";
    }
    return "?";
}

int64_t BlockCount::total() const {
    int64_t t = 0;
    for (int64_t v : params) accumulate(t, v);
    return t;
}

ModelCount count_model(const json& cfg, const std::string& src) {
    const Format format = detect_format(cfg, src);
    // A native config is validated, bounds included, before it is counted.
    if (format == Format::Native) return count_native(config_from_json(cfg, src));
    try {
        if (format == Format::Nanochat) return count_nanochat(cfg, src);
        const std::string type = hf_model_type(cfg, src);
        if (type == "llama" || type == "mistral" || type == "mixtral")
            return count_llama_family(cfg, src, type);
        if (type == "qwen2_moe") return count_qwen2_moe(cfg, src);
        if (type == "olmoe") return count_olmoe(cfg, src);
        if (type == "deepseek") return count_deepseek(cfg, src);
        if (type == "gpt2") return count_gpt2(cfg, src);
        return count_switch(cfg, src);
    } catch (const OverflowError& e) {
        throw Error(src + ": " + e.what());
    }
}

}  // namespace tmx

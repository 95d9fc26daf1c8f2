// The engine config of a model the engine runs (engine_config_for): a native config as it is, a
// Hugging Face llama / mistral / mixtral config translated to the native fields.
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "engine/core/errors.h"
#include "engine/model/config.h"
#include "engine/report/count_util.h"
#include "engine/report/param_report.h"

namespace tmx {

using namespace report_detail;

std::optional<ModelConfig> engine_config_for(const json& cfg, const std::string& src,
                                             std::string* why_not) {
    auto no = [&](const std::string& why) -> std::optional<ModelConfig> {
        if (why_not) *why_not = why;
        return std::nullopt;
    };
    switch (detect_format(cfg, src)) {
        case Format::Native:
            return config_from_json(cfg, src);
        case Format::Nanochat:
            return no(
                "nanochat's parameter-free RMSNorm and ReLU^2 MLP without a router are "
                "not an engine architecture");
        case Format::HuggingFace:
            break;
    }
    const std::string type = hf_model_type(cfg, src);
    if (type != "llama" && type != "mistral" && type != "mixtral")
        return no("the engine cannot build a model of type " + type +
                  " (it builds native configs and Hugging Face llama, mistral and mixtral "
                  "configs)");
    // Counting first validates every field the translation reads.
    const ModelCount m = count_model(cfg, src);
    FieldReader r(cfg, src, type);
    if (r.string("hidden_act", "silu") != "silu")
        return no("hidden_act \"" + r.string("hidden_act", "silu") +
                  "\": the engine's SwiGLU uses silu");
    if (r.has("rope_scaling")) return no("rope_scaling: the engine implements plain RoPE only");
    double theta = type == "mixtral" ? 1e6 : 1e4;
    if (r.has("rope_parameters")) {
        const json& rp = cfg.at("rope_parameters");
        if (!rp.is_object()) r.fail("rope_parameters", "expected an object, got " + describe(rp));
        FieldReader rr(rp, src, type);
        if (rr.string("rope_type", "default") != "default")
            return no("rope_parameters.rope_type \"" + rr.string("rope_type", "") +
                      "\": the engine implements plain RoPE only");
        theta = rr.number("rope_theta", theta);
    }
    theta = r.number("rope_theta", theta);
    const BlockCount& b = m.blocks.front();
    const AttentionOp& a = b.attention.front();
    json nc;
    nc["vocab_size"] = m.vocab_size;
    nc["d_model"] = m.d_model;
    nc["n_layers"] = static_cast<int64_t>(m.blocks.size());
    nc["n_heads"] = a.heads;
    nc["n_kv_heads"] = a.kv_heads;
    nc["head_dim"] = a.head_dim;
    nc["ffn_type"] = "swiglu";
    nc["activation"] = "silu";  // SwiGLU gates with SiLU, as the native swiglu configs say
    nc["d_ff"] = r.integer("intermediate_size", type == "llama" ? 11008 : 14336);
    nc["ffn_bias"] = type == "llama" && r.boolean("mlp_bias", false);
    nc["attn_bias"] = type == "llama" && r.boolean("attention_bias", false);
    nc["norm_type"] = "rmsnorm";
    nc["norm_eps"] = r.number("rms_norm_eps", type == "mixtral" ? 1e-5 : 1e-6);
    nc["n_experts"] = type == "mixtral" ? r.integer({"num_local_experts", "num_experts"}, 8) : 0;
    nc["top_k"] = type == "mixtral" ? r.integer("num_experts_per_tok", 2) : 1;
    nc["rope_theta"] = theta;
    nc["max_seq_len"] = m.context;
    nc["sliding_window"] = m.sliding_window;
    nc["tie_embeddings"] = m.lm_head_tied;
    if (type == "mixtral") nc["router_aux_loss_coef"] = r.number("router_aux_loss_coef", 0.001);
    try {
        return config_from_json(nc, src + " (as a native config)");
    } catch (const Error& e) {
        return no(e.what());
    }
}

}  // namespace tmx

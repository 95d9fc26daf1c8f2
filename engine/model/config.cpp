#include "engine/model/config.h"

#include <cmath>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "engine/core/checked_math.h"
#include "engine/core/errors.h"
#include "engine/core/file_io.h"
#include "engine/core/json_fields.h"
#include "engine/core/range_checks.h"

namespace tmx {
namespace {

using json_fields::as_bool;
using json_fields::as_enum;
using json_fields::as_int;
using json_fields::as_number;
using json_fields::fail;
using nlohmann::json;

const std::map<std::string, FfnType> kFfnTypes = {{"mlp", FfnType::Mlp},
                                                  {"swiglu", FfnType::SwiGlu}};
const std::map<std::string, Activation> kActivations = {{"gelu", Activation::Gelu},
                                                        {"silu", Activation::Silu},
                                                        {"relu", Activation::Relu},
                                                        {"relu2", Activation::Relu2}};
const std::map<std::string, NormType> kNormTypes = {{"layernorm", NormType::LayerNorm},
                                                    {"rmsnorm", NormType::RmsNorm}};

template <typename E>
const char* enum_name(E value, const std::map<std::string, E>& choices) {
    for (const auto& [name, v] : choices)
        if (v == value) return name.c_str();
    return "?";
}

}  // namespace

const char* to_string(FfnType t) {
    return enum_name(t, kFfnTypes);
}
const char* to_string(Activation a) {
    return enum_name(a, kActivations);
}
const char* to_string(NormType n) {
    return enum_name(n, kNormTypes);
}

void validate_config(const ModelConfig& c, const std::string& src) {
    const RangeChecks check([&](const OptionText& field, const std::string& problem) {
        fail(src, field.spelled(), problem);
    });
    check.positive(c.vocab_size, "vocab_size");
    check.positive(c.d_model, "d_model");
    check.positive(c.n_layers, "n_layers");
    check.positive(c.n_heads, "n_heads");
    check.positive(c.n_kv_heads, "n_kv_heads");
    check.positive(c.head_dim, "head_dim");
    check.positive(c.d_ff, "d_ff");
    check.positive(c.max_seq_len, "max_seq_len");
    check.require(c.head_dim % 2 == 0, "head_dim",
                  "must be even for RoPE, got " + std::to_string(c.head_dim));
    check.require(c.n_heads % c.n_kv_heads == 0, "n_heads",
                  "must be a multiple of n_kv_heads (" + std::to_string(c.n_kv_heads) + "), got " +
                      std::to_string(c.n_heads));
    check.require(c.n_experts >= 0, "n_experts",
                  "must be 0 (dense FFN) or positive, got " + std::to_string(c.n_experts));
    check.require(!c.is_moe() || (c.top_k >= 1 && c.top_k <= c.n_experts), "top_k",
                  "must be between 1 and n_experts (" + std::to_string(c.n_experts) + "), got " +
                      std::to_string(c.top_k));
    check.require(c.sliding_window >= 0, "sliding_window",
                  "must be 0 (unlimited) or positive, got " + std::to_string(c.sliding_window));
    check.real(c.norm_eps, c.norm_eps > 0, "norm_eps", "> 0");
    check.real(c.rope_theta, c.rope_theta > 0, "rope_theta", "> 0");
    check.real(c.router_aux_loss_coef, c.router_aux_loss_coef >= 0, "router_aux_loss_coef", ">= 0");
    // Token ids and positions travel as int32 on every backend.
    if (c.vocab_size > (int64_t{1} << 31) - 1) fail(src, "vocab_size", "must be below 2^31");
    if (c.max_seq_len > (int64_t{1} << 31) - 1) fail(src, "max_seq_len", "must be below 2^31");
    if (c.n_layers > kMaxLayers)
        fail(src, "n_layers",
             "must be at most " + std::to_string(kMaxLayers) + ", got " +
                 std::to_string(c.n_layers));
    if (c.is_moe() && c.n_experts > kMaxLayerExperts / c.n_layers)
        fail(src, "n_experts",
             "n_layers x n_experts must be at most " + std::to_string(kMaxLayerExperts) + ", got " +
                 std::to_string(c.n_layers) + " x " + std::to_string(c.n_experts));
    const int64_t params = param_count(c, src);
    if (params > kMaxParams)
        throw Error(src + ": the model would have " + std::to_string(params) +
                    " parameters, more than the limit of " + std::to_string(kMaxParams) +
                    " (2^48)");
}

int64_t param_count(const ModelConfig& c, const std::string& src) {
    const std::string context = src + ": parameter count";
    auto mul = [&](std::initializer_list<int64_t> factors) {
        return checked_product(factors, context);
    };
    const int64_t d = c.d_model;
    const int64_t q_dim = mul({c.n_heads, c.head_dim}), kv_dim = mul({c.n_kv_heads, c.head_dim});
    const int64_t norm = c.has_norm_bias() ? mul({2, d}) : d;
    auto linear = [&](int64_t out, int64_t in, bool bias) {
        return checked_add(mul({out, in}), bias ? out : 0, context);
    };
    const int64_t attention =
        checked_sum({linear(q_dim, d, c.attn_bias), linear(kv_dim, d, c.attn_bias),
                     linear(kv_dim, d, c.attn_bias), linear(d, q_dim, c.attn_bias)},
                    context);
    // One expert, or the dense FFN: w1 [d_ff, d], w2 [d, d_ff], and w3 [d_ff, d] for SwiGLU.
    const int64_t ffn =
        checked_sum({linear(c.d_ff, d, c.ffn_bias), linear(d, c.d_ff, c.ffn_bias),
                     c.ffn_type == FfnType::SwiGlu ? linear(c.d_ff, d, c.ffn_bias) : 0},
                    context);
    const int64_t moe_or_dense =
        c.is_moe() ? checked_add(mul({c.n_experts, d}), mul({c.n_experts, ffn}), context) : ffn;
    const int64_t layer = checked_sum({mul({2, norm}), attention, moe_or_dense}, context);
    const int64_t embedding = mul({c.vocab_size, d});
    return checked_sum(
        {embedding, mul({c.n_layers, layer}), norm, c.tie_embeddings ? 0 : embedding}, context);
}

ModelConfig config_from_json(const json& j, const std::string& src) {
    if (!j.is_object()) throw Error(src + ": expected a JSON object with the model's fields");
    ModelConfig c;
    using Setter = std::function<void(const json&, const std::string&)>;
    auto int_field = [&](int64_t& dst) -> Setter {
        return [&dst, &src](const json& v, const std::string& f) { dst = as_int(v, src, f); };
    };
    auto num_field = [&](double& dst) -> Setter {
        return [&dst, &src](const json& v, const std::string& f) { dst = as_number(v, src, f); };
    };
    auto bool_field = [&](bool& dst) -> Setter {
        return [&dst, &src](const json& v, const std::string& f) { dst = as_bool(v, src, f); };
    };
    const std::map<std::string, Setter> fields = {
        {"vocab_size", int_field(c.vocab_size)},
        {"d_model", int_field(c.d_model)},
        {"n_layers", int_field(c.n_layers)},
        {"n_heads", int_field(c.n_heads)},
        {"n_kv_heads", int_field(c.n_kv_heads)},
        {"head_dim", int_field(c.head_dim)},
        {"ffn_type",
         [&](const json& v, const std::string& f) { c.ffn_type = as_enum(v, src, f, kFfnTypes); }},
        {"activation",
         [&](const json& v, const std::string& f) {
             c.activation = as_enum(v, src, f, kActivations);
         }},
        {"d_ff", int_field(c.d_ff)},
        {"ffn_bias", bool_field(c.ffn_bias)},
        {"attn_bias", bool_field(c.attn_bias)},
        {"norm_type", [&](const json& v,
                          const std::string& f) { c.norm_type = as_enum(v, src, f, kNormTypes); }},
        {"norm_eps", num_field(c.norm_eps)},
        {"n_experts", int_field(c.n_experts)},
        {"top_k", int_field(c.top_k)},
        {"router_aux_loss_coef", num_field(c.router_aux_loss_coef)},
        {"rope_theta", num_field(c.rope_theta)},
        {"max_seq_len", int_field(c.max_seq_len)},
        {"sliding_window", int_field(c.sliding_window)},
        {"tie_embeddings", bool_field(c.tie_embeddings)},
    };
    for (const auto& [key, value] : j.items()) {
        if (key == "format_version") {  // written by checkpoints; not a model field
            int64_t v = as_int(value, src, key);
            if (v > kCheckpointFormatVersion)
                fail(src, key,
                     "version " + std::to_string(v) + " is newer than this engine reads (" +
                         std::to_string(kCheckpointFormatVersion) + ")");
            continue;
        }
        auto it = fields.find(key);
        if (it == fields.end()) {
            std::string known;
            for (const auto& [name, _] : fields) known += (known.empty() ? "" : ", ") + name;
            throw Error(src + ": unknown field '" + key + "' (known fields: " + known + ")");
        }
        it->second(value, key);
    }
    validate_config(c, src);
    return c;
}

ModelConfig load_config(const std::string& path) {
    return config_from_json(read_json_file(path), path);
}

json config_to_json(const ModelConfig& c) {
    json j;
    j["vocab_size"] = c.vocab_size;
    j["d_model"] = c.d_model;
    j["n_layers"] = c.n_layers;
    j["n_heads"] = c.n_heads;
    j["n_kv_heads"] = c.n_kv_heads;
    j["head_dim"] = c.head_dim;
    j["ffn_type"] = to_string(c.ffn_type);
    j["activation"] = to_string(c.activation);
    j["d_ff"] = c.d_ff;
    j["ffn_bias"] = c.ffn_bias;
    j["attn_bias"] = c.attn_bias;
    j["norm_type"] = to_string(c.norm_type);
    j["norm_eps"] = c.norm_eps;
    j["n_experts"] = c.n_experts;
    j["top_k"] = c.top_k;
    j["router_aux_loss_coef"] = c.router_aux_loss_coef;
    j["rope_theta"] = c.rope_theta;
    j["max_seq_len"] = c.max_seq_len;
    j["sliding_window"] = c.sliding_window;
    j["tie_embeddings"] = c.tie_embeddings;
    return j;
}

}  // namespace tmx

// What the family counters (engine/report/count_<family>.cpp) share: typed reading of a config's
// fields, the building blocks of a transformer block, and the declaration of every counter.
#pragma once

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/errors.h"
#include "engine/core/json_fields.h"
#include "engine/core/range_checks.h"
#include "engine/model/config.h"
#include "engine/report/param_report.h"
#include "engine/report/report_util.h"

namespace tmx::report_detail {

using nlohmann::json;

// ------------------------------------------------------------------------------------------
// Reading config fields

using json_fields::describe;

// Typed access to one config's fields; every error names the file and the field.
class FieldReader {
  public:
    FieldReader(const json& j, const std::string& src, std::string what)
        : j_(j), src_(src), what_(std::move(what)) {}

    [[noreturn]] void fail(const std::string& field, const std::string& msg) const {
        json_fields::fail(src_, field, msg);
    }

    // True when the key is present with a non-null value.
    bool has(const std::string& key) const {
        auto it = j_.find(key);
        return it != j_.end() && !it->is_null();
    }
    bool present(const std::string& key) const { return j_.contains(key); }

    // The first of `keys` that has a value (aliases, as Hugging Face's attribute_map), or null.
    const json* find(std::initializer_list<const char*> keys, std::string* found) const {
        for (const char* k : keys) {
            if (has(k)) {
                *found = k;
                return &j_.at(k);
            }
        }
        *found = *keys.begin();
        return nullptr;
    }

    int64_t as_int(const json& v, const std::string& key) const {
        return json_fields::as_whole_number(v, src_, key);
    }

    // A size key: must be present; a missing one is an error, not a class default.
    int64_t required(std::initializer_list<const char*> keys) const {
        std::string key;
        const json* v = find(keys, &key);
        if (!v) fail(key, "missing: it is required to size a " + what_ + " model");
        return positive(key, as_int(*v, key));
    }
    int64_t integer(std::initializer_list<const char*> keys, int64_t def) const {
        std::string key;
        const json* v = find(keys, &key);
        return v ? as_int(*v, key) : def;
    }
    int64_t integer(const char* key, int64_t def) const { return integer({key}, def); }
    std::optional<int64_t> optional_int(const char* key) const {
        if (!has(key)) return std::nullopt;
        return as_int(j_.at(key), key);
    }
    int64_t positive_int(const char* key, int64_t def) const {
        return positive(key, integer(key, def));
    }
    // A layer count: the report keeps one entry per layer, so it is bounded.
    int64_t layers(const std::string& key, int64_t v) const {
        if (v > kMaxLayers)
            fail(key,
                 "must be at most " + std::to_string(kMaxLayers) + ", got " + std::to_string(v));
        return v;
    }
    int64_t required_layers(std::initializer_list<const char*> keys) const {
        std::string key;
        find(keys, &key);
        return layers(key, required(keys));
    }
    int64_t positive(const std::string& key, int64_t v) const {
        checks().positive(v, key);
        return v;
    }
    int64_t non_negative(const std::string& key, int64_t v) const {
        checks().not_negative(v, key);
        return v;
    }
    double number(const char* key, double def) const {
        return has(key) ? json_fields::as_number(j_.at(key), src_, key) : def;
    }
    bool boolean(const char* key, bool def) const {
        return has(key) ? json_fields::as_bool(j_.at(key), src_, key) : def;
    }
    std::string string(const char* key, const std::string& def) const {
        return has(key) ? json_fields::as_string(j_.at(key), src_, key) : def;
    }
    std::vector<int64_t> int_list(const char* key) const {
        std::vector<int64_t> out;
        if (!has(key)) return out;
        const json& v = j_.at(key);
        if (!v.is_array()) fail(key, "expected a list of integers, got " + describe(v));
        for (const json& e : v) out.push_back(as_int(e, key));
        return out;
    }
    // num_key_value_heads: absent -> the class default; null -> the query head count.
    int64_t kv_heads(int64_t heads, std::optional<int64_t> class_default) const {
        const char* key = "num_key_value_heads";
        int64_t kv = has(key) ? as_int(j_.at(key), key)
                              : (present(key) ? heads : class_default.value_or(heads));
        positive(key, kv);
        if (heads % kv != 0)
            fail(key, "num_attention_heads (" + std::to_string(heads) +
                          ") must be a multiple of it, got " + std::to_string(kv));
        return kv;
    }
    // head_dim key when given, else hidden / heads.
    int64_t head_dim(int64_t hidden, int64_t heads, const char* hidden_key,
                     const char* heads_key) const {
        if (has("head_dim")) return positive("head_dim", as_int(j_.at("head_dim"), "head_dim"));
        if (hidden % heads != 0)
            fail(hidden_key, "must be a multiple of " + std::string(heads_key) + " (" +
                                 std::to_string(heads) + ") when head_dim is not given, got " +
                                 std::to_string(hidden));
        return hidden / heads;
    }

  private:
    RangeChecks checks() const {
        return RangeChecks([this](const OptionText& field, const std::string& problem) {
            fail(field.spelled(), problem);
        });
    }

    const json& j_;
    const std::string& src_;
    std::string what_;
};

// The sizes every family's prologue reads: vocabulary, width, layers and query heads, each
// required, under the family's key names (the first key of each list is the one errors name).
struct CoreDims {
    int64_t vocab = 0, d = 0, layers = 0, heads = 0;
};
CoreDims read_core_dims(const FieldReader& r,
                        std::initializer_list<const char*> hidden_keys = {"hidden_size"},
                        std::initializer_list<const char*> layer_keys = {"num_hidden_layers"},
                        std::initializer_list<const char*> head_keys = {"num_attention_heads"});

// A llama-style decoder's sizes: the core ones plus KV heads (num_key_value_heads, defaulting
// to the class default, or to the query heads when there is none) and head_dim (the key, or
// hidden_size / num_attention_heads).
struct DecoderDims {
    int64_t vocab = 0, d = 0, layers = 0, heads = 0, kv = 0, hd = 0;
};
DecoderDims read_decoder_dims(const FieldReader& r, std::optional<int64_t> kv_default);

// ------------------------------------------------------------------------------------------
// Building blocks shared by every family

struct AttnBias {
    bool q = false, k = false, v = false, o = false;
};

// Adds a Linear(in, out) to a group; a token passing the block multiplies by its weight.
void add_linear(BlockCount& b, ParamGroup g, int64_t in, int64_t out, bool bias);

// Attention with q [H*hd, d], k/v [Hkv*hd, d], o [d, H*hd].
void add_attention(BlockCount& b, int64_t d, int64_t heads, int64_t kv_heads, int64_t head_dim,
                   AttnBias bias, AttentionOp::Kind kind);

// Norm parameters: none (functional), weight (RMSNorm, T5 LayerNorm), weight + bias (LayerNorm).
enum class NormKind { Functional = 0, Weight = 1, WeightBias = 2 };

void add_norms(BlockCount& b, int64_t count, int64_t width, NormKind kind);

// A feed-forward network: two matrices (w_in, w_out), or three when gated (SwiGLU).
struct FfnShape {
    int64_t width = 0;
    bool gated = false;
    bool bias = false;
    int64_t params(int64_t d) const {
        int64_t n_in = gated ? 2 : 1;
        return add(mul(n_in, add(mul(d, width), bias ? width : 0)),
                   add(mul(width, d), bias ? d : 0));
    }
    int64_t matrices(int64_t d) const { return mul(gated ? 3 : 2, mul(d, width)); }
    int64_t activations() const { return mul(gated ? 3 : 2, width); }  // pre/post activation
};

void add_dense_ffn(BlockCount& b, int64_t d, const FfnShape& f);

// Router [E, d] + E routed experts of which a token uses top_k.
void add_moe(BlockCount& b, int64_t d, int64_t n_experts, int64_t top_k, const FfnShape& expert,
             bool router_bias = false);

// An always-on expert (shares the MoE block's input).
void add_shared_ffn(BlockCount& b, int64_t d, const FfnShape& f);

BlockCount new_block(const std::string& stack);

// The pre-norm decoder block of llama-style models: input norm, attention, post-attention
// norm (RMSNorm); the caller adds the FFN.
BlockCount llama_style_block(int64_t d, int64_t heads, int64_t kv_heads, int64_t head_dim,
                             AttnBias bias);

// Token embedding, final norm(s) and LM head.
void set_embeddings(ModelCount& m, int64_t vocab, int64_t d, bool tied);

std::string ffn_text(const FfnShape& f, const std::string& act);

ModelCount make_model(const std::string& format, const std::string& model_type);

// ------------------------------------------------------------------------------------------
// Families. One function each (engine/report/count_<family>.cpp); the blocks above carry the
// shared structure. count_native, the native counter, is public (param_report.h).

ModelCount count_llama_family(const json& j, const std::string& src, const std::string& type);
ModelCount count_qwen2_moe(const json& j, const std::string& src);
ModelCount count_olmoe(const json& j, const std::string& src);
ModelCount count_deepseek(const json& j, const std::string& src);
ModelCount count_gpt2(const json& j, const std::string& src);
ModelCount count_switch(const json& j, const std::string& src);
ModelCount count_nanochat(const json& j, const std::string& src);

// ------------------------------------------------------------------------------------------
// Config formats (engine/report/param_counts.cpp)

enum class Format { Native, HuggingFace, Nanochat };

// Which format a config is in; throws tmx::Error naming `src` when it is not a JSON object.
Format detect_format(const json& j, const std::string& src);
// The config's model_type when it is one of the supported Hugging Face types; throws tmx::Error
// naming `src` and the supported types otherwise.
std::string hf_model_type(const json& j, const std::string& src);

}  // namespace tmx::report_detail

#include "engine/report/param_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "engine/core/checked_math.h"
#include "engine/core/errors.h"

namespace tmx {
namespace {

using nlohmann::json;

constexpr int idx(ParamGroup g) {
    return static_cast<int>(g);
}

// Counting arithmetic, overflow-checked: a config's sizes are arbitrary integers. count_model
// adds the file's name to the error.
constexpr const char* kCountContext = "the parameter count";
int64_t mul(int64_t a, int64_t b) {
    return checked_mul(a, b, kCountContext);
}
int64_t add(int64_t a, int64_t b) {
    return checked_add(a, b, kCountContext);
}
// dst += v, checked.
void accumulate(int64_t& dst, int64_t v) {
    dst = add(dst, v);
}

// ------------------------------------------------------------------------------------------
// Reading config fields

std::string describe(const json& v) {
    std::string s = v.dump();
    if (s.size() > 40) s = s.substr(0, 37) + "...";
    return s;
}

// Typed access to one config's fields; every error names the file and the field.
class FieldReader {
  public:
    FieldReader(const json& j, const std::string& src, std::string what)
        : j_(j), src_(src), what_(std::move(what)) {}

    [[noreturn]] void fail(const std::string& field, const std::string& msg) const {
        throw Error(src_ + ": field '" + field + "': " + msg);
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
        // nlohmann keeps integers up to 2^64 - 1 as unsigned; beyond int64_t they would wrap.
        if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
            fail(key, "expected an integer that fits in 64 bits, got " + describe(v));
        if (v.is_number_integer()) return v.get<int64_t>();
        if (v.is_number_float()) {
            double d = v.get<double>();
            if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15)
                return static_cast<int64_t>(d);
        }
        fail(key, "expected an integer, got " + describe(v));
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
        if (v <= 0) fail(key, "must be positive, got " + std::to_string(v));
        return v;
    }
    int64_t non_negative(const std::string& key, int64_t v) const {
        if (v < 0) fail(key, "must not be negative, got " + std::to_string(v));
        return v;
    }
    double number(const char* key, double def) const {
        if (!has(key)) return def;
        const json& v = j_.at(key);
        if (!v.is_number()) fail(key, "expected a number, got " + describe(v));
        return v.get<double>();
    }
    bool boolean(const char* key, bool def) const {
        if (!has(key)) return def;
        const json& v = j_.at(key);
        if (!v.is_boolean()) fail(key, "expected true or false, got " + describe(v));
        return v.get<bool>();
    }
    std::string string(const char* key, const std::string& def) const {
        if (!has(key)) return def;
        const json& v = j_.at(key);
        if (!v.is_string()) fail(key, "expected a string, got " + describe(v));
        return v.get<std::string>();
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
    const json& j_;
    const std::string& src_;
    std::string what_;
};

// ------------------------------------------------------------------------------------------
// Building blocks shared by every family

struct AttnBias {
    bool q = false, k = false, v = false, o = false;
};

// Adds a Linear(in, out) to a group; a token passing the block multiplies by its weight.
void add_linear(BlockCount& b, ParamGroup g, int64_t in, int64_t out, bool bias) {
    accumulate(b.params[idx(g)], add(mul(in, out), bias ? out : 0));
    accumulate(b.matmul_params, mul(in, out));
}

// Attention with q [H*hd, d], k/v [Hkv*hd, d], o [d, H*hd].
void add_attention(BlockCount& b, int64_t d, int64_t heads, int64_t kv_heads, int64_t head_dim,
                   AttnBias bias, AttentionOp::Kind kind) {
    const int64_t q = mul(heads, head_dim), kv = mul(kv_heads, head_dim);
    add_linear(b, ParamGroup::Attention, d, q, bias.q);
    add_linear(b, ParamGroup::Attention, d, kv, bias.k);
    add_linear(b, ParamGroup::Attention, d, kv, bias.v);
    add_linear(b, ParamGroup::Attention, q, d, bias.o);
    b.attention.push_back({kind, heads, kv_heads, head_dim});
    // Kept for backward: the input, q, k, v and the attention output (flash attention: no
    // score matrix).
    accumulate(b.activation_elems, add(d, mul(2, add(q, kv))));
}

// Norm parameters: none (functional), weight (RMSNorm, T5 LayerNorm), weight + bias (LayerNorm).
enum class NormKind { Functional = 0, Weight = 1, WeightBias = 2 };

void add_norms(BlockCount& b, int64_t count, int64_t width, NormKind kind) {
    accumulate(b.params[idx(ParamGroup::Norms)],
               mul(mul(count, width), static_cast<int64_t>(kind)));
    accumulate(b.activation_elems, mul(count, width));  // each norm keeps its input
}

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

void add_dense_ffn(BlockCount& b, int64_t d, const FfnShape& f) {
    accumulate(b.params[idx(ParamGroup::DenseFfn)], f.params(d));
    accumulate(b.matmul_params, f.matrices(d));
    accumulate(b.activation_elems, add(d, f.activations()));
    b.kind = "dense";
}

// Router [E, d] + E routed experts of which a token uses top_k.
void add_moe(BlockCount& b, int64_t d, int64_t n_experts, int64_t top_k, const FfnShape& expert,
             bool router_bias = false) {
    add_linear(b, ParamGroup::Router, d, n_experts, router_bias);
    accumulate(b.params[idx(ParamGroup::RoutedExperts)], mul(n_experts, expert.params(d)));
    accumulate(b.inactive_params, mul(n_experts - top_k, expert.params(d)));
    accumulate(b.matmul_params, mul(top_k, expert.matrices(d)));
    // The FFN input, the router logits, and per chosen expert its gathered input and hidden.
    accumulate(b.activation_elems,
               add(add(d, n_experts), mul(top_k, add(d, expert.activations()))));
    b.kind = "MoE";
}

// An always-on expert (shares the MoE block's input).
void add_shared_ffn(BlockCount& b, int64_t d, const FfnShape& f) {
    accumulate(b.params[idx(ParamGroup::SharedExperts)], f.params(d));
    accumulate(b.matmul_params, f.matrices(d));
    accumulate(b.activation_elems, f.activations());
}

BlockCount new_block(const std::string& stack) {
    BlockCount b;
    b.stack = stack;
    return b;
}

// The pre-norm decoder block of llama-style models: input norm, attention, post-attention
// norm (RMSNorm); the caller adds the FFN.
BlockCount llama_style_block(int64_t d, int64_t heads, int64_t kv_heads, int64_t head_dim,
                             AttnBias bias) {
    BlockCount b = new_block("decoder");
    add_norms(b, 2, d, NormKind::Weight);
    add_attention(b, d, heads, kv_heads, head_dim, bias, AttentionOp::Causal);
    return b;
}

// Token embedding, final norm(s) and LM head.
void set_embeddings(ModelCount& m, int64_t vocab, int64_t d, bool tied) {
    m.vocab_size = vocab;
    m.d_model = d;
    m.global[idx(ParamGroup::Embedding)] = mul(vocab, d);
    m.lm_head_tied = tied;
    m.global[idx(ParamGroup::LmHead)] = tied ? 0 : mul(vocab, d);
    m.lm_head_matmul = mul(vocab, d);
}

std::string fmt(int64_t v) {
    return with_thousands(v);
}

std::string ffn_text(const FfnShape& f, const std::string& act) {
    return (f.gated ? "SwiGLU" : act) + " FFN of width " + fmt(f.width) +
           (f.bias ? " (with biases)" : " (no biases)");
}

std::string attention_text(int64_t heads, int64_t kv_heads, int64_t head_dim) {
    std::string s = fmt(heads) + " query heads";
    if (kv_heads != heads) s += ", " + fmt(kv_heads) + " KV heads (GQA)";
    return s + ", head_dim " + fmt(head_dim);
}

// ------------------------------------------------------------------------------------------
// Families. One function each; the blocks above carry the shared structure.

ModelCount make_model(const std::string& format, const std::string& model_type) {
    ModelCount m;
    m.format = format;
    m.model_type = model_type;
    m.stacks = {{"decoder", 0}};
    return m;
}

}  // namespace

// Native tiny-mixtral (DESIGN.md section 2).
ModelCount count_native(const ModelConfig& c) {
    ModelCount m = make_model("native", "tiny-mixtral");
    const int64_t d = c.d_model;
    const bool ln = c.has_norm_bias();
    set_embeddings(m, c.vocab_size, d, c.tie_embeddings);
    FfnShape ffn{c.d_ff, c.ffn_type == FfnType::SwiGlu, c.ffn_bias};
    AttnBias bias{c.attn_bias, c.attn_bias, c.attn_bias, c.attn_bias};
    for (int64_t i = 0; i < c.n_layers; ++i) {
        BlockCount b = new_block("decoder");
        add_norms(b, 2, d, ln ? NormKind::WeightBias : NormKind::Weight);
        add_attention(b, d, c.n_heads, c.n_kv_heads, c.head_dim, bias, AttentionOp::Causal);
        if (c.is_moe())
            add_moe(b, d, c.n_experts, c.top_k, ffn);
        else
            add_dense_ffn(b, d, ffn);
        m.blocks.push_back(std::move(b));
    }
    m.stacks[0].final_norm_params = ln ? 2 * d : d;
    m.context = c.max_seq_len;
    m.context_origin = "max_seq_len";
    m.sliding_window = c.sliding_window;
    m.details.push_back(std::string(to_string(c.norm_type)) + ", " +
                        ffn_text(ffn, to_string(c.activation)) +
                        (c.attn_bias ? ", attention biases" : ", no attention biases") +
                        ", RoPE (no position parameters)" +
                        (c.tie_embeddings ? ", LM head tied" : ", LM head untied"));
    if (c.is_moe())
        m.details.push_back("MoE in every layer: " + fmt(c.n_experts) + " experts, top-" +
                            fmt(c.top_k) + ", router without bias");
    return m;
}

namespace {

// llama, mistral, mixtral: the same pre-norm RMSNorm / SwiGLU decoder; they differ in defaults,
// in the sliding window, and mixtral's sparse FFN.
ModelCount count_llama_family(const json& j, const std::string& src, const std::string& type) {
    FieldReader r(j, src, type);
    const bool is_llama = type == "llama", is_mixtral = type == "mixtral";
    ModelCount m = make_model("huggingface", type);
    const int64_t vocab = r.required({"vocab_size"});
    const int64_t d = r.required({"hidden_size"});
    const int64_t layers = r.required_layers({"num_hidden_layers"});
    const int64_t heads = r.required({"num_attention_heads"});
    const int64_t kv = r.kv_heads(heads, is_llama ? std::nullopt : std::optional<int64_t>(8));
    const int64_t hd = r.head_dim(d, heads, "hidden_size", "num_attention_heads");
    const int64_t inter = r.positive_int("intermediate_size", is_llama ? 11008 : 14336);
    // Only LlamaForCausalLM has these switches; Mistral and Mixtral have no biases.
    bool attn_bias = false, mlp_bias = false;
    if (is_llama) {
        attn_bias = r.boolean("attention_bias", false);
        mlp_bias = r.boolean("mlp_bias", false);
    } else if (r.boolean("attention_bias", false) || r.boolean("mlp_bias", false)) {
        m.notes.push_back("attention_bias / mlp_bias ignored: the " + type +
                          " architecture has no biases");
    }
    set_embeddings(m, vocab, d, r.boolean("tie_word_embeddings", false));
    FfnShape ffn{inter, true, mlp_bias};
    int64_t experts = 0, top_k = 0;
    if (is_mixtral) {
        experts =
            r.positive("num_local_experts", r.integer({"num_local_experts", "num_experts"}, 8));
        top_k = r.positive_int("num_experts_per_tok", 2);
        if (top_k > experts)
            r.fail("num_experts_per_tok",
                   "must not exceed num_local_experts (" + fmt(experts) + "), got " + fmt(top_k));
    }
    AttnBias bias{attn_bias, attn_bias, attn_bias, attn_bias};
    for (int64_t i = 0; i < layers; ++i) {
        BlockCount b = llama_style_block(d, heads, kv, hd, bias);
        if (is_mixtral)
            add_moe(b, d, experts, top_k, ffn);
        else
            add_dense_ffn(b, d, ffn);
        m.blocks.push_back(std::move(b));
    }
    m.stacks[0].final_norm_params = d;
    m.context = r.positive_int("max_position_embeddings", is_llama ? 2048 : 4096 * 32);
    m.context_origin = "max_position_embeddings";
    if (type == "mistral") {
        // Absent: the class default 4096; null: full attention.
        m.sliding_window =
            r.present("sliding_window")
                ? r.non_negative("sliding_window", r.optional_int("sliding_window").value_or(0))
                : 4096;
    } else if (is_mixtral) {
        m.sliding_window =
            r.non_negative("sliding_window", r.optional_int("sliding_window").value_or(0));
    }
    m.details.push_back("RMSNorm, " + ffn_text(ffn, "") +
                        (attn_bias ? ", attention biases" : ", no attention biases") + ", RoPE" +
                        (m.lm_head_tied ? ", LM head tied" : ", LM head untied"));
    if (is_mixtral)
        m.details.push_back("MoE in every layer: " + fmt(experts) + " experts, top-" + fmt(top_k) +
                            ", router without bias");
    return m;
}

// Qwen2-MoE (Qwen1.5-MoE): q/k/v biases, sparse layers every decoder_sparse_step layers except
// mlp_only_layers, each with 60-style routed experts plus one shared expert behind a sigmoid
// gate (Linear d -> 1).
ModelCount count_qwen2_moe(const json& j, const std::string& src) {
    FieldReader r(j, src, "qwen2_moe");
    ModelCount m = make_model("huggingface", "qwen2_moe");
    const int64_t vocab = r.required({"vocab_size"});
    const int64_t d = r.required({"hidden_size"});
    const int64_t layers = r.required_layers({"num_hidden_layers"});
    const int64_t heads = r.required({"num_attention_heads"});
    const int64_t kv = r.kv_heads(heads, 16);
    const int64_t hd = r.head_dim(d, heads, "hidden_size", "num_attention_heads");
    const int64_t inter = r.positive_int("intermediate_size", 5632);
    const int64_t experts = r.non_negative("num_experts", r.integer("num_experts", 60));
    const int64_t top_k = r.positive_int("num_experts_per_tok", 4);
    const int64_t moe_inter = r.positive_int("moe_intermediate_size", 1408);
    const int64_t shared_inter = r.non_negative("shared_expert_intermediate_size",
                                                r.integer("shared_expert_intermediate_size", 5632));
    const int64_t step = r.integer("decoder_sparse_step", 1);
    const std::vector<int64_t> mlp_only = r.int_list("mlp_only_layers");
    const bool qkv_bias = r.boolean("qkv_bias", true);
    if (experts > 0 && step <= 0)
        r.fail("decoder_sparse_step", "must be positive, got " + std::to_string(step));
    if (experts > 0 && top_k > experts)
        r.fail("num_experts_per_tok",
               "must not exceed num_experts (" + fmt(experts) + "), got " + fmt(top_k));
    set_embeddings(m, vocab, d, r.boolean("tie_word_embeddings", false));
    const std::set<int64_t> dense_layers(mlp_only.begin(), mlp_only.end());
    FfnShape dense{inter, true, false}, expert{moe_inter, true, false},
        shared{shared_inter, true, false};
    AttnBias bias{qkv_bias, qkv_bias, qkv_bias, false};
    for (int64_t i = 0; i < layers; ++i) {
        BlockCount b = llama_style_block(d, heads, kv, hd, bias);
        if (!dense_layers.count(i) && experts > 0 && (i + 1) % step == 0) {
            add_moe(b, d, experts, top_k, expert);
            add_shared_ffn(b, d, shared);
            add_linear(b, ParamGroup::SharedExperts, d, 1, false);  // shared_expert_gate
        } else {
            add_dense_ffn(b, d, dense);
        }
        m.blocks.push_back(std::move(b));
    }
    m.stacks[0].final_norm_params = d;
    m.context = r.positive_int("max_position_embeddings", 32768);
    m.context_origin = "max_position_embeddings";
    if (r.boolean("use_sliding_window", false))
        m.notes.push_back(
            "use_sliding_window: Qwen2-MoE windows only some layers; the KV "
            "cache and attention FLOPs here assume full attention everywhere");
    m.details.push_back(std::string("RMSNorm, q/k/v ") + (qkv_bias ? "with" : "without") +
                        " biases (o_proj without), RoPE" +
                        (m.lm_head_tied ? ", LM head tied" : ", LM head untied"));
    m.details.push_back("MoE layers: " + fmt(experts) + " routed experts (SwiGLU, width " +
                        fmt(moe_inter) + "), top-" + fmt(top_k) +
                        ", plus 1 shared expert (SwiGLU, width " + fmt(shared_inter) +
                        ") behind a sigmoid gate Linear(" + fmt(d) + " -> 1)");
    m.details.push_back("dense layers (mlp_only_layers or off-step): SwiGLU MLP of width " +
                        fmt(inter));
    return m;
}

// OLMoE: every layer sparse (no shared expert); QK-norm: RMSNorm over the whole q projection
// (H*hd) and the whole k projection (Hkv*hd).
ModelCount count_olmoe(const json& j, const std::string& src) {
    FieldReader r(j, src, "olmoe");
    ModelCount m = make_model("huggingface", "olmoe");
    const int64_t vocab = r.required({"vocab_size"});
    const int64_t d = r.required({"hidden_size"});
    const int64_t layers = r.required_layers({"num_hidden_layers"});
    const int64_t heads = r.required({"num_attention_heads"});
    const int64_t kv = r.kv_heads(heads, std::nullopt);
    const int64_t hd = r.head_dim(d, heads, "hidden_size", "num_attention_heads");
    const int64_t inter = r.positive_int("intermediate_size", 2048);
    const int64_t experts =
        r.positive("num_experts", r.integer({"num_experts", "num_local_experts"}, 64));
    const int64_t top_k = r.positive_int("num_experts_per_tok", 8);
    if (top_k > experts)
        r.fail("num_experts_per_tok",
               "must not exceed num_experts (" + fmt(experts) + "), got " + fmt(top_k));
    const bool attn_bias = r.boolean("attention_bias", false);
    set_embeddings(m, vocab, d, r.boolean("tie_word_embeddings", false));
    FfnShape expert{inter, true, false};
    const int64_t q_norm = mul(heads, hd), k_norm = mul(kv, hd);
    for (int64_t i = 0; i < layers; ++i) {
        BlockCount b =
            llama_style_block(d, heads, kv, hd, {attn_bias, attn_bias, attn_bias, attn_bias});
        add_norms(b, 1, q_norm, NormKind::Weight);
        add_norms(b, 1, k_norm, NormKind::Weight);
        add_moe(b, d, experts, top_k, expert);
        m.blocks.push_back(std::move(b));
    }
    m.stacks[0].final_norm_params = d;
    m.context = r.positive_int("max_position_embeddings", 4096);
    m.context_origin = "max_position_embeddings";
    m.details.push_back("RMSNorm, QK-norm (q_norm " + fmt(q_norm) + ", k_norm " + fmt(k_norm) +
                        ", counted under norms), RoPE" +
                        (attn_bias ? ", attention biases" : ", no attention biases") +
                        (m.lm_head_tied ? ", LM head tied" : ", LM head untied"));
    m.details.push_back("MoE in every layer: " + fmt(experts) + " experts (SwiGLU, width " +
                        fmt(inter) + "), top-" + fmt(top_k) + ", no shared expert");
    return m;
}

// DeepSeekMoE v1 (remote-code model_type "deepseek"): the first first_k_dense_replace layers
// dense, then MoE every moe_layer_freq layers: n_routed_experts fine-grained experts plus one
// shared MLP of width n_shared_experts * moe_intermediate_size.
ModelCount count_deepseek(const json& j, const std::string& src) {
    FieldReader r(j, src, "deepseek");
    ModelCount m = make_model("huggingface", "deepseek");
    const int64_t vocab = r.required({"vocab_size"});
    const int64_t d = r.required({"hidden_size"});
    const int64_t layers = r.required_layers({"num_hidden_layers"});
    const int64_t heads = r.required({"num_attention_heads"});
    const int64_t kv = r.kv_heads(heads, 32);
    const int64_t hd = r.head_dim(d, heads, "hidden_size", "num_attention_heads");
    const int64_t inter = r.positive_int("intermediate_size", 11008);
    const int64_t moe_inter = r.positive_int("moe_intermediate_size", 1407);
    const std::optional<int64_t> routed = r.optional_int("n_routed_experts");
    const std::optional<int64_t> n_shared = r.optional_int("n_shared_experts");
    const int64_t freq = r.integer("moe_layer_freq", 1);
    const int64_t first_dense =
        r.non_negative("first_k_dense_replace", r.integer("first_k_dense_replace", 0));
    const bool attn_bias = r.boolean("attention_bias", false);
    int64_t top_k = 0;
    if (routed) {
        r.positive("n_routed_experts", *routed);
        if (freq <= 0) r.fail("moe_layer_freq", "must be positive, got " + std::to_string(freq));
        if (!r.has("num_experts_per_tok"))
            r.fail("num_experts_per_tok", "missing: required when n_routed_experts is set");
        top_k = r.positive_int("num_experts_per_tok", 0);
        if (top_k > *routed)
            r.fail("num_experts_per_tok",
                   "must not exceed n_routed_experts (" + fmt(*routed) + "), got " + fmt(top_k));
    }
    if (n_shared) r.non_negative("n_shared_experts", *n_shared);
    set_embeddings(m, vocab, d, r.boolean("tie_word_embeddings", false));
    FfnShape dense{inter, true, false}, expert{moe_inter, true, false},
        shared{mul(moe_inter, n_shared.value_or(0)), true, false};
    for (int64_t i = 0; i < layers; ++i) {
        BlockCount b =
            llama_style_block(d, heads, kv, hd, {attn_bias, attn_bias, attn_bias, attn_bias});
        if (routed && i >= first_dense && i % freq == 0) {
            add_moe(b, d, *routed, top_k, expert);
            if (n_shared) add_shared_ffn(b, d, shared);
        } else {
            add_dense_ffn(b, d, dense);
        }
        m.blocks.push_back(std::move(b));
    }
    m.stacks[0].final_norm_params = d;
    m.context = r.positive_int("max_position_embeddings", 2048);
    m.context_origin = "max_position_embeddings";
    m.details.push_back(std::string("RMSNorm, RoPE") +
                        (attn_bias ? ", attention biases" : ", no attention biases") +
                        (m.lm_head_tied ? ", LM head tied" : ", LM head untied"));
    if (routed)
        m.details.push_back("MoE layers (index >= first_k_dense_replace = " + fmt(first_dense) +
                            ", every moe_layer_freq = " + fmt(freq) + "): " + fmt(*routed) +
                            " routed experts (SwiGLU, width " + fmt(moe_inter) + "), top-" +
                            fmt(top_k) +
                            ", shared MLP of width n_shared_experts x moe_intermediate_size = " +
                            fmt(shared.width));
    m.details.push_back("dense layers: SwiGLU MLP of width " + fmt(inter));
    return m;
}

// GPT-2: learned positions, fused c_attn with bias, LayerNorm with bias, GELU MLP with biases,
// LM head tied to the token embedding.
ModelCount count_gpt2(const json& j, const std::string& src) {
    FieldReader r(j, src, "gpt2");
    ModelCount m = make_model("huggingface", "gpt2");
    const int64_t vocab = r.required({"vocab_size"});
    const int64_t d = r.required({"n_embd", "hidden_size"});
    const int64_t layers = r.required_layers({"n_layer", "num_hidden_layers"});
    const int64_t heads = r.required({"n_head", "num_attention_heads"});
    if (d % heads != 0)
        r.fail("n_embd", "must be a multiple of n_head (" + fmt(heads) + "), got " + fmt(d));
    const int64_t positions = r.positive_int("n_positions", 1024);
    const std::optional<int64_t> n_inner = r.optional_int("n_inner");
    FfnShape mlp{n_inner ? r.positive("n_inner", *n_inner) : mul(4, d), false, true};
    set_embeddings(m, vocab, d, r.boolean("tie_word_embeddings", true));
    m.global[idx(ParamGroup::Positional)] = mul(positions, d);
    for (int64_t i = 0; i < layers; ++i) {
        BlockCount b = new_block("decoder");
        add_norms(b, 2, d, NormKind::WeightBias);  // ln_1, ln_2
        add_attention(b, d, heads, heads, d / heads, {true, true, true, true},
                      AttentionOp::Causal);  // c_attn (q|k|v) and c_proj, all with bias
        add_dense_ffn(b, d, mlp);            // c_fc, c_proj
        m.blocks.push_back(std::move(b));
    }
    m.stacks[0].final_norm_params = 2 * d;  // ln_f
    m.context = positions;
    m.context_origin = "n_positions";
    m.details.push_back("LayerNorm (weight + bias), learned positions " + fmt(positions) + " x " +
                        fmt(d) + ", " + ffn_text(mlp, "GELU") + ", attention biases" +
                        (m.lm_head_tied ? ", LM head tied" : ", LM head untied"));
    return m;
}

// Switch Transformers (T5 encoder-decoder): no biases, T5 norms weight-only, relative attention
// bias in the first block of each stack, a sparse FFN (router without bias + experts) every
// sparse_step layers, shared embedding, LM head tied unless tie_word_embeddings is false.
ModelCount count_switch(const json& j, const std::string& src) {
    FieldReader r(j, src, "switch_transformers");
    ModelCount m = make_model("huggingface", "switch_transformers");
    const int64_t vocab = r.required({"vocab_size"});
    const int64_t d = r.required({"d_model", "hidden_size"});
    const int64_t enc_layers = r.required_layers({"num_layers", "num_hidden_layers"});
    const int64_t heads = r.required({"num_heads", "num_attention_heads"});
    const int64_t d_kv = r.positive_int("d_kv", 64);
    const int64_t d_ff = r.positive_int("d_ff", 2048);
    const std::optional<int64_t> dec_opt = r.optional_int("num_decoder_layers");
    const int64_t dec_layers =
        dec_opt ? r.layers("num_decoder_layers", r.positive("num_decoder_layers", *dec_opt))
                : enc_layers;
    const int64_t experts = r.positive_int("num_experts", 8);
    const int64_t buckets = r.non_negative("relative_attention_num_buckets",
                                           r.integer("relative_attention_num_buckets", 32));
    const bool router_bias = r.boolean("router_bias", false);
    // Hugging Face derives the step from num_sparse_*_layers; an explicit *_sparse_step key
    // in config.json overrides it.
    auto sparse_step = [&](const char* step_key, const char* count_key, int64_t n_layers) {
        if (r.has(step_key)) return r.non_negative(step_key, r.integer(step_key, 0));
        int64_t n_sparse = r.non_negative(count_key, r.integer(count_key, 3));
        return n_sparse > 0 ? n_layers / n_sparse : int64_t{0};
    };
    const int64_t enc_step =
        sparse_step("encoder_sparse_step", "num_sparse_encoder_layers", enc_layers);
    const int64_t dec_step =
        sparse_step("decoder_sparse_step", "num_sparse_decoder_layers", dec_layers);
    set_embeddings(m, vocab, d, r.boolean("tie_word_embeddings", true));
    m.stacks = {{"encoder", d}, {"decoder", d}};  // final_layer_norm of each stack
    FfnShape ffn{d_ff, false, false};
    auto add_stack = [&](const std::string& stack, int64_t n_layers, int64_t step) {
        const bool decoder = stack == "decoder";
        for (int64_t i = 0; i < n_layers; ++i) {
            BlockCount b = new_block(stack);
            add_norms(b, decoder ? 3 : 2, d, NormKind::Weight);
            add_attention(b, d, heads, heads, d_kv, {},
                          decoder ? AttentionOp::Causal : AttentionOp::Bidirectional);
            if (decoder) add_attention(b, d, heads, heads, d_kv, {}, AttentionOp::Cross);
            if (i == 0) accumulate(b.params[idx(ParamGroup::Positional)], mul(buckets, heads));
            if (step > 0 && (i % step == 1 || step == 1))
                add_moe(b, d, experts, 1, ffn, router_bias);
            else
                add_dense_ffn(b, d, ffn);
            m.blocks.push_back(std::move(b));
        }
    };
    add_stack("encoder", enc_layers, enc_step);
    add_stack("decoder", dec_layers, dec_step);
    m.context = 512;
    m.context_origin =
        "assumed: T5 relative positions have no fixed context; 512 is the "
        "pre-training input length";
    m.details.push_back("encoder-decoder; T5 LayerNorm (weight only), no biases, inner dim " +
                        fmt(heads) + " x d_kv " + fmt(d_kv) + "; relative attention bias (" +
                        fmt(buckets) + " buckets x " + fmt(heads) +
                        " heads) in the first block of each stack, counted as positional");
    m.details.push_back("sparse layers: encoder every " + fmt(enc_step) + ", decoder every " +
                        fmt(dec_step) + " (index % step == 1): " + fmt(experts) +
                        " experts (ReLU FFN, width " + fmt(d_ff) +
                        "), top-1, router without bias; shared token embedding" +
                        (m.lm_head_tied ? ", LM head tied" : ", LM head untied"));
    m.notes.push_back(
        "active parameters and FLOPs count one token through the encoder and one "
        "through the decoder (an input/output pair of equal length); the stack "
        "lines split them");
    return m;
}

// nanochat GPT: RMSNorm without parameters, ReLU^2 MLP of 4x width, no biases, rotary positions,
// untied LM head.
ModelCount count_nanochat(const json& j, const std::string& src) {
    FieldReader r(j, src, "nanochat");
    ModelCount m = make_model("nanochat", "nanochat");
    static const std::set<std::string> known = {"sequence_len", "vocab_size", "n_layer",
                                                "n_head",       "n_kv_head",  "n_embd"};
    std::string ignored;
    for (const auto& [key, _] : j.items())
        if (!known.count(key)) ignored += (ignored.empty() ? "" : ", ") + key;
    if (!ignored.empty()) m.notes.push_back("keys not part of the count, ignored: " + ignored);
    const int64_t context = r.positive_int("sequence_len", 1024);
    const int64_t vocab = r.positive_int("vocab_size", 50304);
    const int64_t layers = r.layers("n_layer", r.positive_int("n_layer", 12));
    const int64_t heads = r.positive_int("n_head", 6);
    // GPTConfig's own default is 6 (its default head count); nanochat's training scripts always
    // set n_kv_head = n_head, so a config without it means full multi-head attention.
    const int64_t kv = r.positive_int("n_kv_head", heads);
    const int64_t d = r.positive_int("n_embd", 768);
    if (d % heads != 0)
        r.fail("n_embd", "must be a multiple of n_head (" + fmt(heads) + "), got " + fmt(d));
    if (kv > heads || heads % kv != 0)
        r.fail("n_kv_head", "must divide n_head (" + fmt(heads) + "), got " + fmt(kv));
    set_embeddings(m, vocab, d, false);
    FfnShape mlp{mul(4, d), false, false};
    for (int64_t i = 0; i < layers; ++i) {
        BlockCount b = new_block("decoder");
        add_norms(b, 2, d, NormKind::Functional);
        add_attention(b, d, heads, kv, d / heads, {}, AttentionOp::Causal);
        add_dense_ffn(b, d, mlp);
        m.blocks.push_back(std::move(b));
    }
    m.context = context;
    m.context_origin = "sequence_len";
    m.details.push_back("RMSNorm without parameters, " + ffn_text(mlp, "ReLU^2") +
                        ", no attention biases, rotary positions, LM head untied");
    return m;
}

const std::vector<std::string>& hf_model_types() {
    static const std::vector<std::string> types = {
        "llama", "mistral",  "mixtral", "qwen2_moe",
        "olmoe", "deepseek", "gpt2",    "switch_transformers"};
    return types;
}

enum class Format { Native, HuggingFace, Nanochat };

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

// ------------------------------------------------------------------------------------------
// Derived quantities

// Keys a query attends to in a causal sequence of T tokens with window W (0: none).
double causal_keys_mean(int64_t T, int64_t W) {
    if (W <= 0 || T <= W) return (static_cast<double>(T) + 1) / 2;
    double w = static_cast<double>(W);
    return (w * (w + 1) / 2 + static_cast<double>(T - W) * w) / static_cast<double>(T);
}
int64_t causal_keys_last(int64_t T, int64_t W) {
    return W > 0 ? std::min(T, W) : T;
}

// Per-layer cell of the table: the value when every layer has it, "N (k of L layers)" when
// only some layers do, "varies" otherwise.
struct PerLayer {
    std::optional<int64_t> uniform;  // same value in every layer
    std::optional<int64_t> present;  // same non-zero value wherever non-zero
    int64_t layers_present = 0;
};

PerLayer per_layer(const ModelCount& m, ParamGroup g) {
    PerLayer p;
    std::set<int64_t> all, nonzero;
    for (const auto& b : m.blocks) {
        int64_t v = b.params[idx(g)];
        all.insert(v);
        if (v != 0) {
            nonzero.insert(v);
            ++p.layers_present;
        }
    }
    if (all.size() == 1) p.uniform = *all.begin();
    if (nonzero.size() == 1) p.present = *nonzero.begin();
    return p;
}

bool is_global(ParamGroup g) {
    return g == ParamGroup::Embedding || g == ParamGroup::LmHead || g == ParamGroup::Positional;
}

// "0-3", "1,3,5" style list of indices.
std::string index_list(const std::vector<int64_t>& v) {
    std::string out;
    for (size_t i = 0; i < v.size();) {
        size_t k = i;
        while (k + 1 < v.size() && v[k + 1] == v[k] + 1) ++k;
        if (!out.empty()) out.push_back(',');
        out.append(std::to_string(v[i]));
        if (k > i) {
            out.push_back(k > i + 1 ? '-' : ',');  // a run of three or more, or a pair
            out.append(std::to_string(v[k]));
        }
        i = k + 1;
    }
    return out;
}

struct LayerGroup {
    std::string stack, kind;
    std::vector<int64_t> layers;
};

std::vector<LayerGroup> layer_groups(const ModelCount& m) {
    std::vector<LayerGroup> groups;
    std::map<std::string, int64_t> index_in_stack;
    for (const auto& b : m.blocks) {
        int64_t i = index_in_stack[b.stack]++;
        auto it = std::find_if(groups.begin(), groups.end(), [&](const LayerGroup& g) {
            return g.stack == b.stack && g.kind == b.kind;
        });
        if (it == groups.end()) {
            groups.push_back({b.stack, b.kind, {}});
            it = groups.end() - 1;
        }
        it->layers.push_back(i);
    }
    return groups;
}

std::string fmt_si(double v, const char* unit) {
    static const char* prefixes[] = {"", "K", "M", "G", "T", "P", "E"};
    int p = 0;
    while (std::fabs(v) >= 1000 && p < 6) {
        v /= 1000;
        ++p;
    }
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.2f %s%s", v, prefixes[p], unit);
    return buf;
}

std::string fmt_pct(double part, double whole) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f%%", whole > 0 ? 100.0 * part / whole : 0.0);
    return buf;
}

// Thousands separators, and two decimals when not whole.
std::string fmt_num(double v) {
    const int64_t cents = std::llround(v * 100);
    std::string s = with_thousands(cents / 100);
    if (cents % 100 == 0) return s;
    char buf[8];
    std::snprintf(buf, sizeof buf, ".%02d", static_cast<int>(cents % 100));
    return s + buf;
}

int64_t round_i64(double v) {
    return static_cast<int64_t>(std::llround(v));
}

}  // namespace

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

namespace {

// Sums over the layers: per-layer counts fit, but their total may not.
void sum_parameters(ParamReport& r) {
    const ModelCount& m = r.model;
    r.group_totals = m.global;
    int64_t inactive = 0;
    for (const auto& b : m.blocks) {
        for (int g = 0; g < kNumParamGroups; ++g) accumulate(r.group_totals[g], b.params[g]);
        accumulate(inactive, b.inactive_params);
    }
    for (const auto& s : m.stacks)
        accumulate(r.group_totals[idx(ParamGroup::Norms)], s.final_norm_params);
    for (int64_t v : r.group_totals) accumulate(r.total_params, v);
    r.active_params = r.total_params - inactive;
}

// A model beyond kMaxParams is no model anyone can build.
void check_parameter_bound(const ParamReport& r) {
    if (r.total_params > kMaxParams)
        throw Error(r.source + ": the model would have " + with_thousands(r.total_params) +
                    " parameters, more than the limit of " + with_thousands(kMaxParams) +
                    " (2^48)");
}

// Memory beyond kMaxMemoryBytes is refused, and FLOPs beyond 2^62 per token, which also keeps
// every figure the report prints as an integer inside int64_t. A figure that --batch or --seq
// made too large is a usage error.
void check_memory_bounds(const ParamReport& r) {
    const ModelCount& m = r.model;
    const std::string context =
        "the context (" + m.context_origin + " " + with_thousands(m.context) + ")";
    const std::string seq = std::string(r.options.seq_flag) + " " + with_thousands(r.options.seq);
    auto refuse = [&](const std::string& what, bool from_flags) {
        if (from_flags) throw UsageError(r.source + ": " + what);
        throw Error(r.source + ": " + what);
    };
    auto bound_bytes = [&](double bytes, const std::string& what, bool from_flags) {
        if (bytes > kMaxMemoryBytes)
            refuse(what + " would take " + fmt_bytes(bytes) +
                       ", more than the limit of 1 EiB (2^60 bytes)",
                   from_flags);
    };
    const double kv_bytes_per_token = 4.0 * static_cast<double>(r.kv_values_per_token);
    bound_bytes(kv_bytes_per_token * static_cast<double>(r.kv_cached_tokens),
                "the fp32 KV cache at " + context, false);
    if (r.kv_seq_tokens > 0)
        bound_bytes(kv_bytes_per_token * static_cast<double>(r.kv_seq_tokens),
                    "the fp32 KV cache at " + seq, true);
    if (r.has_activations)
        bound_bytes(r.activation_bytes,
                    "the activations of " + with_thousands(r.act_batch) + " x " +
                        with_thousands(r.act_seq) + " tokens (" + r.options.batch_flag + " x " +
                        r.options.seq_flag + ")",
                    true);
    constexpr double kMaxFlopsPerToken = 4611686018427387904.0;  // 2^62
    if (r.training_flops > kMaxFlopsPerToken)
        refuse("a training step would take " + fmt_si(r.training_flops, "FLOP") + " per token at " +
                   (r.options.seq > 0 ? seq : context) + ", more than the limit of 2^62",
               r.options.seq > 0);
}

// Everything the report derives from the counts: stack totals, memory, KV cache, FLOPs.
void derive_figures(ParamReport& r) {
    const ModelCount& m = r.model;
    r.active_definition =
        "every parameter one token's forward pass touches, the embedding and LM head "
        "matrices counted whole: the total minus the routed experts not chosen";
    if (m.encoder_decoder())
        r.active_definition += " (one token through the encoder and one through the decoder)";
    for (const auto& s : m.stacks) {
        ParamReport::StackTotals st{s.name, 0, s.final_norm_params, s.final_norm_params};
        for (const auto& b : m.blocks) {
            if (b.stack != s.name) continue;
            ++st.layers;
            accumulate(st.params, b.total());
            accumulate(st.active, b.total() - b.inactive_params);
        }
        r.stacks.push_back(st);
    }

    // Memory.
    const double n = static_cast<double>(r.total_params);
    r.weight_bytes = {4 * n, 2 * n, n, n / 2};
    r.train_fp32_bytes = 16 * n;
    r.train_mixed_bytes = 16 * n;

    // Context, KV cache, FLOPs.
    const int64_t T = r.options.seq > 0 ? r.options.seq : m.context;
    const int64_t W = m.sliding_window;
    r.flops_context = T;
    r.keys_mean = causal_keys_mean(T, W);
    r.keys_last = static_cast<double>(causal_keys_last(T, W));
    r.kv_cached_tokens = causal_keys_last(m.context, W);
    if (r.options.seq > 0) r.kv_seq_tokens = causal_keys_last(r.options.seq, W);
    r.matmul_params = m.lm_head_matmul;
    int64_t act_elems = mul(m.d_model, 1 + static_cast<int64_t>(m.stacks.size()));
    for (const auto& b : m.blocks) {
        accumulate(r.matmul_params, b.matmul_params);
        accumulate(act_elems, b.activation_elems);
        for (const auto& a : b.attention) {
            const double per_key = 4.0 * a.heads * a.head_dim;  // q.k and p.v, 2 FLOPs each
            switch (a.kind) {
                case AttentionOp::Causal:
                    accumulate(r.kv_values_per_token, mul(2, mul(a.kv_heads, a.head_dim)));
                    r.attention_flops_mean += per_key * r.keys_mean;
                    r.attention_flops_last += per_key * r.keys_last;
                    break;
                case AttentionOp::Bidirectional:
                    r.attention_flops_mean += per_key * static_cast<double>(T);
                    r.attention_flops_last += per_key * static_cast<double>(T);
                    break;
                case AttentionOp::Cross:
                    accumulate(r.kv_cross_values_per_token, mul(2, mul(a.kv_heads, a.head_dim)));
                    r.attention_flops_mean += per_key * static_cast<double>(T);
                    r.attention_flops_last += per_key * static_cast<double>(T);
                    break;
            }
        }
    }
    r.matmul_flops = 2.0 * static_cast<double>(r.matmul_params);
    r.forward_flops = r.matmul_flops + r.attention_flops_mean;
    r.training_flops = 3 * r.forward_flops;
    r.decode_flops = r.matmul_flops + r.attention_flops_last;

    if (r.options.batch > 0 || r.options.seq > 0) {
        r.has_activations = true;
        r.act_batch = r.options.batch > 0 ? r.options.batch : 1;
        r.act_seq = T;
        const double tokens = static_cast<double>(r.act_batch) * static_cast<double>(T);
        r.activation_bytes = tokens * (2.0 * static_cast<double>(act_elems) +
                                       4.0 * static_cast<double>(m.vocab_size));
    }
}

}  // namespace

ParamReport build_param_report(const json& cfg, const std::string& src, const ReportOptions& opts) {
    if (opts.batch < 0) throw UsageError(std::string(opts.batch_flag) + " must be positive");
    if (opts.seq < 0) throw UsageError(std::string(opts.seq_flag) + " must be positive");
    ParamReport r;
    r.source = src;
    r.options = opts;
    r.model = count_model(cfg, src);
    try {
        sum_parameters(r);
        check_parameter_bound(r);
        derive_figures(r);
    } catch (const OverflowError& e) {
        throw Error(src + ": " + e.what());
    }
    check_memory_bounds(r);
    if (r.has_activations)
        if (const std::optional<ModelConfig> engine = engine_config_for(cfg, src))
            r.engine_training = {
                training_memory(*engine, r.act_batch, r.act_seq, Precision::F32),
                training_memory(*engine, r.act_batch, r.act_seq, Precision::BF16)};
    return r;
}

// ------------------------------------------------------------------------------------------
// Text

namespace {

std::string pad_left(const std::string& s, size_t w) {
    return s.size() >= w ? s : std::string(w - s.size(), ' ') + s;
}
std::string pad_right(const std::string& s, size_t w) {
    return s.size() >= w ? s : s + std::string(w - s.size(), ' ');
}

// Rows of cells aligned per `align` ('l' or 'r' per column; default: the first column left,
// the others right); an empty row is a rule.
void print_table(std::ostream& out, const std::vector<std::vector<std::string>>& rows,
                 const std::string& align = "") {
    const std::string indent = "  ";
    std::vector<size_t> w;
    for (const auto& row : rows) {
        if (w.size() < row.size()) w.resize(row.size(), 0);
        for (size_t c = 0; c < row.size(); ++c) w[c] = std::max(w[c], row[c].size());
    }
    size_t width = 0;
    for (size_t c : w) width += c + 2;
    for (const auto& row : rows) {
        if (row.empty()) {
            out << indent << std::string(width - 2, '-') << "\n";
            continue;
        }
        std::string line;
        for (size_t c = 0; c < row.size(); ++c) {
            const bool left = c < align.size() ? align[c] == 'l' : c == 0;
            line += (c ? "  " : "") + (left ? pad_right(row[c], w[c]) : pad_left(row[c], w[c]));
        }
        while (!line.empty() && line.back() == ' ') line.pop_back();
        out << indent << line << "\n";
    }
}

// The per-layer cell: the value when every layer has the same, per stack for an
// encoder-decoder whose stacks differ, "N (k of L layers)" when only some layers have it.
std::string per_layer_cell(const ModelCount& m, ParamGroup g) {
    if (g == ParamGroup::Embedding || g == ParamGroup::LmHead) return "-";
    PerLayer p = per_layer(m, g);
    if (g == ParamGroup::Positional && p.layers_present == 0) return "-";
    if (p.uniform) return with_thousands(*p.uniform);
    if (m.encoder_decoder()) {
        std::string cell;
        for (const auto& s : m.stacks) {
            std::set<int64_t> values;
            for (const auto& b : m.blocks)
                if (b.stack == s.name) values.insert(b.params[idx(g)]);
            if (values.size() != 1) {
                cell.clear();
                break;
            }
            cell += (cell.empty() ? "" : " / ") + s.name.substr(0, 3) + " " +
                    with_thousands(*values.begin());
        }
        if (!cell.empty()) return cell;
    }
    if (p.present)
        return with_thousands(*p.present) + " (" + std::to_string(p.layers_present) + " of " +
               std::to_string(m.blocks.size()) + " layers)";
    return "varies";
}

}  // namespace

std::string format_param_report(const ParamReport& r) {
    const ModelCount& m = r.model;
    std::ostringstream out;
    const std::string what = m.format == "native"     ? "native tiny-mixtral config"
                             : m.format == "nanochat" ? "nanochat GPTConfig"
                                                      : "Hugging Face " + m.model_type + " config";
    out << r.source << " (" << what << ")\n";

    // Architecture.
    for (const auto& s : r.stacks) {
        const BlockCount* first = nullptr;
        for (const auto& b : m.blocks)
            if (b.stack == s.name && !first) first = &b;
        out << "  " << s.layers << " " << s.name << " layers, d_model "
            << with_thousands(m.d_model);
        if (first && !first->attention.empty()) {
            const AttentionOp& a = first->attention.front();
            out << ", " << attention_text(a.heads, a.kv_heads, a.head_dim);
        }
        out << ", vocab " << with_thousands(m.vocab_size) << "\n";
    }
    for (const auto& d : m.details) out << "  " << d << "\n";
    std::string groups;
    for (const auto& g : layer_groups(m))
        groups += (groups.empty() ? "" : "; ") + (m.encoder_decoder() ? g.stack + " " : "") +
                  g.kind + " " + index_list(g.layers);
    out << "  layers: " << groups << "\n\n";

    // Parameters.
    const double total = static_cast<double>(r.total_params);
    std::vector<std::vector<std::string>> rows = {
        {"component", "per layer", "all layers", "share"}};
    for (int g = 0; g < kNumParamGroups; ++g) {
        auto pg = static_cast<ParamGroup>(g);
        std::string label = group_label(pg);
        std::string per = per_layer_cell(m, pg);
        if (pg == ParamGroup::Norms) label += " (+ final)";
        if (pg == ParamGroup::LmHead && m.lm_head_tied) per = "tied to embedding";
        rows.push_back({label, per, with_thousands(r.group_totals[g]),
                        fmt_pct(static_cast<double>(r.group_totals[g]), total)});
    }
    rows.push_back({});
    rows.push_back({"total", "", with_thousands(r.total_params), "100.00%"});
    rows.push_back({"active per token", "", with_thousands(r.active_params),
                    fmt_pct(static_cast<double>(r.active_params), total)});
    print_table(out, rows);
    out << "  active: " << r.active_definition << ".\n";
    if (m.encoder_decoder())
        for (const auto& s : r.stacks)
            out << "  " << s.name << " stack (blocks + final norm): " << with_thousands(s.params)
                << " parameters, " << with_thousands(s.active) << " active per token\n";

    // Memory.
    out << "\nweight memory (1 GiB = 2^30 B):\n";
    print_table(out, {{"fp32", "4 B/param", fmt_bytes(r.weight_bytes[0])},
                      {"bf16", "2 B/param", fmt_bytes(r.weight_bytes[1])},
                      {"int8", "1 B/param", fmt_bytes(r.weight_bytes[2])},
                      {"int4", "0.5 B/param", fmt_bytes(r.weight_bytes[3])}});
    out << "training memory with AdamW, 16 B/param either way:\n";
    rows = {{"fp32: weights 4 + grads 4 + Adam m 4 + Adam v 4", fmt_bytes(r.train_fp32_bytes)},
            {"bf16 mixed: bf16 weights 2 + bf16 grads 2 + fp32 master 4 + m 4 + v 4",
             fmt_bytes(r.train_mixed_bytes)}};
    if (r.has_activations)
        rows.push_back({"+ activations, batch " + with_thousands(r.act_batch) + " x seq " +
                            with_thousands(r.act_seq) + " (estimate, see below)",
                        fmt_bytes(r.activation_bytes)});
    print_table(out, rows);
    if (r.has_activations)
        out << "  activations assume bf16 tensors kept for backward, flash attention (no T x T "
               "scores), no recomputation, no dropout masks, fp32 logits"
            << (m.encoder_decoder() ? ", seq tokens in the encoder and in the decoder" : "")
            << "\n";
    if (r.engine_training) {
        const auto& [f32, b16] = *r.engine_training;
        out << "tmx train allocates, batch " << with_thousands(r.act_batch) << " x seq "
            << with_thousands(r.act_seq)
            << " (checked against the device before a run; a backend's scratch inside an op "
               "comes on top):\n";
        auto row = [](const std::string& label, double a, double b) {
            return std::vector<std::string>{label, fmt_bytes(a), fmt_bytes(b)};
        };
        print_table(out, {{"", "fp32", "bf16"},
                          row("weights 4 + grads 4 + Adam m, v 8 B/param",
                              f32.weights + f32.gradients + f32.optimizer,
                              b16.weights + b16.gradients + b16.optimizer),
                          row("bf16 weight copy, 2 B/param", f32.bf16_weights, b16.bf16_weights),
                          row("activations kept for backward", f32.activations, b16.activations),
                          row("step scratch (classifier, backward, validation)",
                              f32.step_scratch, b16.step_scratch),
                          row("total", f32.total(), b16.total())});
    }

    // KV cache.
    const double kv = static_cast<double>(r.kv_values_per_token);
    out << "\nKV cache = 2 (K, V) x layers x kv_heads x head_dim values per token"
        << (m.encoder_decoder() ? " (decoder self-attention)" : "") << ":\n";
    rows = {{"", "bf16", "fp32"}, {"per token", fmt_bytes(2 * kv), fmt_bytes(4 * kv)}};
    auto kv_row = [&](const std::string& label, int64_t tokens) {
        const double t = static_cast<double>(tokens);
        rows.push_back({label + ": " + with_thousands(tokens) + " tokens", fmt_bytes(2 * kv * t),
                        fmt_bytes(4 * kv * t)});
    };
    kv_row(m.sliding_window > 0 && m.sliding_window < m.context ? "full context, window-capped"
                                                                : "full context",
           r.kv_cached_tokens);
    if (r.kv_seq_tokens > 0 && r.options.seq != m.context) kv_row("at --seq", r.kv_seq_tokens);
    print_table(out, rows);
    out << "  context " << with_thousands(m.context) << " (" << m.context_origin << ")";
    if (m.sliding_window > 0)
        out << ", sliding window " << with_thousands(m.sliding_window)
            << " (the cache holds at most that many tokens)";
    else
        out << ", no sliding window";
    out << "\n";
    if (m.encoder_decoder())
        out << "  cross-attention keeps another " << fmt_bytes(2.0 * r.kv_cross_values_per_token)
            << " (bf16) per encoder token\n";

    // FLOPs.
    out << "\nFLOPs per token (2 per multiply-add), T = " << with_thousands(r.flops_context)
        << (r.options.seq > 0 ? " (--seq)" : " (the config's context)");
    if (m.sliding_window > 0) out << ", window " << with_thousands(m.sliding_window);
    out << ":\n";
    const std::string enc = m.encoder_decoder() ? "; encoder and cross attention see all T" : "";
    print_table(out,
                {{"matmul", fmt_si(r.matmul_flops, "FLOP"),
                  "2 x " + with_thousands(r.matmul_params) +
                      " active weight-matrix params (LM head in, embedding lookup out)"},
                 {"attention", fmt_si(r.attention_flops_mean, "FLOP"),
                  "4 x heads x head_dim per key; " + fmt_num(r.keys_mean) +
                      " keys: the mean over a causal " + with_thousands(r.flops_context) +
                      "-token sequence" + enc},
                 {"forward", fmt_si(r.forward_flops, "FLOP"), "matmul + attention"},
                 {"training step", fmt_si(r.training_flops, "FLOP"), "3 x forward"},
                 {"decode", fmt_si(r.decode_flops, "FLOP"),
                  "forward of the last of " + with_thousands(r.flops_context) + " tokens (" +
                      fmt_num(r.keys_last) + " keys)"}},
                "lrl");

    if (!m.notes.empty()) {
        out << "\nnotes:\n";
        for (const auto& n : m.notes) out << "  - " << n << "\n";
    }
    return out.str();
}

json param_report_json(const ParamReport& r) {
    const ModelCount& m = r.model;
    json j;
    j["source"] = r.source;
    j["format"] = m.format;
    j["model_type"] = m.model_type;
    j["vocab_size"] = m.vocab_size;
    j["d_model"] = m.d_model;
    j["total_params"] = r.total_params;
    j["active_params"] = r.active_params;
    j["active_definition"] = r.active_definition;

    json comps = json::object();
    for (int g = 0; g < kNumParamGroups; ++g) {
        auto pg = static_cast<ParamGroup>(g);
        PerLayer p = per_layer(m, pg);
        json c;
        c["total"] = r.group_totals[g];
        // Parameters outside the blocks (embedding, LM head, learned positions) have no
        // per-layer value.
        const bool in_blocks = !is_global(pg) || p.layers_present > 0;
        c["per_layer"] = p.uniform && in_blocks ? json(*p.uniform) : json(nullptr);
        c["per_layer_where_present"] = p.present ? json(*p.present) : json(nullptr);
        c["layers_present"] = p.layers_present;
        if (pg == ParamGroup::LmHead) c["tied"] = m.lm_head_tied;
        comps[group_key(pg)] = c;
    }
    j["components"] = comps;

    json stacks = json::array();
    for (const auto& s : r.stacks)
        stacks.push_back({{"name", s.name},
                          {"layers", s.layers},
                          {"params", s.params},
                          {"active_params", s.active}});
    j["stacks"] = stacks;
    json groups = json::array();
    for (const auto& g : layer_groups(m))
        groups.push_back({{"stack", g.stack}, {"kind", g.kind}, {"layers", g.layers}});
    j["layer_groups"] = groups;

    json mem;
    mem["weights_bytes"] = {{"fp32", round_i64(r.weight_bytes[0])},
                            {"bf16", round_i64(r.weight_bytes[1])},
                            {"int8", round_i64(r.weight_bytes[2])},
                            {"int4", round_i64(std::ceil(r.weight_bytes[3]))}};
    mem["training_bytes"] = {
        {"adamw_fp32", round_i64(r.train_fp32_bytes)},
        {"adamw_bf16_mixed", round_i64(r.train_mixed_bytes)},
        {"bytes_per_param", 16},
        {"adamw_fp32_breakdown", {{"weights", 4}, {"grads", 4}, {"adam_m", 4}, {"adam_v", 4}}},
        {"adamw_bf16_mixed_breakdown",
         {{"bf16_weights", 2},
          {"bf16_grads", 2},
          {"fp32_master", 4},
          {"adam_m", 4},
          {"adam_v", 4}}}};
    if (r.has_activations)
        mem["activations"] = {
            {"batch", r.act_batch},
            {"seq", r.act_seq},
            {"bytes", round_i64(r.activation_bytes)},
            {"assumes",
             "bf16 tensors kept for backward, flash attention (no T x T scores), no "
             "recomputation, no dropout masks, fp32 logits"}};
    else
        mem["activations"] = nullptr;
    if (r.engine_training) {
        auto bytes = [](const TrainingMemory& t) {
            return json{{"weights", round_i64(t.weights)},
                        {"gradients", round_i64(t.gradients)},
                        {"optimizer", round_i64(t.optimizer)},
                        {"bf16_weights", round_i64(t.bf16_weights)},
                        {"activations", round_i64(t.activations)},
                        {"step_scratch", round_i64(t.step_scratch)},
                        {"total", round_i64(t.total())}};
        };
        mem["engine_training"] = {{"batch", r.act_batch},
                                  {"seq", r.act_seq},
                                  {"fp32", bytes((*r.engine_training)[0])},
                                  {"bf16", bytes((*r.engine_training)[1])}};
    } else {
        mem["engine_training"] = nullptr;
    }
    j["memory"] = mem;

    json kv;
    kv["values_per_token"] = r.kv_values_per_token;
    kv["bytes_per_token"] = {{"bf16", 2 * r.kv_values_per_token},
                             {"fp32", 4 * r.kv_values_per_token}};
    kv["context"] = m.context;
    kv["context_origin"] = m.context_origin;
    kv["sliding_window"] = m.sliding_window;
    kv["cached_tokens"] = r.kv_cached_tokens;
    kv["bytes_at_context"] = {{"bf16", 2 * r.kv_values_per_token * r.kv_cached_tokens},
                              {"fp32", 4 * r.kv_values_per_token * r.kv_cached_tokens}};
    if (r.kv_seq_tokens > 0)
        kv["bytes_at_seq"] = {{"tokens", r.kv_seq_tokens},
                              {"bf16", 2 * r.kv_values_per_token * r.kv_seq_tokens},
                              {"fp32", 4 * r.kv_values_per_token * r.kv_seq_tokens}};
    if (m.encoder_decoder())
        kv["cross_attention_bytes_per_encoder_token"] = {{"bf16", 2 * r.kv_cross_values_per_token},
                                                         {"fp32", 4 * r.kv_cross_values_per_token}};
    kv["counts"] = m.encoder_decoder() ? "decoder self-attention" : "all layers";
    j["kv_cache"] = kv;

    json fl;
    fl["context"] = r.flops_context;
    fl["sliding_window"] = m.sliding_window;
    fl["keys_mean"] = r.keys_mean;
    fl["keys_last"] = r.keys_last;
    fl["matmul_params"] = r.matmul_params;
    fl["matmul_per_token"] = round_i64(r.matmul_flops);
    fl["attention_per_token_mean"] = round_i64(r.attention_flops_mean);
    fl["attention_per_token_last"] = round_i64(r.attention_flops_last);
    fl["forward_per_token"] = round_i64(r.forward_flops);
    fl["training_per_token"] = round_i64(r.training_flops);
    fl["decode_per_token"] = round_i64(r.decode_flops);
    fl["convention"] =
        "2 FLOPs per multiply-add; matmul term = 2 x active weight-matrix params (LM head "
        "included, embedding lookup not); attention = 4 x heads x head_dim per key; forward "
        "and training average the keys over a causal T-token sequence (window-capped), decode "
        "is the last token of T; training = 3 x forward";
    j["flops"] = fl;

    j["details"] = m.details;
    j["notes"] = m.notes;
    return j;
}

// ------------------------------------------------------------------------------------------

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

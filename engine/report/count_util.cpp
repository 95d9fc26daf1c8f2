// The shared helpers of the family counters declared in count_util.h: the building blocks of a
// transformer block.
#include "engine/report/count_util.h"

#include <nlohmann/json.hpp>
#include <string>

namespace tmx::report_detail {

// ------------------------------------------------------------------------------------------
// Building blocks shared by every family

void add_linear(BlockCount& b, ParamGroup g, int64_t in, int64_t out, bool bias) {
    accumulate(b.params[idx(g)], add(mul(in, out), bias ? out : 0));
    accumulate(b.matmul_params, mul(in, out));
}

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

void add_norms(BlockCount& b, int64_t count, int64_t width, NormKind kind) {
    accumulate(b.params[idx(ParamGroup::Norms)],
               mul(mul(count, width), static_cast<int64_t>(kind)));
    accumulate(b.activation_elems, mul(count, width));  // each norm keeps its input
}

void add_dense_ffn(BlockCount& b, int64_t d, const FfnShape& f) {
    accumulate(b.params[idx(ParamGroup::DenseFfn)], f.params(d));
    accumulate(b.matmul_params, f.matrices(d));
    accumulate(b.activation_elems, add(d, f.activations()));
    b.kind = "dense";
}

void add_moe(BlockCount& b, int64_t d, int64_t n_experts, int64_t top_k, const FfnShape& expert,
             bool router_bias) {
    add_linear(b, ParamGroup::Router, d, n_experts, router_bias);
    accumulate(b.params[idx(ParamGroup::RoutedExperts)], mul(n_experts, expert.params(d)));
    accumulate(b.inactive_params, mul(n_experts - top_k, expert.params(d)));
    accumulate(b.matmul_params, mul(top_k, expert.matrices(d)));
    // The FFN input, the router logits, and per chosen expert its gathered input and hidden.
    accumulate(b.activation_elems,
               add(add(d, n_experts), mul(top_k, add(d, expert.activations()))));
    b.kind = "MoE";
}

void add_shared_ffn(BlockCount& b, int64_t d, const FfnShape& f) {
    accumulate(b.params[idx(ParamGroup::SharedExperts)], f.params(d));
    accumulate(b.matmul_params, f.matrices(d));
    accumulate(b.activation_elems, f.activations());
}

CoreDims read_core_dims(const FieldReader& r, std::initializer_list<const char*> hidden_keys,
                        std::initializer_list<const char*> layer_keys,
                        std::initializer_list<const char*> head_keys) {
    CoreDims c;
    c.vocab = r.required({"vocab_size"});
    c.d = r.required(hidden_keys);
    c.layers = r.required_layers(layer_keys);
    c.heads = r.required(head_keys);
    return c;
}

DecoderDims read_decoder_dims(const FieldReader& r, std::optional<int64_t> kv_default) {
    const CoreDims c = read_core_dims(r);
    DecoderDims dims{c.vocab, c.d, c.layers, c.heads, 0, 0};
    dims.kv = r.kv_heads(c.heads, kv_default);
    dims.hd = r.head_dim(c.d, c.heads, "hidden_size", "num_attention_heads");
    return dims;
}

BlockCount new_block(const std::string& stack) {
    BlockCount b;
    b.stack = stack;
    return b;
}

BlockCount llama_style_block(int64_t d, int64_t heads, int64_t kv_heads, int64_t head_dim,
                             AttnBias bias) {
    BlockCount b = new_block("decoder");
    add_norms(b, 2, d, NormKind::Weight);
    add_attention(b, d, heads, kv_heads, head_dim, bias, AttentionOp::Causal);
    return b;
}

void set_embeddings(ModelCount& m, int64_t vocab, int64_t d, bool tied) {
    m.vocab_size = vocab;
    m.d_model = d;
    m.global[idx(ParamGroup::Embedding)] = mul(vocab, d);
    m.lm_head_tied = tied;
    m.global[idx(ParamGroup::LmHead)] = tied ? 0 : mul(vocab, d);
    m.lm_head_matmul = mul(vocab, d);
}

std::string ffn_text(const FfnShape& f, const std::string& act) {
    return (f.gated ? "SwiGLU" : act) + " FFN of width " + fmt(f.width) +
           (f.bias ? " (with biases)" : " (no biases)");
}

ModelCount make_model(const std::string& format, const std::string& model_type) {
    ModelCount m;
    m.format = format;
    m.model_type = model_type;
    m.stacks = {{"decoder", 0}};
    return m;
}

}  // namespace tmx::report_detail

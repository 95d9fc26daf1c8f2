// The counter of DeepSeekMoE v1 configs (remote-code model_type "deepseek").
#include <optional>
#include <string>
#include <utility>

#include "engine/report/count_util.h"

namespace tmx::report_detail {

// DeepSeekMoE v1 (remote-code model_type "deepseek"): the first first_k_dense_replace layers
// dense, then MoE every moe_layer_freq layers: n_routed_experts fine-grained experts plus one
// shared MLP of width n_shared_experts * moe_intermediate_size.
ModelCount count_deepseek(const json& j, const std::string& src) {
    FieldReader r(j, src, "deepseek");
    ModelCount m = make_model("huggingface", "deepseek");
    const auto [vocab, d, layers, heads, kv, hd] = read_decoder_dims(r, 32);
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

}  // namespace tmx::report_detail

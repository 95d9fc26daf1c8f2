// The counter of Hugging Face olmoe configs (OLMoE).
#include <optional>
#include <string>
#include <utility>

#include "engine/report/count_util.h"

namespace tmx::report_detail {

// OLMoE: every layer sparse (no shared expert); QK-norm: RMSNorm over the whole q projection
// (H*hd) and the whole k projection (Hkv*hd).
ModelCount count_olmoe(const json& j, const std::string& src) {
    FieldReader r(j, src, "olmoe");
    ModelCount m = make_model("huggingface", "olmoe");
    const auto [vocab, d, layers, heads, kv, hd] = read_decoder_dims(r, std::nullopt);
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

}  // namespace tmx::report_detail

// The counter of Hugging Face llama, mistral and mixtral configs (count_llama_family).
#include <optional>
#include <string>
#include <utility>

#include "engine/report/count_util.h"

namespace tmx::report_detail {

// llama, mistral, mixtral: the same pre-norm RMSNorm / SwiGLU decoder; they differ in defaults,
// in the sliding window, and mixtral's sparse FFN.
ModelCount count_llama_family(const json& j, const std::string& src, const std::string& type) {
    FieldReader r(j, src, type);
    const bool is_llama = type == "llama", is_mixtral = type == "mixtral";
    ModelCount m = make_model("huggingface", type);
    const auto [vocab, d, layers, heads, kv, hd] =
        read_decoder_dims(r, is_llama ? std::nullopt : std::optional<int64_t>(8));
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

}  // namespace tmx::report_detail

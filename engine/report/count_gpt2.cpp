// The counter of Hugging Face gpt2 configs (GPT-2).
#include <optional>
#include <string>
#include <utility>

#include "engine/report/count_util.h"

namespace tmx::report_detail {

// GPT-2: learned positions, fused c_attn with bias, LayerNorm with bias, GELU MLP with biases,
// LM head tied to the token embedding.
ModelCount count_gpt2(const json& j, const std::string& src) {
    FieldReader r(j, src, "gpt2");
    ModelCount m = make_model("huggingface", "gpt2");
    const auto [vocab, d, layers, heads] =
        read_core_dims(r, {"n_embd", "hidden_size"}, {"n_layer", "num_hidden_layers"},
                       {"n_head", "num_attention_heads"});
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

}  // namespace tmx::report_detail

// The counter of native tiny-mixtral configs (docs/design.md#10-parameters-and-initialisation):
// count_native, public in param_report.h.
#include <string>
#include <utility>

#include "engine/model/config.h"
#include "engine/report/count_util.h"
#include "engine/report/param_report.h"

namespace tmx {

using namespace report_detail;

// Native tiny-mixtral (docs/design.md#10-parameters-and-initialisation).
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

}  // namespace tmx

// The counter of Hugging Face qwen2_moe configs (Qwen1.5-MoE).
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "engine/report/count_util.h"

namespace tmx::report_detail {

// Qwen2-MoE (Qwen1.5-MoE): q/k/v biases, sparse layers every decoder_sparse_step layers except
// mlp_only_layers, each with 60-style routed experts plus one shared expert behind a sigmoid
// gate (Linear d -> 1).
ModelCount count_qwen2_moe(const json& j, const std::string& src) {
    FieldReader r(j, src, "qwen2_moe");
    ModelCount m = make_model("huggingface", "qwen2_moe");
    const auto [vocab, d, layers, heads, kv, hd] = read_decoder_dims(r, 16);
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

}  // namespace tmx::report_detail

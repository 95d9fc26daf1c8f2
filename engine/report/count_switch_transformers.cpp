// The counter of Hugging Face switch_transformers configs (Switch Transformers, T5
// encoder-decoder): count_switch.
#include <optional>
#include <string>
#include <utility>

#include "engine/report/count_util.h"

namespace tmx::report_detail {

// Switch Transformers (T5 encoder-decoder): no biases, T5 norms weight-only, relative attention
// bias in the first block of each stack, a sparse FFN (router without bias + experts) every
// sparse_step layers, shared embedding, LM head tied unless tie_word_embeddings is false.
ModelCount count_switch(const json& j, const std::string& src) {
    FieldReader r(j, src, "switch_transformers");
    ModelCount m = make_model("huggingface", "switch_transformers");
    const CoreDims dims =
        read_core_dims(r, {"d_model", "hidden_size"}, {"num_layers", "num_hidden_layers"},
                       {"num_heads", "num_attention_heads"});
    const int64_t vocab = dims.vocab, d = dims.d, enc_layers = dims.layers, heads = dims.heads;
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

}  // namespace tmx::report_detail

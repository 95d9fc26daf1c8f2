// The counter of nanochat GPTConfigs written as JSON.
#include <set>
#include <string>
#include <utility>

#include "engine/report/count_util.h"

namespace tmx::report_detail {

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

}  // namespace tmx::report_detail

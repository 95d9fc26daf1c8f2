// The figures of the parameter report (build_param_report): sums over the layers, the bounds,
// memory, KV cache and FLOPs. The counts come from param_counts.cpp, the text and JSON from
// param_report_render.cpp.
#include "engine/report/param_report.h"

#include <algorithm>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>

#include "engine/core/checked_math.h"
#include "engine/core/errors.h"
#include "engine/core/format.h"
#include "engine/model/config.h"
#include "engine/model/training_memory.h"
#include "engine/report/report_util.h"

namespace tmx {

using namespace report_detail;

namespace {

using nlohmann::json;

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
// every figure the report prints as an integer inside int64_t. A figure that the batch or seq
// option made too large is a usage error.
void check_memory_bounds(const ParamReport& r) {
    const ModelCount& m = r.model;
    const std::string context =
        "the context (" + m.context_origin + " " + with_thousands(m.context) + ")";
    const OptionText seq = opt("seq") + " " + with_thousands(r.options.seq);
    auto refuse = [&](const OptionText& what, bool from_flags) {
        if (from_flags) throw UsageError(r.source + ": " + what);
        throw Error(r.source + ": " + what);
    };
    auto bound_bytes = [&](double bytes, const OptionText& what, bool from_flags) {
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
                        with_thousands(r.act_seq) + " tokens (" + opt("batch") + " x " +
                        opt("seq") + ")",
                    true);
    constexpr double kMaxFlopsPerToken = 4611686018427387904.0;  // 2^62
    if (r.training_flops > kMaxFlopsPerToken)
        refuse("a training step would take " + fmt_si(r.training_flops, "FLOP") + " per token at " +
                   (r.options.seq > 0 ? seq : OptionText(context)) +
                   ", more than the limit of 2^62",
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
    const double f32_kept =
        static_cast<double>(r.group_totals[static_cast<int>(ParamGroup::Norms)] +
                            r.group_totals[static_cast<int>(ParamGroup::Router)]);
    r.weight_bytes = {4 * n, 2 * n, 4 * f32_kept + (n - f32_kept) * 34.0 / 32.0, n, n / 2};
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
    if (opts.batch < 0) throw UsageError(opt("batch") + " must be positive");
    if (opts.seq < 0) throw UsageError(opt("seq") + " must be positive");
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
            r.engine_training = {training_memory(*engine, r.act_batch, r.act_seq, Precision::F32),
                                 training_memory(*engine, r.act_batch, r.act_seq, Precision::BF16)};
    return r;
}

}  // namespace tmx

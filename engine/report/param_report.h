// The parameter report behind `tmx params`: parameter counts by component, active parameters
// per token, weight / training / activation memory, KV-cache size and FLOPs per token, computed
// analytically from a model config.
//
// A config is one of
//   * a native tiny-mixtral config (docs/design.md#2-model-config; no "model_type" key),
//   * a Hugging Face config.json ("model_type": llama, mistral, mixtral, qwen2_moe, olmoe,
//     deepseek, gpt2, switch_transformers), counted by that architecture's own module layout;
//     the size keys (vocab, width, layers, heads) are required, every other missing key takes
//     the Hugging Face class default,
//   * a nanochat GPTConfig written as JSON (keys sequence_len, vocab_size, n_layer, n_head,
//     n_kv_head, n_embd).
//
// Conventions (also printed with the report):
//   * active parameters: every parameter one token's forward pass touches, the embedding and LM
//     head matrices counted whole (Mixtral-8x7B: 12.9B active): the total minus the routed
//     experts the token is not sent to;
//   * FLOPs: 2 per multiply-add; the matmul term uses the active weight-matrix parameters (the
//     embedding lookup is not a matmul, the LM head is, tied or not); training = 3x forward.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/format.h"
#include "engine/core/option_text.h"
#include "engine/model/config.h"
#include "engine/model/training_memory.h"

namespace tmx {

// The report's parameter groups, in table order.
enum class ParamGroup {
    Embedding,
    Positional,
    Attention,
    Norms,
    Router,
    RoutedExperts,
    SharedExperts,
    DenseFfn,
    LmHead,
};
inline constexpr int kNumParamGroups = 9;
using GroupCounts = std::array<int64_t, kNumParamGroups>;

const char* group_key(ParamGroup g);    // JSON key, e.g. "routed_experts"
const char* group_label(ParamGroup g);  // table label, e.g. "experts (routed)"

// One attention operation inside a block: what its score/value FLOPs and KV cache depend on.
struct AttentionOp {
    enum Kind { Causal, Bidirectional, Cross };
    Kind kind = Causal;
    int64_t heads = 0;
    int64_t kv_heads = 0;
    int64_t head_dim = 0;
};

// One transformer block (layer), as one token sees it.
struct BlockCount {
    std::string stack;  // "decoder" or "encoder"
    std::string kind;   // "dense" or "MoE"
    GroupCounts params{};
    int64_t inactive_params = 0;   // routed-expert parameters a token is not sent to
    int64_t matmul_params = 0;     // weight-matrix parameters a token multiplies by
    int64_t activation_elems = 0;  // values kept for the backward pass, per token
    std::vector<AttentionOp> attention;
    int64_t total() const;
};

// A model reduced to what the report needs, whatever config format it came from.
struct ModelCount {
    std::string format;      // "native", "huggingface" or "nanochat"
    std::string model_type;  // "tiny-mixtral", "nanochat", or the Hugging Face model_type
    int64_t vocab_size = 0;
    int64_t d_model = 0;
    GroupCounts global{};  // parameters outside the blocks: embedding, learned positions, LM head
    bool lm_head_tied = false;
    int64_t lm_head_matmul = 0;  // V*d: the LM head is a matmul even when tied
    struct Stack {
        std::string name;
        int64_t final_norm_params = 0;
    };
    std::vector<Stack> stacks;  // {"decoder"}, or {"encoder", "decoder"}
    std::vector<BlockCount> blocks;
    int64_t context = 0;               // the config's context length (positions)
    std::string context_origin;        // where `context` came from, e.g. "max_position_embeddings"
    int64_t sliding_window = 0;        // 0: none
    std::vector<std::string> details;  // lines describing the architecture
    std::vector<std::string> notes;    // caveats of the count
    bool encoder_decoder() const { return stacks.size() > 1; }
};

struct ReportOptions {
    int64_t batch = 0;  // for the activation estimate; 0: not given
    int64_t seq = 0;    // tokens per sequence; 0: the config's context
    // How the report's text spells the options it names (batch, seq): tmx params passes its
    // flags; empty: by field. (Errors name them by field; the front end spells them.)
    OptionSpelling spelling;
};

struct ParamReport {
    std::string source;
    ModelCount model;
    ReportOptions options;

    GroupCounts group_totals{};
    int64_t total_params = 0;
    int64_t active_params = 0;
    std::string active_definition;
    struct StackTotals {
        std::string name;
        int64_t layers = 0;
        int64_t params = 0;  // blocks + final norm (embedding and head excluded)
        int64_t active = 0;
    };
    std::vector<StackTotals> stacks;

    // Memory, bytes.
    // fp32, bf16 (and f16), q8_0 as this engine stores it (34 bytes per block of 32; the norms
    // and the router in fp32), int8, int4.
    std::array<double, 5> weight_bytes{};
    double train_fp32_bytes = 0;   // AdamW, all fp32: 16 B/param
    double train_mixed_bytes = 0;  // bf16 mixed precision with fp32 master: 16 B/param
    bool has_activations = false;
    int64_t act_batch = 0;
    int64_t act_seq = 0;
    double activation_bytes = 0;
    // With activations, for a model the engine runs (engine_config_for): what `tmx train`
    // allocates at act_batch x act_seq (training_memory()), in fp32 and in bf16.
    std::optional<std::array<TrainingMemory, 2>> engine_training;

    // KV cache: values (K and V, all layers) per token; bytes = values * bytes per value.
    int64_t kv_values_per_token = 0;
    int64_t kv_cached_tokens = 0;           // full context, capped by the sliding window
    int64_t kv_cross_values_per_token = 0;  // encoder-decoder: per encoder token
    int64_t kv_seq_tokens = 0;              // at options.seq, capped by the window (0: not given)

    // FLOPs per token.
    int64_t flops_context = 0;  // T
    double keys_mean = 0;       // keys a causal query sees, mean over a T-token sequence
    double keys_last = 0;       // keys the last of T tokens sees
    int64_t matmul_params = 0;
    double matmul_flops = 0;
    double attention_flops_mean = 0;
    double attention_flops_last = 0;
    double forward_flops = 0;   // mean over a T-token sequence (training / prefill)
    double training_flops = 0;  // 3x forward
    double decode_flops = 0;    // forward of the last token of a T-token context
};

// Builds the report of a config. `source` names the file in error messages; throws tmx::Error
// naming the file and field for a malformed config.
ParamReport build_param_report(const nlohmann::json& cfg, const std::string& source,
                               const ReportOptions& opts = {});

// The counts alone, for a config in any of the supported formats.
ModelCount count_model(const nlohmann::json& cfg, const std::string& source);
// The counts of a native config.
ModelCount count_native(const ModelConfig& c);

std::string format_param_report(const ParamReport& r);
nlohmann::json param_report_json(const ParamReport& r);

// The engine config that builds this model: the native config itself, or a Hugging Face llama /
// mistral / mixtral config whose architecture the engine runs (SwiGLU, RMSNorm, RoPE without
// scaling). Empty otherwise, with the reason in *why_not when given.
std::optional<ModelConfig> engine_config_for(const nlohmann::json& cfg, const std::string& source,
                                             std::string* why_not = nullptr);

}  // namespace tmx

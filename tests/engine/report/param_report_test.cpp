// The parameter report (engine/report/param_report.h) and `tmx params`: exact totals of published
// models, each recomputed here by its own formula, published approximate figures, memory, KV
// cache, FLOPs, JSON shape, errors, and the check against the engine's instantiated parameters.
#include "engine/report/param_report.h"

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "engine/core/errors.h"
#include "engine/core/file_io.h"
#include "engine/model/model.h"
#include "tests/test_util.h"

namespace tmx {
namespace {

using nlohmann::json;

std::string fixture(const std::string& name) {
    return test::source_dir() + "/tests/fixtures/hf_configs/" + name;
}

ParamReport report_of(const std::string& name, const ReportOptions& opts = {}) {
    return build_param_report(read_json_file(fixture(name)), fixture(name), opts);
}

int64_t group(const ParamReport& r, ParamGroup g) {
    return r.group_totals[static_cast<int>(g)];
}

// The message build_param_report throws for `j`, or "" when it succeeds.
std::string report_error(const json& j, const std::string& src = "cfg.json") {
    try {
        build_param_report(j, src);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

// |value - published| / published, for published figures rounded to a few digits.
double rel_diff(int64_t value, double published) {
    return std::fabs(static_cast<double>(value) - published) / published;
}

// Sum of the engine's instantiated parameters for a config.
int64_t engine_params(const ModelConfig& c) {
    int64_t n = 0;
    for (const ParamSpec& s : model_param_specs(c)) n += s.numel();
    return n;
}

// A SwiGLU FFN without biases.
constexpr int64_t swiglu(int64_t d, int64_t width) {
    return 3 * d * width;
}

// ---------------------------------------------------------------------------------- native

TEST(ParamReport, NativeDefaultsGiveTheDesignTotal) {
    ParamReport r = build_param_report(json::object(), "defaults");
    const int64_t V = 32000, d = 512, L = 8, E = 8, k = 2, dff = 2048;
    const int64_t expert = 2 * d * dff + dff + d;  // w1, w2 with biases
    const int64_t layer = (d * 512 + 2 * d * 128 + 512 * d) + 2 * (2 * d) + E * d + E * expert;
    EXPECT_EQ(r.total_params, 2 * V * d + L * layer + 2 * d);
    EXPECT_EQ(r.total_params, 172'442'624);
    EXPECT_EQ(r.active_params, 172'442'624 - L * (E - k) * expert);
    EXPECT_EQ(r.active_params, 71'656'448);
    EXPECT_EQ(group(r, ParamGroup::Router), L * E * d);
    EXPECT_EQ(group(r, ParamGroup::Norms), L * 2 * 2 * d + 2 * d);
    EXPECT_EQ(group(r, ParamGroup::RoutedExperts), L * E * expert);
    EXPECT_EQ(group(r, ParamGroup::Attention), L * 655'360);
    // The seed table's 172,400,640 leaves out the routers and the final norm and counts one
    // norm per layer instead of two.
    EXPECT_EQ(r.total_params - L * E * d - 2 * d - L * 2 * d, 172'400'640);
}

TEST(ParamReport, SeedMiniGptIsANativeConfig) {
    ParamReport r = report_of("mini-gpt.json");
    const int64_t V = 512, d = 64, dff = 256;
    const int64_t block = 4 * d * d + 2 * d * dff + 2 * d;  // attention, FFN, two RMSNorms
    EXPECT_EQ(block, 49'280);
    EXPECT_EQ(r.total_params, V * d + 2 * block + d);  // tied head, final RMSNorm
    EXPECT_EQ(r.total_params, 131'392);
    EXPECT_EQ(r.active_params, r.total_params);
    EXPECT_EQ(group(r, ParamGroup::LmHead), 0);
    EXPECT_TRUE(r.model.lm_head_tied);
}

// ------------------------------------------------------------------------------ dense HF

TEST(ParamReport, Gpt2SmallCountsLearnedPositionsAndBiases) {
    ParamReport r = report_of("gpt2.json");
    const int64_t V = 50257, P = 1024, d = 768, L = 12;
    const int64_t block =
        2 * (2 * d) + (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d);
    EXPECT_EQ(r.total_params, V * d + P * d + L * block + 2 * d);
    EXPECT_EQ(r.total_params, 124'439'808);
    EXPECT_EQ(r.active_params, r.total_params);
    EXPECT_EQ(group(r, ParamGroup::Positional), P * d);
    EXPECT_EQ(group(r, ParamGroup::LmHead), 0);  // tied
    // The tied head is still a matmul.
    EXPECT_EQ(r.matmul_params, L * 12 * d * d + V * d);
}

TEST(ParamReport, Llama7b) {
    ParamReport r = report_of("llama-7b.json");
    const int64_t V = 32000, d = 4096, L = 32, ff = 11008;
    EXPECT_EQ(r.total_params, 2 * V * d + L * (4 * d * d + swiglu(d, ff) + 2 * d) + d);
    EXPECT_EQ(r.total_params, 6'738'415'616);
    EXPECT_EQ(r.model.context, 2048);
    EXPECT_EQ(r.kv_values_per_token, 2 * L * 32 * 128);
}

TEST(ParamReport, Mistral7bCapsTheCacheAtItsSlidingWindow) {
    ParamReport r = report_of("mistral-7b.json");
    const int64_t V = 32000, d = 4096, L = 32, kv = 8 * 128;
    EXPECT_EQ(r.total_params,
              2 * V * d + L * (2 * d * d + 2 * d * kv + swiglu(d, 14336) + 2 * d) + d);
    EXPECT_EQ(r.total_params, 7'241'732'096);
    EXPECT_EQ(r.model.sliding_window, 4096);
    EXPECT_EQ(r.kv_cached_tokens, 4096);                        // context 32,768, window 4,096
    EXPECT_EQ(2 * r.kv_values_per_token, 2 * L * 8 * 128 * 2);  // bf16 bytes per token
    EXPECT_EQ(r.keys_last, 4096);
}

TEST(ParamReport, NanochatD20) {
    ParamReport r = report_of("nanochat-d20.json");
    const int64_t V = 65536, d = 1280, L = 20;
    EXPECT_EQ(r.total_params, 2 * V * d + L * (4 * d * d + 8 * d * d));
    EXPECT_EQ(r.total_params, 560'988'160);
    EXPECT_EQ(group(r, ParamGroup::Norms), 0);  // functional RMSNorm
    EXPECT_EQ(r.model.context, 2048);
}

// -------------------------------------------------------------------------------- MoE HF

TEST(ParamReport, Mixtral8x7bTotalAndActive) {
    ParamReport r = report_of("mixtral-8x7b.json");
    const int64_t V = 32000, d = 4096, L = 32, E = 8, k = 2, kv = 8 * 128;
    const int64_t expert = swiglu(d, 14336);
    const int64_t layer = 2 * d * d + 2 * d * kv + 2 * d + E * d + E * expert;
    EXPECT_EQ(r.total_params, 2 * V * d + L * layer + d);
    EXPECT_EQ(r.total_params, 46'702'792'704);
    EXPECT_EQ(r.active_params, r.total_params - L * (E - k) * expert);
    EXPECT_EQ(r.active_params, 12'879'925'248);  // Mixtral's "12.9B active"
    EXPECT_EQ(r.model.sliding_window, 0);
    EXPECT_EQ(r.kv_cached_tokens, 32768);
    EXPECT_EQ(2 * r.kv_values_per_token, 131'072);  // bf16 bytes per token
}

TEST(ParamReport, Qwen15MoeSharedExpertAndQkvBiases) {
    ParamReport r = report_of("qwen1.5-moe-a2.7b.json");
    const int64_t V = 151936, d = 2048, L = 24, E = 60, k = 4;
    const int64_t attention = 4 * d * d + 3 * d;  // q, k, v biases; o without
    const int64_t expert = swiglu(d, 1408);
    const int64_t shared = swiglu(d, 5632) + d;  // shared expert + shared_expert_gate (d -> 1)
    const int64_t layer = attention + 2 * d + E * d + E * expert + shared;
    EXPECT_EQ(r.total_params, 2 * V * d + L * layer + d);
    EXPECT_EQ(r.total_params, 14'315'784'192);
    EXPECT_EQ(r.active_params, r.total_params - L * (E - k) * expert);
    EXPECT_EQ(r.active_params, 2'689'173'504);
    EXPECT_EQ(group(r, ParamGroup::SharedExperts), L * shared);
    // Published: 14.3B total, 2.7B activated (Qwen1.5-MoE-A2.7B model card), to 1%.
    EXPECT_LT(rel_diff(r.total_params, 14.3e9), 0.01);
    EXPECT_LT(rel_diff(r.active_params, 2.7e9), 0.01);
}

TEST(ParamReport, Qwen2MoeSparseStepAndMlpOnlyLayers) {
    json j = {{"model_type", "qwen2_moe"},
              {"vocab_size", 100},
              {"hidden_size", 16},
              {"num_hidden_layers", 4},
              {"num_attention_heads", 4},
              {"num_key_value_heads", 4},
              {"intermediate_size", 40},
              {"moe_intermediate_size", 8},
              {"shared_expert_intermediate_size", 24},
              {"num_experts", 6},
              {"num_experts_per_tok", 2},
              {"decoder_sparse_step", 2},
              {"mlp_only_layers", {3}}};
    ParamReport r = build_param_report(j, "q.json");
    // Layer i is sparse iff (i + 1) % 2 == 0 and i not in mlp_only_layers: only layer 1.
    ASSERT_EQ(r.model.blocks.size(), 4u);
    EXPECT_EQ(r.model.blocks[0].kind, "dense");
    EXPECT_EQ(r.model.blocks[1].kind, "MoE");
    EXPECT_EQ(r.model.blocks[2].kind, "dense");
    EXPECT_EQ(r.model.blocks[3].kind, "dense");
    const int64_t d = 16;
    EXPECT_EQ(group(r, ParamGroup::DenseFfn), 3 * swiglu(d, 40));
    EXPECT_EQ(group(r, ParamGroup::RoutedExperts), 6 * swiglu(d, 8));
    EXPECT_EQ(group(r, ParamGroup::SharedExperts), swiglu(d, 24) + d);
    EXPECT_EQ(r.total_params - r.active_params, 4 * swiglu(d, 8));
}

TEST(ParamReport, OlmoeCountsQkNorm) {
    ParamReport r = report_of("olmoe-1b-7b.json");
    const int64_t V = 50304, d = 2048, L = 16, E = 64, k = 8;
    const int64_t expert = swiglu(d, 1024);
    const int64_t qk_norm = 16 * 128 + 16 * 128;  // q_norm over H*hd, k_norm over Hkv*hd
    const int64_t layer = 4 * d * d + qk_norm + 2 * d + E * d + E * expert;
    EXPECT_EQ(r.total_params, 2 * V * d + L * layer + d);
    EXPECT_EQ(r.total_params, 6'919'161'856);
    EXPECT_EQ(r.active_params, r.total_params - L * (E - k) * expert);
    EXPECT_EQ(r.active_params, 1'282'017'280);
    // Published: 6.92B total (Hugging Face's count), to 0.5%; ~1.3B active (OLMoE paper), to 2%.
    EXPECT_LT(rel_diff(r.total_params, 6.92e9), 0.005);
    EXPECT_LT(rel_diff(r.active_params, 1.3e9), 0.02);
}

TEST(ParamReport, DeepseekMoeDenseFirstLayerAndSharedExperts) {
    ParamReport r = report_of("deepseek-moe-16b.json");
    const int64_t V = 102400, d = 2048, L = 28, E = 64, k = 6;
    const int64_t expert = swiglu(d, 1408);
    const int64_t base = 4 * d * d + 2 * d;
    const int64_t dense_layer = base + swiglu(d, 10944);
    const int64_t moe_layer = base + E * d + E * expert + swiglu(d, 2 * 1408);
    EXPECT_EQ(r.total_params, 2 * V * d + dense_layer + (L - 1) * moe_layer + d);
    EXPECT_EQ(r.total_params, 16'375'728'128);
    EXPECT_EQ(r.active_params, r.total_params - (L - 1) * (E - k) * expert);
    EXPECT_EQ(r.active_params, 2'828'650'496);
    EXPECT_EQ(r.model.blocks[0].kind, "dense");
    EXPECT_EQ(r.model.blocks[1].kind, "MoE");
    // Published: 16.4B total, 2.8B activated (DeepSeekMoE paper / model card), to 2%.
    EXPECT_LT(rel_diff(r.total_params, 16.4e9), 0.02);
    EXPECT_LT(rel_diff(r.active_params, 2.8e9), 0.02);
}

TEST(ParamReport, SwitchBase8EncoderDecoder) {
    ParamReport r = report_of("switch-base-8.json");
    const int64_t V = 32128, d = 768, ff = 3072, E = 8, H = 12, buckets = 32;
    const int64_t attn = 4 * d * (H * 64), ffn = 2 * d * ff, sparse = E * d + E * ffn;
    // 12 blocks per stack; sparse where i % 2 == 1; relative bias in block 0 of each stack.
    const int64_t encoder = 12 * (attn + 2 * d) + 6 * ffn + 6 * sparse + buckets * H + d;
    const int64_t decoder = 12 * (2 * attn + 3 * d) + 6 * ffn + 6 * sparse + buckets * H + d;
    EXPECT_EQ(r.total_params, V * d + encoder + decoder);  // shared embedding, tied head
    EXPECT_EQ(r.total_params, 619'339'008);
    EXPECT_EQ(r.active_params, r.total_params - 12 * (E - 1) * ffn);  // top-1, both stacks
    EXPECT_EQ(r.active_params, 222'977'280);
    ASSERT_EQ(r.stacks.size(), 2u);
    EXPECT_EQ(r.stacks[0].params, encoder);
    EXPECT_EQ(r.stacks[1].params, decoder);
    EXPECT_EQ(group(r, ParamGroup::Positional), 2 * buckets * H);
    EXPECT_EQ(group(r, ParamGroup::LmHead), 0);
    // KV cache: decoder self-attention only; cross-attention per encoder token on the side.
    EXPECT_EQ(r.kv_values_per_token, 2 * 12 * H * 64);
    EXPECT_EQ(r.kv_cross_values_per_token, 2 * 12 * H * 64);
    // Published: ~619M parameters (google/switch-base-8), to 0.5%.
    EXPECT_LT(rel_diff(r.total_params, 619e6), 0.005);
}

// google/switch-base-128 is switch-base-8 with 128 experts (its config differs only in
// num_experts): 7.4B published.
TEST(ParamReport, SwitchBase128IsSwitchBase8With128Experts) {
    json j = json::parse(read_file(fixture("switch-base-8.json")));
    j["num_experts"] = 128;
    const ParamReport r = build_param_report(j, "switch-base-128.json");
    const int64_t d = 768, ff = 3072, ffn = 2 * d * ff;
    // 12 sparse blocks (6 per stack), each with 120 more experts and 120 more router rows.
    EXPECT_EQ(r.total_params, 619'339'008 + 12 * 120 * (ffn + d));
    EXPECT_EQ(r.total_params, 7'415'217'408);
    EXPECT_EQ(r.active_params, r.total_params - 12 * 127 * ffn);  // top-1
    EXPECT_EQ(r.active_params, 224'083'200);
    EXPECT_LT(rel_diff(r.total_params, 7.4e9), 0.005);
}

TEST(ParamReport, SwitchDefaultsDeriveTheSparseStepFromTheSparseLayerCount) {
    json j = {{"model_type", "switch_transformers"},
              {"vocab_size", 100},
              {"d_model", 8},
              {"num_layers", 12},
              {"num_heads", 2}};
    ParamReport r = build_param_report(j, "s.json");
    // num_sparse_encoder_layers defaults to 3: step 12 / 3 = 4, sparse blocks 1, 5, 9.
    std::vector<int> sparse;
    for (int i = 0; i < 12; ++i)
        if (r.model.blocks[i].kind == "MoE") sparse.push_back(i);
    EXPECT_EQ(sparse, (std::vector<int>{1, 5, 9}));
    EXPECT_EQ(r.model.blocks.size(), 24u);  // num_decoder_layers defaults to num_layers
}

TEST(ParamReport, MissingHuggingFaceKeysTakeTheClassDefaults) {
    // Only the size keys: every other field is MixtralConfig's / LlamaConfig's default, which
    // are Mixtral-8x7B's and LLaMA-7B's.
    json mixtral = {{"model_type", "mixtral"},
                    {"vocab_size", 32000},
                    {"hidden_size", 4096},
                    {"num_hidden_layers", 32},
                    {"num_attention_heads", 32}};
    EXPECT_EQ(build_param_report(mixtral, "m.json").total_params, 46'702'792'704);
    json llama = {{"model_type", "llama"},
                  {"vocab_size", 32000},
                  {"hidden_size", 4096},
                  {"num_hidden_layers", 32},
                  {"num_attention_heads", 32}};
    EXPECT_EQ(build_param_report(llama, "l.json").total_params, 6'738'415'616);
}

TEST(ParamReport, LlamaBiasSwitchesAddBiases) {
    json j = {{"model_type", "llama"},   {"vocab_size", 10},         {"hidden_size", 8},
              {"num_hidden_layers", 1},  {"num_attention_heads", 2}, {"num_key_value_heads", 1},
              {"intermediate_size", 12}, {"attention_bias", true},   {"mlp_bias", true}};
    ParamReport r = build_param_report(j, "l.json");
    EXPECT_EQ(group(r, ParamGroup::Attention), (8 * 8 + 8) + 2 * (8 * 4 + 4) + (8 * 8 + 8));
    EXPECT_EQ(group(r, ParamGroup::DenseFfn), 2 * (8 * 12 + 12) + (12 * 8 + 8));
}

// ------------------------------------------------------------------- memory, KV, FLOPs

TEST(ParamReport, MemoryIsBytesPerParameter) {
    ParamReport r = report_of("mixtral-8x7b.json");
    const double n = static_cast<double>(r.total_params);
    EXPECT_EQ(r.weight_bytes[0], 4 * n);
    EXPECT_EQ(r.weight_bytes[1], 2 * n);
    // q8_0 as tmx stores it: 34 bytes a block of 32, the norms and the router in fp32.
    const double f32 =
        static_cast<double>(group(r, ParamGroup::Norms) + group(r, ParamGroup::Router));
    EXPECT_GT(f32, 0);
    EXPECT_DOUBLE_EQ(r.weight_bytes[2], 4 * f32 + (n - f32) * 34 / 32);
    EXPECT_EQ(r.weight_bytes[3], n);
    EXPECT_EQ(r.weight_bytes[4], n / 2);
    EXPECT_EQ(r.train_fp32_bytes, 16 * n);
    EXPECT_EQ(r.train_mixed_bytes, 16 * n);  // 2 + 2 + 4 + 4 + 4
    EXPECT_FALSE(r.has_activations);
}

TEST(ParamReport, ActivationEstimateScalesWithBatchAndSequence) {
    ReportOptions o;
    o.batch = 4;
    o.seq = 128;
    ParamReport a = build_param_report(json::object(), "defaults", o);
    ASSERT_TRUE(a.has_activations);
    EXPECT_EQ(a.act_batch, 4);
    EXPECT_EQ(a.act_seq, 128);
    o.batch = 8;
    ParamReport b = build_param_report(json::object(), "defaults", o);
    EXPECT_DOUBLE_EQ(b.activation_bytes, 2 * a.activation_bytes);
    EXPECT_GT(a.activation_bytes, 4.0 * 128 * 4 * 32000);  // at least the fp32 logits
}

// For a model the engine runs, the report carries what tmx train allocates at that batch
// (training_memory(), in fp32 and bf16, also in the JSON); for one it does not run, nothing.
TEST(ParamReport, EngineTrainingMemoryForModelsTheEngineRuns) {
    ReportOptions o;
    o.batch = 3;
    o.seq = 64;
    const ParamReport native = build_param_report(json::object(), "defaults", o);
    ASSERT_TRUE(native.engine_training.has_value());
    const ModelConfig c = *engine_config_for(json::object(), "defaults");
    const auto& [f32, b16] = *native.engine_training;
    EXPECT_EQ(f32.total(), training_memory(c, 3, 64, Precision::F32).total());
    EXPECT_EQ(b16.total(), training_memory(c, 3, 64, Precision::BF16).total());
    const double n = static_cast<double>(native.total_params);
    EXPECT_EQ(b16.bf16_weights, 2 * n);
    EXPECT_EQ(f32.bf16_weights, 0);
    EXPECT_LT(b16.activations, f32.activations);  // matmul-only activations stored bf16
    const json j = param_report_json(native);
    EXPECT_EQ(j["memory"]["engine_training"]["bf16"]["total"].get<double>(),
              std::round(b16.total()));
    EXPECT_NE(format_param_report(native).find("tmx train allocates, batch 3 x seq 64"),
              std::string::npos);

    const ParamReport mixtral = report_of("mixtral-8x7b.json");  // no --batch: no activations
    EXPECT_FALSE(mixtral.engine_training.has_value());
    const ParamReport gpt2 = report_of("gpt2.json", o);  // GELU MLP, learned positions
    EXPECT_FALSE(gpt2.engine_training.has_value());
    EXPECT_TRUE(param_report_json(gpt2)["memory"]["engine_training"].is_null());
}

TEST(ParamReport, FlopsOfTheDefaultModel) {
    ParamReport r = build_param_report(json::object(), "defaults");
    const int64_t L = 8, d = 512, V = 32000;
    // Active weight matrices: attention, router, two experts' w1 and w2, and the LM head.
    const int64_t matmul = L * (655'360 + 8 * d + 2 * (2 * d * 2048)) + V * d;
    EXPECT_EQ(r.matmul_params, matmul);
    EXPECT_EQ(r.flops_context, 512);
    // Window 256 over 512 causal tokens: (256 * 257 / 2 + 256 * 256) / 512 keys on average.
    EXPECT_DOUBLE_EQ(r.keys_mean, 192.25);
    EXPECT_DOUBLE_EQ(r.keys_last, 256);
    const double per_key = L * 4.0 * 8 * 64;
    EXPECT_DOUBLE_EQ(r.forward_flops, 2.0 * matmul + per_key * 192.25);
    EXPECT_DOUBLE_EQ(r.forward_flops, 113'577'984);
    EXPECT_DOUBLE_EQ(r.training_flops, 3 * r.forward_flops);
    EXPECT_DOUBLE_EQ(r.decode_flops, 2.0 * matmul + per_key * 256);
    EXPECT_EQ(r.kv_cached_tokens, 256);
}

TEST(ParamReport, SeqSetsTheAttentionContext) {
    ReportOptions o;
    o.seq = 100;
    ParamReport r = report_of("llama-7b.json", o);
    EXPECT_EQ(r.flops_context, 100);
    EXPECT_DOUBLE_EQ(r.keys_mean, 50.5);  // no window: (T + 1) / 2
    EXPECT_DOUBLE_EQ(r.keys_last, 100);
    EXPECT_EQ(r.kv_cached_tokens, 2048);  // the full context stays the config's
}

// ------------------------------------------------------------------------ text and JSON

TEST(ParamReport, JsonHasTheDocumentedKeysAsIntegers) {
    ParamReport r = report_of("qwen1.5-moe-a2.7b.json");
    json j = param_report_json(r);
    for (const char* key : {"total_params", "active_params", "components", "memory", "kv_cache",
                            "flops", "model_type", "notes"})
        EXPECT_TRUE(j.contains(key)) << key;
    ASSERT_TRUE(j["total_params"].is_number_integer());
    ASSERT_TRUE(j["active_params"].is_number_integer());
    EXPECT_EQ(j["total_params"].get<int64_t>(), 14'315'784'192);
    EXPECT_EQ(j["active_params"].get<int64_t>(), 2'689'173'504);
    EXPECT_EQ(j["model_type"], "qwen2_moe");
    int64_t sum = 0;
    for (int g = 0; g < kNumParamGroups; ++g) {
        const json& c = j["components"][group_key(static_cast<ParamGroup>(g))];
        ASSERT_TRUE(c["total"].is_number_integer()) << group_key(static_cast<ParamGroup>(g));
        sum += c["total"].get<int64_t>();
    }
    EXPECT_EQ(sum, 14'315'784'192);
    EXPECT_TRUE(j["memory"]["weights_bytes"]["bf16"].is_number_integer());
    EXPECT_EQ(j["memory"]["weights_bytes"]["bf16"].get<int64_t>(), 2 * 14'315'784'192);
    EXPECT_TRUE(j["kv_cache"]["bytes_per_token"]["bf16"].is_number_integer());
    EXPECT_TRUE(j["flops"]["forward_per_token"].is_number_integer());
    EXPECT_TRUE(j["flops"]["training_per_token"].is_number_integer());
}

TEST(ParamReport, TextShowsTheTableWithThousandsSeparators) {
    std::string text = format_param_report(report_of("deepseek-moe-16b.json"));
    for (const char* s :
         {"16,375,728,128", "2,828,650,496", "experts (routed)", "shared experts", "dense FFN",
          "(27 of 28 layers)", "dense 0; MoE 1-27", "bf16", "int4", "KV cache", "training step"})
        EXPECT_NE(text.find(s), std::string::npos) << s << "\n" << text;
    EXPECT_EQ(with_thousands(1234567), "1,234,567");
    EXPECT_EQ(with_thousands(999), "999");
    EXPECT_EQ(with_thousands(-1000), "-1,000");
}

// ------------------------------------------------------------------------------ errors

TEST(ParamReport, UnknownModelTypeListsTheSupportedOnes) {
    std::string e = report_error({{"model_type", "bert"}, {"hidden_size", 768}}, "bert.json");
    EXPECT_NE(e.find("bert.json"), std::string::npos) << e;
    EXPECT_NE(e.find("model_type"), std::string::npos) << e;
    EXPECT_NE(e.find("\"bert\""), std::string::npos) << e;
    for (const char* t : {"llama", "mistral", "mixtral", "qwen2_moe", "olmoe", "deepseek", "gpt2",
                          "switch_transformers"})
        EXPECT_NE(e.find(t), std::string::npos) << t << ": " << e;
}

TEST(ParamReport, MissingSizeKeyNamesFileAndField) {
    json j = json::parse(read_file(fixture("mixtral-8x7b.json")));
    j.erase("hidden_size");
    std::string e = report_error(j, "mixtral.json");
    EXPECT_NE(e.find("mixtral.json"), std::string::npos) << e;
    EXPECT_NE(e.find("'hidden_size'"), std::string::npos) << e;
    EXPECT_NE(e.find("missing"), std::string::npos) << e;
}

TEST(ParamReport, WrongTypeNamesFileAndField) {
    json j = json::parse(read_file(fixture("olmoe-1b-7b.json")));
    j["num_hidden_layers"] = "16";
    std::string e = report_error(j, "olmoe.json");
    EXPECT_NE(e.find("olmoe.json"), std::string::npos) << e;
    EXPECT_NE(e.find("'num_hidden_layers'"), std::string::npos) << e;
    EXPECT_NE(e.find("expected an integer"), std::string::npos) << e;

    j = json::parse(read_file(fixture("switch-base-8.json")));
    j["tie_word_embeddings"] = 1;
    e = report_error(j, "switch.json");
    EXPECT_NE(e.find("'tie_word_embeddings'"), std::string::npos) << e;
}

TEST(ParamReport, NativeAndNanochatErrorsNameTheField) {
    std::string e = report_error({{"d_model", "512"}}, "native.json");
    EXPECT_NE(e.find("native.json"), std::string::npos) << e;
    EXPECT_NE(e.find("'d_model'"), std::string::npos) << e;
    e = report_error({{"d_modle", 512}}, "native.json");  // native configs reject unknown keys
    EXPECT_NE(e.find("d_modle"), std::string::npos) << e;
    e = report_error({{"n_embd", 100}, {"n_head", 3}}, "nano.json");
    EXPECT_NE(e.find("'n_embd'"), std::string::npos) << e;
}

TEST(ParamReport, DeepseekMoeLayersNeedTopK) {
    json j = json::parse(read_file(fixture("deepseek-moe-16b.json")));
    j.erase("num_experts_per_tok");
    std::string e = report_error(j, "ds.json");
    EXPECT_NE(e.find("'num_experts_per_tok'"), std::string::npos) << e;
    j.erase("n_routed_experts");  // no routed experts: every layer dense, no top-k needed
    ParamReport r = build_param_report(j, "ds.json");
    EXPECT_EQ(r.active_params, r.total_params);
    EXPECT_EQ(group(r, ParamGroup::Router), 0);
}

// ----------------------------------------------------------------- against the engine

TEST(ParamReport, EngineConfigForNativeAndLlamaFamily) {
    EXPECT_TRUE(engine_config_for(json::object(), "defaults").has_value());
    auto mc = engine_config_for(read_json_file(fixture("mixtral-8x7b.json")), "mixtral.json");
    ASSERT_TRUE(mc.has_value());
    EXPECT_EQ(mc->ffn_type, FfnType::SwiGlu);
    EXPECT_EQ(mc->norm_type, NormType::RmsNorm);
    EXPECT_EQ(mc->n_experts, 8);
    EXPECT_EQ(mc->top_k, 2);
    EXPECT_EQ(mc->d_ff, 14336);
    EXPECT_FALSE(mc->ffn_bias);
    EXPECT_FALSE(mc->attn_bias);
    auto mistral = engine_config_for(read_json_file(fixture("mistral-7b.json")), "mistral.json");
    ASSERT_TRUE(mistral.has_value());
    EXPECT_EQ(mistral->n_experts, 0);
    EXPECT_EQ(mistral->sliding_window, 4096);

    std::string why;
    EXPECT_FALSE(
        engine_config_for(read_json_file(fixture("qwen1.5-moe-a2.7b.json")), "q.json", &why)
            .has_value());
    EXPECT_NE(why.find("qwen2_moe"), std::string::npos) << why;
    EXPECT_FALSE(
        engine_config_for(read_json_file(fixture("nanochat-d20.json")), "n.json").has_value());
}

TEST(ParamReport, AnalyticCountsMatchTheEnginesInstantiatedParameters) {
    // Specs are shapes only: even Mixtral-8x7B's are cheap to list.
    for (const char* name :
         {"mini-gpt.json", "llama-7b.json", "mistral-7b.json", "mixtral-8x7b.json"}) {
        SCOPED_TRACE(name);
        json j = read_json_file(fixture(name));
        auto mc = engine_config_for(j, name);
        ASSERT_TRUE(mc.has_value());
        EXPECT_EQ(engine_params(*mc), build_param_report(j, name).total_params);
    }
    for (json j : {json::object(), json{{"n_experts", 0}, {"ffn_type", "swiglu"}},
                   json{{"tie_embeddings", true}, {"attn_bias", true}, {"norm_type", "rmsnorm"}}}) {
        SCOPED_TRACE(j.dump());
        EXPECT_EQ(engine_params(config_from_json(j, "cfg.json")),
                  build_param_report(j, "cfg.json").total_params);
    }
}

// Configs whose sizes overflow or pass any sane bound are refused, naming the file and the field
// or the figure, before anything is counted per layer (10^12 layers used to grow memory until
// killed; sizes near 2^62 wrapped into negative or tiny counts).
TEST(ParamReport, HugeConfigsAreRefused) {
    auto llama = [](json extra) {
        json j = {{"model_type", "llama"},
                  {"vocab_size", 32000},
                  {"hidden_size", 4096},
                  {"num_hidden_layers", 32},
                  {"num_attention_heads", 32}};
        j.update(extra);
        return j;
    };
    std::string e = report_error(llama({{"hidden_size", int64_t{1} << 62}}));
    ASSERT_NE(e.find("cfg.json: the parameter count: size overflows a 64-bit integer"),
              std::string::npos)
        << e;
    struct Case {
        json j;
        const char* expected;
    };
    const Case cases[] = {
        {llama({{"intermediate_size", int64_t{1} << 61}}), "the parameter count: size overflows"},
        {llama({{"vocab_size", int64_t{1} << 40}}), "more than the limit of 281,474,976,710,656"},
        {llama({{"num_hidden_layers", int64_t{1'000'000'000'000}}}),
         "field 'num_hidden_layers': must be at most 4096"},
        {llama({{"vocab_size", json::parse("18446744073709551615")}}),
         "field 'vocab_size': expected an integer that fits in 64 bits"},
        {llama({{"max_position_embeddings", int64_t{1} << 50}}),
         "the fp32 KV cache at the context (max_position_embeddings"},
        {{{"model_type", "switch_transformers"},
          {"vocab_size", 100},
          {"d_model", 64},
          {"num_layers", 2},
          {"num_heads", 4},
          {"num_decoder_layers", 1'000'000}},
         "field 'num_decoder_layers': must be at most 4096"},
        {{{"n_layer", int64_t{1'000'000'000'000}}}, "field 'n_layer': must be at most 4096"},
        {{{"n_embd", int64_t{1} << 62}, {"n_head", 1}}, "the parameter count: size overflows"},
        {{{"model_type", "gpt2"},
          {"vocab_size", 100},
          {"n_embd", int64_t{1} << 61},
          {"n_layer", 1},
          {"n_head", 1}},
         "the parameter count: size overflows"},
        {{{"n_layers", int64_t{1'000'000'000'000}}}, "field 'n_layers': must be at most 4096"},
    };
    for (const auto& c : cases) {
        e = report_error(c.j);
        EXPECT_EQ(e.find("cfg.json: "), 0u) << c.j.dump() << " -> " << e;
        EXPECT_NE(e.find(c.expected), std::string::npos) << c.j.dump() << " -> " << e;
    }
}

// Memory at the requested batch that passes 1 EiB is a usage error naming the flags.
TEST(ParamReport, HugeBatchOrSequenceIsAUsageError) {
    const json cfg = json::object();  // the tiny-mixtral defaults
    EXPECT_NO_THROW(build_param_report(cfg, "cfg.json", {.batch = 1024, .seq = 4096}));
    auto usage_error = [&](ReportOptions opts) -> std::string {
        try {
            build_param_report(cfg, "cfg.json", opts);
        } catch (const UsageError& e) {
            return e.what();
        }
        return "";
    };
    std::string e = usage_error({.batch = int64_t{1} << 50});
    EXPECT_NE(e.find("the activations of 1,125,899,906,842,624 x 512 tokens (batch x seq)"),
              std::string::npos)
        << e;
    EXPECT_NE(e.find("more than the limit of 1 EiB"), std::string::npos) << e;
    e = usage_error({.seq = int64_t{1} << 62});
    EXPECT_NE(e.find("1 x 4,611,686,018,427,387,904 tokens (batch x seq)"), std::string::npos) << e;
}

// ---------------------------------------------------------------------------------- CLI

TEST(ParamsCli, PrintsTheReportAsTextAndJson) {
    auto r = test::run_tmx("params --config " + fixture("mixtral-8x7b.json"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("46,702,792,704"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("12,879,925,248"), std::string::npos) << r.out;

    r = test::run_tmx("params --config " + fixture("switch-base-8.json") +
                      " --json --batch 2 --seq 64");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    json j = json::parse(r.out);
    EXPECT_EQ(j["total_params"].get<int64_t>(), 619'339'008);
    EXPECT_EQ(j["active_params"].get<int64_t>(), 222'977'280);
    EXPECT_EQ(j["flops"]["context"].get<int64_t>(), 64);
    EXPECT_EQ(j["memory"]["activations"]["batch"].get<int64_t>(), 2);
}

TEST(ParamsCli, VerifyMatchesTheEngineAndRefusesOtherArchitectures) {
    auto r = test::run_tmx("params --config " + fixture("mini-gpt.json") + " --verify");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("verify:"), std::string::npos) << r.out;

    r = test::run_tmx("params --config " + fixture("qwen1.5-moe-a2.7b.json") + " --verify");
    EXPECT_EQ(r.exit_code, 2) << r.out;
    EXPECT_NE(r.err.find("qwen2_moe"), std::string::npos) << r.err;
}

TEST(ParamsCli, HugeOrOverflowingConfigsAndFlagsAreRefused) {
    test::TempDir tmp;
    const std::string path = tmp / "huge.json";
    test::write_text(path, R"({"d_model": 4611686018427387904, "n_heads": 1, "n_kv_heads": 1,
                               "head_dim": 2})");
    auto r = test::run_tmx("params --config " + path);
    EXPECT_EQ(r.exit_code, 1) << r.out;
    EXPECT_NE(r.err.find(path + ": parameter count: size overflows"), std::string::npos) << r.err;

    // A number beyond a double is a JSON error naming the file, not an internal error.
    test::write_text(path, R"({"n_layers": 1e400})");
    r = test::run_tmx("params --config " + path);
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("tmx: error: " + path + ": not valid JSON"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("number overflow"), std::string::npos) << r.err;

    r = test::run_tmx("params --config " + fixture("mixtral-8x7b.json") +
                      " --batch 1000000000000000");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("the activations of 1,000,000,000,000,000 x"), std::string::npos) << r.err;
    r = test::run_tmx("params --config " + fixture("mixtral-8x7b.json") +
                      " --seq 99999999999999999999");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("--seq: expected an integer from 1 to 2^63 - 1, got 99999999999999999999"),
              std::string::npos)
        << r.err;
}

TEST(ParamsCli, BadConfigExitsWithOneAndNamesTheField) {
    test::TempDir tmp;
    const std::string path = tmp / "bad.json";
    test::write_text(path, R"({"model_type": "llama", "vocab_size": 10, "num_hidden_layers": 1,
                               "num_attention_heads": 2})");
    auto r = test::run_tmx("params --config " + path);
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("'hidden_size'"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("bad.json"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace tmx

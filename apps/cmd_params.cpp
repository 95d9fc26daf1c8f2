// tmx params: parameters, memory, KV cache and FLOPs of a model config (native tiny-mixtral,
// Hugging Face config.json, or nanochat GPTConfig), computed analytically.
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "apps/commands.h"
#include "engine/core/errors.h"
#include "engine/core/file_io.h"
#include "engine/model/model.h"
#include "engine/report/param_report.h"

namespace tmx::cli {
namespace {

struct ParamsOptions {
    std::string config;
    int64_t batch = 0;
    int64_t seq = 0;
    bool json = false;
    bool verify = false;
};

// The report group of an engine tensor, from its DESIGN.md section 3 name.
ParamGroup group_of(const std::string& name) {
    auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
    if (has("embed_tokens")) return ParamGroup::Embedding;
    if (has("lm_head")) return ParamGroup::LmHead;
    if (has("self_attn")) return ParamGroup::Attention;
    if (has("block_sparse_moe.gate")) return ParamGroup::Router;
    if (has("experts")) return ParamGroup::RoutedExperts;
    if (has(".mlp.")) return ParamGroup::DenseFfn;
    return ParamGroup::Norms;  // input_layernorm, post_attention_layernorm, model.norm
}

// Compares the analytic count with the parameters the engine instantiates, group by group.
// Throws UsageError when the engine cannot build the model, Error on a mismatch.
nlohmann::json verify_against_engine(const nlohmann::json& cfg, const ParamReport& report) {
    std::string why;
    std::optional<ModelConfig> mc = engine_config_for(cfg, report.source, &why);
    if (!mc) throw UsageError(report.source + ": --verify: " + why);
    GroupCounts engine{};
    int64_t total = 0, tensors = 0;
    for (const ParamSpec& s : model_param_specs(*mc)) {
        engine[static_cast<int>(group_of(s.name))] += s.numel();
        total += s.numel();
        ++tensors;
    }
    std::string mismatches;
    for (int g = 0; g < kNumParamGroups; ++g)
        if (engine[g] != report.group_totals[g])
            mismatches += std::string(mismatches.empty() ? "" : "; ") +
                          group_label(static_cast<ParamGroup>(g)) + ": analytic " +
                          with_thousands(report.group_totals[g]) + ", engine " +
                          with_thousands(engine[g]);
    if (total != report.total_params || !mismatches.empty())
        throw Error(report.source + ": --verify: the analytic count (" +
                    with_thousands(report.total_params) +
                    ") differs from the engine's instantiated parameters (" +
                    with_thousands(total) + "): " + mismatches);
    return {{"engine_params", total}, {"engine_tensors", tensors}, {"matches", true}};
}

void run_params(const ParamsOptions& o) {
    const nlohmann::json cfg = read_json_file(o.config);
    ReportOptions ro;
    ro.batch = o.batch;
    ro.seq = o.seq;
    const ParamReport report = build_param_report(cfg, o.config, ro);
    nlohmann::json verified;
    if (o.verify) verified = verify_against_engine(cfg, report);
    if (o.json) {
        nlohmann::json j = param_report_json(report);
        if (o.verify) j["verify"] = verified;
        std::cout << j.dump(2) << "\n";
        return;
    }
    std::cout << format_param_report(report);
    if (o.verify)
        std::cout << "\nverify: the engine instantiates "
                  << with_thousands(verified["engine_params"]) << " parameters in "
                  << verified["engine_tensors"].get<int64_t>()
                  << " tensors, matching the analytic count in every component\n";
}

}  // namespace

void add_params_command(CLI::App& app, CommonOptions& common) {
    auto opts = std::make_shared<ParamsOptions>();
    CLI::App* sub = app.add_subcommand(
        "params", "Parameters, active parameters, memory, KV cache and FLOPs of a model config");
    sub->add_option("--config", opts->config,
                    "Native tiny-mixtral config, Hugging Face config.json (llama, mistral, "
                    "mixtral, qwen2_moe, olmoe, deepseek, gpt2, switch_transformers) or "
                    "nanochat GPTConfig JSON")
        ->required();
    sub->add_option("--batch", opts->batch, "Batch size for the activation-memory estimate")
        ->check(in_range<int64_t>(1));
    sub->add_option("--seq", opts->seq,
                    "Tokens per sequence for FLOPs and activations (default: the config's "
                    "context)")
        ->check(in_range<int64_t>(1));
    sub->add_flag("--json", opts->json, "Print the report as one JSON object");
    sub->add_flag("--verify", opts->verify,
                  "Check the analytic count against the parameters the engine instantiates "
                  "(native configs and Hugging Face llama/mistral/mixtral)");
    add_common_options(*sub, common);
    sub->callback([opts]() { run_params(*opts); });
}

}  // namespace tmx::cli

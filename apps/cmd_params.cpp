// tmx params: parameters, memory, KV cache and FLOPs of a model config (native tiny-mixtral,
// Hugging Face config.json, or nanochat GPTConfig), computed analytically; with --ranks,
// --interconnect and the other scaling flags, the estimated data-parallel scaling as well.
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "apps/commands.h"
#include "apps/option_flags.h"
#include "engine/core/errors.h"
#include "engine/core/file_io.h"
#include "engine/core/format.h"
#include "engine/model/model.h"
#include "engine/report/dp_scaling.h"
#include "engine/report/param_report.h"

namespace tmx::cli {
namespace {

struct ParamsOptions {
    std::string config;
    int64_t batch = 0;
    int64_t seq = 0;
    bool json = false;
    bool verify = false;
    // The data-parallel section's flags as given (parsed in scaling_options(), so that the
    // errors name the flag), and which of them were: the section appears when any was.
    std::string ranks, interconnect, latency_us, step_time, peak_tflops, mfu;
    int64_t tokens_per_step = 0;
    std::set<std::string> given;
    bool has(const std::string& flag) const { return given.count(flag) > 0; }
};

ScalingOptions scaling_options(const ParamsOptions& o) {
    ScalingOptions s;
    s.spelling = flag_of;
    if (o.has("--ranks")) s.ranks = parse_rank_list(o.ranks, "--ranks");
    if (o.has("--interconnect"))
        s.interconnects = parse_interconnect_list(o.interconnect, "--interconnect");
    if (o.has("--latency-us"))
        s.step_latency_us =
            parse_number(o.latency_us, "--latency-us", "microseconds", 0, false, 1e6);
    if (o.has("--step-time"))
        s.step_time_s = parse_number(o.step_time, "--step-time", "seconds", 0, true, 1e6);
    if (o.has("--peak-tflops")) {
        s.peak_tflops = parse_number(o.peak_tflops, "--peak-tflops", "TFLOP/s", 0, true, 1e6);
        s.peak_given = true;
    }
    if (o.has("--mfu")) {
        s.mfu = parse_number(o.mfu, "--mfu", "a fraction of the peak", 0, true, 1);
        s.mfu_given = true;
    }
    s.tokens_per_step = o.tokens_per_step;
    return s;
}

// The report group of an engine tensor, from its name
// (docs/design.md#10-parameters-and-initialisation).
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
    // The flags first: a bad value is refused before the config is read.
    std::optional<ScalingOptions> scaling;
    if (!o.given.empty()) scaling = scaling_options(o);
    const nlohmann::json cfg = read_json_file(o.config);
    ReportOptions ro;
    ro.batch = o.batch;
    ro.seq = o.seq;
    ro.spelling = flag_of;
    const ParamReport report = build_param_report(cfg, o.config, ro);
    nlohmann::json verified;
    if (o.verify) verified = verify_against_engine(cfg, report);
    std::optional<ScalingReport> dp;
    if (scaling) dp = build_scaling_report(report, *scaling);
    if (o.json) {
        nlohmann::json j = param_report_json(report);
        if (o.verify) j["verify"] = verified;
        if (dp) j["data_parallel"] = scaling_report_json(*dp);
        std::cout << j.dump(2) << "\n";
        return;
    }
    std::cout << format_param_report(report);
    if (o.verify)
        std::cout << "\nverify: the engine instantiates "
                  << with_thousands(verified["engine_params"]) << " parameters in "
                  << verified["engine_tensors"].get<int64_t>()
                  << " tensors, matching the analytic count in every component\n";
    if (dp) std::cout << format_scaling_report(*dp);
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

    // Data-parallel scaling.
    std::string presets;
    for (const Interconnect& p : interconnect_presets())
        presets += "; " + p.key + " " + format_real(p.bus_gb_per_s) + " GB/s (" + p.name + ")";
    const std::vector<CLI::Option*> scaling = {
        sub->add_option("--ranks", opts->ranks,
                        "Adds the data-parallel scaling estimate (any of the flags below does): "
                        "comma-separated GPU counts, 1 to " +
                            with_thousands(kMaxRanks) +
                            " (default 2,4,8). Each rank holds the whole model and a ring "
                            "all-reduce sums the fp32 gradients of all parameters every step, at "
                            "a fixed global batch; estimates, not measurements"),
        sub->add_option("--interconnect", opts->interconnect,
                        "Comma-separated interconnects for the scaling estimate, each a preset or "
                        "a per-GPU bus bandwidth in GB/s (per direction, NCCL-tests busbw); "
                        "default nvlink" +
                            presets),
        sub->add_option("--latency-us", opts->latency_us,
                        "Latency of one ring step in microseconds, for every interconnect "
                        "(default: NCCL's cost model: 3.4 NVLink, 5.7 PCIe, 9.6 network or a GB/s "
                        "figure); each all-reduce also pays 8.4 us"),
        sub->add_option("--step-time", opts->step_time,
                        "Measured time in seconds of one training step of the whole global batch "
                        "on one GPU (default: estimated from the training FLOPs per token, "
                        "--peak-tflops and --mfu)"),
        sub->add_option("--tokens-per-step", opts->tokens_per_step,
                        "Global tokens per optimizer step, split over the ranks (default: --batch, "
                        "else tmx train's default of 8 sequences, x --seq, else the config's "
                        "context)")
            ->check(in_range<int64_t>(1)),
        sub->add_option("--peak-tflops", opts->peak_tflops,
                        "One GPU's peak TFLOP/s for the step-time estimate (default 989: H100 SXM "
                        "dense bf16)"),
        sub->add_option("--mfu", opts->mfu,
                        "Assumed model FLOPs utilisation, a fraction of the peak above 0 and at "
                        "most 1, for the step-time estimate (default 0.4)"),
    };
    add_common_options(*sub, common);
    sub->callback([opts, scaling]() {
        for (const CLI::Option* flag : scaling)
            if (flag->count() > 0) opts->given.insert(flag->get_name());
        run_params(*opts);
    });
}

}  // namespace tmx::cli

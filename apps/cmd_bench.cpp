// tmx bench: backend comparison runs at a model's real shapes (engine/report/bench.h).
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "apps/commands.h"
#include "backends/registry.h"
#include "engine/compute/backend.h"
#include "engine/core/errors.h"
#include "engine/model/checkpoint.h"
#include "engine/report/bench.h"
#include "engine/report/param_report.h"

namespace tmx::cli {
namespace {

// The backends of this build that can run here (a Vulkan build without a device cannot).
std::vector<std::string> present_backends() {
    std::vector<std::string> names;
    for (const std::string& n : backend_names()) {
        try {
            make_backend(n);
            names.push_back(n);
        } catch (const Error&) {
        }
    }
    return names;
}

std::vector<std::string> split_names(const std::string& list) {
    std::vector<std::string> names;
    size_t i = 0;
    while (i <= list.size()) {
        size_t j = list.find(',', i);
        if (j == std::string::npos) j = list.size();
        if (j > i) names.push_back(list.substr(i, j - i));
        i = j + 1;
    }
    if (names.empty()) throw UsageError("--backends: expected names like cpu,vulkan");
    return names;
}

// `title`: what was profiled ("decode profile, batch 8, 32 steps").
void print_profile(const std::string& title, const StepProfile& p) {
    double device = 0;
    int64_t commands = 0;
    for (const Backend::ProfiledCommands& c : p.commands) {
        device += c.seconds;
        commands += c.count;
    }
    const double steps = static_cast<double>(p.steps);
    char barriers[64] = "";
    if (p.barriers)
        std::snprintf(barriers, sizeof barriers, " and %.1f barriers",
                      static_cast<double>(*p.barriers) / steps);
    std::printf("  %s: %.3f ms a step, the device busy %.3f ms of it; %.1f commands%s a step\n",
                title.c_str(), 1e3 * p.wall_seconds / steps, 1e3 * device / steps,
                static_cast<double>(commands) / steps, barriers);
    std::vector<Backend::ProfiledCommands> by_time = p.commands;
    std::stable_sort(by_time.begin(), by_time.end(),
                     [](const auto& a, const auto& b) { return a.seconds > b.seconds; });
    std::printf("    %-32s %10s %12s %7s\n", "command", "per step", "us a step", "share");
    for (const Backend::ProfiledCommands& c : by_time)
        std::printf("    %-32s %10.1f %12.1f %6.1f%%\n", c.name.c_str(),
                    static_cast<double>(c.count) / steps, 1e6 * c.seconds / steps,
                    device > 0 ? 100 * c.seconds / device : 0.0);
}

void print_table(const std::vector<BackendBench>& results, const std::string& model,
                 const BenchOptions& o) {
    std::printf("model: %s, %s weights\n", model.c_str(), to_string(o.weight_format));
    for (const BackendBench& r : results) {
        std::printf("\n%s\n", r.description.c_str());
        // ms: one launch's, from batches of `launches` back-to-back launches.
        std::printf("  %-24s %-34s %10s %8s %10s %9s %10s\n", "op", "shape", "ms", "launches",
                    "GFLOP/s", "GB/s", "err vs cpu");
        for (const OpBench& op : r.ops) {
            if (!op.skipped.empty()) {
                std::printf("  %-24s %-34s skipped: %s\n", op.op.c_str(), op.shape.c_str(),
                            op.skipped.c_str());
                continue;
            }
            char gflops[32] = "-";
            if (op.gflops > 0) std::snprintf(gflops, sizeof gflops, "%.1f", op.gflops);
            std::printf("  %-24s %-34s %10.3f %8d %10s %9.1f %10.1e\n", op.op.c_str(),
                        op.shape.c_str(), op.ms, op.launches, gflops, op.gbytes_per_s,
                        op.max_error);
        }
        const ModelBench& m = r.model;
        std::printf(
            "  prefill %.1f tokens/s, decode batch 1 %.1f tokens/s, batch-N decode %.1f "
            "tokens/s\n",
            m.prefill_tokens_per_s, m.decode_tokens_per_s, m.batch_decode_tokens_per_s);
        std::printf("  logits vs cpu: max error %.1e; greedy tokens matching cpu %lld of %lld\n",
                    m.logits_error, static_cast<long long>(m.greedy_matching),
                    static_cast<long long>(m.greedy_steps));
        if (m.prefill_profile)
            print_profile("prefill profile, " + std::to_string(m.prefill_profile->tokens) +
                              " tokens in one step",
                          *m.prefill_profile);
        for (const StepProfile& p : m.profiles)
            print_profile("decode profile, batch " + std::to_string(p.batch) + ", " +
                              std::to_string(p.steps) + " steps",
                          p);
        if (o.profile && m.profiles.empty())
            std::printf("  decode profile: none (the %s backend cannot time its commands)\n",
                        r.backend.c_str());
        const TrainBench& t = r.train;
        if (t.measured) {
            char mfu[96] = "";
            if (t.mfu > 0)
                std::snprintf(mfu, sizeof mfu, ", MFU %.1f%% of %.0f TFLOP/s (%s)", 100 * t.mfu,
                              t.peak_tflops,
                              t.peak_from_spec ? "the device's published peak" : "--peak-tflops");
            char cpu[64] = "not checked: --no-train-check";
            if (t.cpu_loss) std::snprintf(cpu, sizeof cpu, "cpu %.6f", *t.cpu_loss);
            std::printf(
                "  training step (%s matmuls): %.0f tokens/s, %.2f model TFLOP/s%s, peak "
                "memory %s (the step's engine tensors %s); loss %.6f (%s)\n",
                to_string(t.precision), t.tokens_per_s, t.model_tflops, mfu,
                fmt_bytes(static_cast<double>(t.peak_bytes)).c_str(),
                fmt_bytes(t.engine_bytes).c_str(), t.loss, cpu);
            if (t.profile)
                print_profile("training profile, batch " + std::to_string(o.train_batch) + " x " +
                                  std::to_string(o.train_seq) + ", 1 step",
                              *t.profile);
        }
    }
}

nlohmann::json profile_json(const StepProfile& p) {
    nlohmann::json commands = nlohmann::json::array();
    for (const Backend::ProfiledCommands& c : p.commands)
        commands.push_back({{"name", c.name}, {"count", c.count}, {"seconds", c.seconds}});
    nlohmann::json j = {{"batch", p.batch},
                        {"steps", p.steps},
                        {"wall_seconds", p.wall_seconds},
                        {"commands", commands}};
    // The barriers over all the steps, where the backend counts them.
    if (p.barriers) j["barriers"] = *p.barriers;
    if (p.tokens > 0) j["tokens"] = p.tokens;  // the prefill's
    return j;
}

nlohmann::json to_json(const std::vector<BackendBench>& results, const std::string& model,
                       const BenchOptions& o) {
    nlohmann::json j = {{"model", model},
                        {"weights", to_string(o.weight_format)},
                        {"prompt_tokens", o.prompt_tokens},
                        {"decode_tokens", o.decode_tokens},
                        {"batch", o.batch},
                        {"repeats", o.repeats},
                        {"backends", nlohmann::json::array()}};
    for (const BackendBench& r : results) {
        nlohmann::json ops = nlohmann::json::array();
        for (const OpBench& op : r.ops) {
            if (!op.skipped.empty()) {
                ops.push_back({{"op", op.op}, {"shape", op.shape}, {"skipped", op.skipped}});
                continue;
            }
            ops.push_back({{"op", op.op},
                           {"shape", op.shape},
                           {"ms", op.ms},
                           {"launches", op.launches},
                           {"gflops", op.gflops},
                           {"gbytes_per_s", op.gbytes_per_s},
                           {"max_error_vs_cpu", op.max_error}});
        }
        const ModelBench& m = r.model;
        j["backends"].push_back({{"backend", r.backend},
                                 {"description", r.description},
                                 {"precision", to_string(r.precision)},
                                 {"ops", ops},
                                 {"prefill_tokens_per_s", m.prefill_tokens_per_s},
                                 {"decode_tokens_per_s", m.decode_tokens_per_s},
                                 {"batch_decode_tokens_per_s", m.batch_decode_tokens_per_s},
                                 {"logits_max_error_vs_cpu", m.logits_error},
                                 {"greedy_matching", m.greedy_matching},
                                 {"greedy_steps", m.greedy_steps}});
        if (m.prefill_profile)
            j["backends"].back()["prefill_profile"] = profile_json(*m.prefill_profile);
        for (const StepProfile& p : m.profiles)
            j["backends"].back()["decode_profiles"].push_back(profile_json(p));
        const TrainBench& t = r.train;
        if (t.measured)
            j["backends"].back()["train"] = {
                {"batch", o.train_batch},
                {"seq", o.train_seq},
                {"precision", to_string(t.precision)},
                {"tokens_per_s", t.tokens_per_s},
                {"model_tflops", t.model_tflops},
                // null without a peak: no MFU
                {"mfu", t.mfu > 0 ? nlohmann::json(t.mfu) : nlohmann::json(nullptr)},
                {"peak_tflops",
                 t.peak_tflops > 0 ? nlohmann::json(t.peak_tflops) : nlohmann::json(nullptr)},
                {"peak_source", t.peak_tflops <= 0 ? "none"
                                : t.peak_from_spec ? "spec"
                                                   : "flag"},
                {"peak_bytes", t.peak_bytes},
                {"engine_bytes", t.engine_bytes},
                {"loss", t.loss},
                {"cpu_loss", t.cpu_loss ? nlohmann::json(*t.cpu_loss) : nlohmann::json(nullptr)}};
        if (t.measured && t.profile)
            j["backends"].back()["train"]["profile"] = profile_json(*t.profile);
    }
    return j;
}

}  // namespace

void add_bench_command(CLI::App& app, CommonOptions& common) {
    struct Options {
        std::string model, config, backends;
        std::string precision = "auto";
        std::string weights = "auto";
        int device = -1;
        BenchOptions bench;
        bool json = false;
    };
    auto opts = std::make_shared<Options>();
    BenchOptions& b = opts->bench;
    CLI::App* sub = app.add_subcommand(
        "bench",
        "Backend comparison: per-op timings at the model's shapes, prefill and decode tokens/s, "
        "optionally a training step; each checked against the CPU backend");
    auto* model = sub->add_option("--model", opts->model, "Checkpoint directory to run");
    auto* config = sub->add_option("--config", opts->config,
                                   "Model config to run with random weights (default: "
                                   "tiny-mixtral)")
                       ->check(CLI::ExistingFile);
    model->excludes(config);
    sub->add_option("--backends", opts->backends,
                    "Comma-separated backends (default: every backend present)");
    sub->add_option("--device", opts->device,
                    "GPU index for the cuda and vulkan backends, as `tmx devices` lists them")
        ->check(in_range<int>(0));
    sub->add_option("--train-batch", b.train_batch,
                    "Also time training steps of this many sequences (with --train-seq), on the "
                    "backends that train")
        ->check(in_range<int64_t>(1));
    sub->add_option("--train-seq", b.train_seq, "Tokens per sequence of the training step")
        ->check(in_range<int64_t>(1));
    sub->add_flag_callback(
        "--no-train-check", [&b] { b.train_check = false; },
        "Do not check the training step's loss against an untimed CPU step on the same "
        "batch (minutes on the CPU at a GPU's batch sizes)");
    sub->add_option("--precision", opts->precision,
                    "Matmul and attention precision of every measurement (but --gemm's fp32): auto "
                    "(each backend's default: bf16 on CUDA, fp32 elsewhere), fp32 or bf16; each "
                    "backend is checked against the CPU in the same precision")
        ->check(CLI::IsMember({"auto", "fp32", "bf16"}))
        ->capture_default_str();
    sub->add_option("--weights", opts->weights,
                    "Format the prefill and decode models hold their weights in: auto (a "
                    "--model checkpoint's own format, as generate, eval and serve run it; f32 "
                    "with --config), f32, bf16, f16 or q8_0 (converted from the weights; every "
                    "backend holds every format)")
        ->capture_default_str();
    sub->add_option("--peak-tflops", b.peak_tflops,
                    "The GPU's peak TFLOP/s in the step's precision, for the training step's "
                    "MFU (default: the published dense peak of the NVIDIA GPUs tmx knows: H100, "
                    "H200, A100, L40S, L4, RTX 4090; e.g. bf16 on an H100 SXM 989, an L4 121)")
        ->check(CLI::PositiveNumber);
    sub->add_option("--prompt", b.prompt_tokens, "Prompt tokens for prefill (and op shapes)")
        ->check(in_range<int64_t>(1))
        ->capture_default_str();
    sub->add_option("--decode", b.decode_tokens, "Decode steps timed")
        ->check(in_range<int64_t>(1))
        ->capture_default_str();
    sub->add_option("--batch", b.batch, "Sequences in the batch-N decode")
        ->check(in_range<int64_t>(1))
        ->capture_default_str();
    sub->add_option("--gemm", b.gemm,
                    "Also time an fp32 N x N x N matmul (e.g. 8192, against a GPU's fp32 peak)")
        ->check(in_range<int64_t>(1));
    sub->add_option("--repeats", b.repeats,
                    "Timed repetitions (the median is reported; an op's repetition is a batch of "
                    "back-to-back launches lasting about 2 ms)")
        ->check(in_range<int>(1))
        ->capture_default_str();
    sub->add_option("--warmup", b.warmup, "Untimed runs first")
        ->check(in_range<int>(0))
        ->capture_default_str();
    sub->add_option("--warm-seconds", b.warm_seconds,
                    "Before measuring on a backend other than the CPU, this long of matrix "
                    "products, so that an idle GPU's clocks are up (0: none)")
        ->check(CLI::Range(0.0, 600.0))
        ->capture_default_str();
    sub->add_option("--seed", b.seed, "Seed of the inputs (and of random weights)")
        ->check(in_range<uint64_t>(0))
        ->capture_default_str();
    sub->add_flag("--profile", b.profile,
                  "Also profile the prompt's prefill, the batch-1 and batch-N decode steps, and "
                  "one training step with --train-batch: device time per shader (Vulkan: "
                  "timestamps after every command; other backends are not profiled)");
    sub->add_flag("--json", opts->json, "Print one JSON object instead of the table");
    add_common_options(*sub, common);

    sub->callback([opts]() {
        BenchOptions o = opts->bench;
        if (opts->precision != "auto")
            o.precision = parse_precision(opts->precision, "--precision");
        o.weight_format = opts->weights != "auto" ? parse_weight_format(opts->weights, "--weights")
                          : !opts->model.empty()  ? checkpoint_weight_format(opts->model)
                                                  : DType::F32;
        o.backends = opts->backends.empty() ? present_backends() : split_names(opts->backends);
        if (opts->device >= 0)
            for (std::string& name : o.backends)
                if (backend_takes_device(name)) name = with_device(name, opts->device);
        o.open_backend = [](const std::string& name) { return make_backend(name); };
        o.progress = [](const std::string& what) {
            std::fprintf(stderr, "bench: %s\n", what.c_str());
        };
        ModelConfig config;  // tiny-mixtral
        std::string described = "tiny-mixtral (random weights)";
        std::vector<float> weights;
        if (!opts->model.empty()) {
            auto cpu = make_backend("cpu");
            auto m = load_model(opts->model, *cpu, DType::F32);
            config = m->config();
            weights = m->params_to_host();
            described = opts->model;
        } else if (!opts->config.empty()) {
            config = load_config(opts->config);
            described = opts->config + " (random weights)";
        }
        const std::vector<BackendBench> results = run_bench(config, std::move(weights), o);
        if (opts->json)
            std::printf("%s\n", to_json(results, described, o).dump().c_str());
        else
            print_table(results, described, o);
    });
}

}  // namespace tmx::cli

// tmx tune: measures the shapes of a GPU backend's matmul and attention kernels on this
// device at a model's real shapes (engine/report/tune.h) and saves the fastest that match the
// CPU as the device's tuning, which the backend loads whenever it starts there.
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "apps/commands.h"
#include "backends/registry.h"
#include "engine/core/errors.h"
#include "engine/model/checkpoint.h"
#include "engine/model/config.h"
#include "engine/report/tune.h"

namespace tmx::cli {
namespace {

nlohmann::json to_json(const TuneReport& r, const std::string& model, const std::string& backend) {
    nlohmann::json shapes = nlohmann::json::array();
    for (const TunedShapeReport& s : r.shapes) {
        nlohmann::json tried = nlohmann::json::array();
        for (const auto& t : s.tried)
            tried.push_back({{"variant", t.variant},
                             {"ms", t.rejected ? nlohmann::json(nullptr) : nlohmann::json(t.ms)},
                             {"error", t.error},
                             {"rejected", t.rejected}});
        shapes.push_back({{"kernel", s.call.kernel},
                          {"shape", s.call.key},
                          {"rows", s.call.rows},
                          {"n", s.call.n},
                          {"k", s.call.k},
                          {"experts", s.call.experts},
                          {"best", s.best},
                          {"best_ms", s.best_ms},
                          {"default", s.default_variant},
                          {"default_ms", s.default_ms},
                          {"speedup", s.best_ms > 0 ? s.default_ms / s.best_ms : 0.0},
                          {"tolerance", s.tolerance},
                          {"tried", tried}});
    }
    return {{"model", model},
            {"backend", backend},
            {"saved_to", r.saved_to.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.saved_to)},
            {"shapes", shapes}};
}

void print_table(const TuneReport& r, const std::string& model, const std::string& backend) {
    std::printf("tune: %s on %s\n\n", model.c_str(), backend.c_str());
    int width = 5;  // the longest shape
    for (const TunedShapeReport& s : r.shapes)
        width = std::max(width, static_cast<int>(s.call.key.size()));
    std::printf("%-*s %6s  %-24s %9s  %-24s %9s %8s\n", width, "shape", "tried", "best", "ms",
                "default", "ms", "speedup");
    double best_total = 0, default_total = 0;
    for (const TunedShapeReport& s : r.shapes) {
        int ok = 0;
        for (const auto& t : s.tried) ok += t.rejected ? 0 : 1;
        const std::string tried = std::to_string(ok) + "/" + std::to_string(s.tried.size());
        std::printf("%-*s %6s  %-24s %9.4f  %-24s %9.4f %7.2fx\n", width, s.call.key.c_str(),
                    tried.c_str(), s.best.c_str(), s.best_ms, s.default_variant.c_str(),
                    s.default_ms, s.best_ms > 0 ? s.default_ms / s.best_ms : 0.0);
        best_total += s.best_ms;
        default_total += s.default_ms;
    }
    std::printf("\n%zu shapes: %.3f ms tuned against %.3f ms by default, one call each (%.2fx)\n",
                r.shapes.size(), best_total, default_total,
                best_total > 0 ? default_total / best_total : 0.0);
    if (!r.saved_to.empty())
        std::printf("saved to %s (used whenever this backend starts on this device)\n",
                    r.saved_to.c_str());
    else
        std::printf("not saved (--no-save)\n");
}

}  // namespace

void add_tune_command(CLI::App& app, CommonOptions& common) {
    struct Options {
        std::string model, config;
        std::string backend = "vulkan";
        int device = -1;
        bool train = true, json = false;
        TuneOptions tune;
    };
    auto opts = std::make_shared<Options>();
    TuneOptions& t = opts->tune;
    t.train_batch = 8;
    t.train_seq = 512;
    CLI::App* sub = app.add_subcommand(
        "tune",
        "Measures every shape (tile, workgroup, register block) of the GPU backend's matmul and "
        "attention kernels at a model's real shapes on this device, keeps the fastest "
        "that match the CPU, and saves them as this device's tuning (used whenever the backend "
        "starts here)");
    auto* model =
        sub->add_option("--model", opts->model, "Checkpoint directory whose shapes to tune");
    auto* config = sub->add_option("--config", opts->config,
                                   "Model config whose shapes to tune (default: tiny-mixtral)")
                       ->check(CLI::ExistingFile);
    model->excludes(config);
    sub->add_option("--backend", opts->backend, "The backend to tune: vulkan")
        ->check(CLI::IsMember({"vulkan"}))
        ->capture_default_str();
    sub->add_option("--device", opts->device, "GPU index, as `tmx devices` lists them")
        ->check(in_range<int>(0));
    sub->add_option("--prompt", t.prompt_tokens,
                    "Prompt tokens of the prefill whose shapes are tuned")
        ->check(in_range<int64_t>(1))
        ->capture_default_str();
    sub->add_option("--batch", t.batch, "Sequences of the batch-N decode whose shapes are tuned")
        ->check(in_range<int64_t>(1))
        ->capture_default_str();
    sub->add_option("--train-batch", t.train_batch,
                    "Sequences of the training step whose shapes are tuned")
        ->check(in_range<int64_t>(1))
        ->capture_default_str();
    sub->add_option("--train-seq", t.train_seq, "Tokens per sequence of that training step")
        ->check(in_range<int64_t>(1))
        ->capture_default_str();
    sub->add_option("--gemm", t.gemm,
                    "Also tune the fp32 N x N x N matmul that `tmx bench --gemm N` times")
        ->check(in_range<int64_t>(1, 65536));
    sub->add_flag_callback(
        "--no-train", [opts] { opts->train = false; },
        "Tune inference shapes only (no training step)");
    sub->add_option("--repeats", t.repeats, "Timed batches per variant (the median is kept)")
        ->check(in_range<int>(1))
        ->capture_default_str();
    sub->add_option("--min-ms", t.min_ms,
                    "Each timed batch repeats its launch until it lasts about this long")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    sub->add_option("--seed", t.seed, "Seed of the random weights and inputs")
        ->check(in_range<uint64_t>(0))
        ->capture_default_str();
    sub->add_flag_callback(
        "--no-save", [opts] { opts->tune.save = false; },
        "Measure and report, but keep the device's tuning as it is");
    sub->add_flag("--json", opts->json, "Print one JSON object instead of the table");
    add_common_options(*sub, common);

    sub->callback([opts]() {
        TuneOptions o = opts->tune;
        if (!opts->train) o.train_batch = o.train_seq = 0;
        o.progress = [](const std::string& what) {
            std::fprintf(stderr, "tune: %s\n", what.c_str());
        };
        ModelConfig config;  // tiny-mixtral
        std::string described = "tiny-mixtral";
        if (!opts->model.empty()) {
            config = load_checkpoint_config(opts->model);
            described = opts->model;
        } else if (!opts->config.empty()) {
            config = load_config(opts->config);
            described = opts->config;
        }
        const std::string name = with_device(opts->backend, opts->device);
        std::unique_ptr<Backend> be = make_backend(name);
        std::unique_ptr<Backend> cpu = make_backend("cpu");
        std::fprintf(stderr, "tune: %s\n", be->description().c_str());
        const TuneReport r = tune_kernels(config, *be, *cpu, o);
        if (opts->json)
            std::printf("%s\n", to_json(r, described, be->description()).dump().c_str());
        else
            print_table(r, described, be->description());
    });
}

}  // namespace tmx::cli

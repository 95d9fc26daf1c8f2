// tmx init: write a freshly initialised checkpoint.
#include <cstdio>

#include "apps/commands.h"
#include "backends/registry.h"
#include "engine/compute/backend.h"
#include "engine/model/checkpoint.h"
#include "engine/model/model.h"

namespace tmx::cli {

void add_init_command(CLI::App& app, CommonOptions& common) {
    struct Options {
        std::string config, out, tokenizer, dtype = "f32";
        uint64_t seed = 0;
        bool force = false;
    };
    auto opts = std::make_shared<Options>();
    CLI::App* sub = app.add_subcommand("init", "Write a freshly initialised checkpoint directory");
    sub->add_option("--config", opts->config, "Model config (native JSON)")
        ->required()
        ->check(CLI::ExistingFile);
    sub->add_option("--out", opts->out, "Checkpoint directory to write")->required();
    sub->add_option("--seed", opts->seed, "Initialisation seed")
        ->check(in_range<uint64_t>(0))
        ->capture_default_str();
    sub->add_option("--tokenizer", opts->tokenizer,
                    "SentencePiece model to copy into the checkpoint as tokenizer.model")
        ->check(CLI::ExistingFile);
    sub->add_option("--dtype", opts->dtype, "Weight storage: f32 or bf16")
        ->check(CLI::IsMember({"f32", "bf16"}))
        ->capture_default_str();
    sub->add_flag("--force", opts->force, "Replace an existing checkpoint in --out");
    add_common_options(*sub, common);
    sub->callback([opts]() {
        ModelConfig config = load_config(opts->config);
        auto backend = make_backend("cpu");
        Model model(config, *backend);
        model.init_random(opts->seed);
        CheckpointWriteOptions w;
        w.dtype = parse_storage_type(opts->dtype);
        w.tokenizer_path = opts->tokenizer;
        w.overwrite = opts->force;
        save_checkpoint(model, opts->out, w);
        std::printf("wrote %s: %lld parameters, %s, seed %llu%s\n", opts->out.c_str(),
                    static_cast<long long>(model.num_params()), to_string(w.dtype),
                    static_cast<unsigned long long>(opts->seed),
                    opts->tokenizer.empty() ? "" : ", with tokenizer");
    });
}

}  // namespace tmx::cli

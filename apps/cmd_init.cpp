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
        std::string config, tokenizer;
        CheckpointOutOptions dest{"", "f32"};
        uint64_t seed = 0;
    };
    auto opts = std::make_shared<Options>();
    CLI::App* sub = app.add_subcommand("init", "Write a freshly initialised checkpoint directory");
    sub->add_option("--config", opts->config, "Model config (native JSON)")
        ->required()
        ->check(CLI::ExistingFile);
    add_checkpoint_out_options(*sub, opts->dest);
    sub->add_option("--seed", opts->seed, "Initialisation seed")
        ->check(in_range<uint64_t>(0))
        ->capture_default_str();
    sub->add_option(
           "--tokenizer", opts->tokenizer,
           "Tokenizer to copy into the checkpoint: a SentencePiece .model file (as "
           "tokenizer.model) or a tokenizer.json (with the tokenizer_config.json beside it)")
        ->check(CLI::ExistingFile);
    add_common_options(*sub, common);
    sub->callback([opts]() {
        ModelConfig config = load_config(opts->config);
        auto backend = make_backend("cpu");
        Model model(config, *backend);
        model.init_random(opts->seed);
        CheckpointWriteOptions w;
        w.dtype = parse_storage_type(opts->dest.dtype);
        w.tokenizer_path = opts->tokenizer;
        w.overwrite = opts->dest.force;
        save_checkpoint(model, opts->dest.out, w);
        std::printf("wrote %s: %lld parameters, %s, seed %llu%s\n", opts->dest.out.c_str(),
                    static_cast<long long>(model.num_params()), to_string(w.dtype),
                    static_cast<unsigned long long>(opts->seed),
                    opts->tokenizer.empty() ? "" : ", with tokenizer");
    });
}

}  // namespace tmx::cli

// tmx convert: re-save a checkpoint's weights in another format (bf16, f16 or q8_0 to run and
// ship in less memory, or back to f32), without training state.
#include <cstdio>

#include "apps/commands.h"
#include "backends/registry.h"
#include "engine/model/checkpoint.h"

namespace tmx::cli {

void add_convert_command(CLI::App& app, CommonOptions& common) {
    struct Options {
        std::string model;
        CheckpointOutOptions dest{"", "bf16"};
    };
    auto o = std::make_shared<Options>();
    CLI::App* sub = app.add_subcommand(
        "convert",
        "Re-save a checkpoint's weights as f32, bf16, f16 or q8_0 (drops optimizer state)");
    sub->add_option("--model", o->model, "Checkpoint directory to read")->required();
    add_checkpoint_out_options(*sub, o->dest);
    add_common_options(*sub, common);
    sub->callback([o]() {
        auto backend = make_backend("cpu");
        auto model = load_model(o->model, *backend, DType::F32);
        CheckpointWriteOptions w;
        w.dtype = parse_storage_type(o->dest.dtype);
        w.tokenizer_path = checkpoint_tokenizer(o->model);
        w.overwrite = o->dest.force;
        save_checkpoint(*model, o->dest.out, w);
        std::printf("wrote %s: %lld parameters, %s%s\n", o->dest.out.c_str(),
                    static_cast<long long>(model->num_params()), to_string(w.dtype),
                    w.tokenizer_path.empty() ? "" : ", with tokenizer");
    });
}

}  // namespace tmx::cli

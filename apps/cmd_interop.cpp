// tmx export and tmx import: checkpoints to and from Hugging Face directories and GGUF files
// (engine/interop).
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "apps/commands.h"
#include "engine/core/errors.h"
#include "engine/core/format.h"
#include "engine/interop/gguf_model.h"
#include "engine/interop/interop.h"

namespace tmx::cli {

namespace {

// Progress on stderr, once a second, from the second second on (short conversions stay quiet).
interop::ProgressFn stderr_progress(const char* verb) {
    const auto start = std::chrono::steady_clock::now();
    auto last = std::make_shared<double>(0.0);
    return [verb, start, last](const interop::Progress& p) {
        const double t =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        const bool done = p.tensors_done == p.tensors_total;
        if (t < 1.0 || (t - *last < 1.0 && !done)) return;
        *last = t;
        std::fprintf(stderr, "%s: %lld/%lld tensors, %s of %s, %.0f s\n", verb,
                     static_cast<long long>(p.tensors_done),
                     static_cast<long long>(p.tensors_total), fmt_bytes(p.bytes_done).c_str(),
                     fmt_bytes(p.bytes_total).c_str(), t);
    };
}

}  // namespace

void add_export_command(CLI::App& app, CommonOptions& common) {
    struct Options {
        std::string model, format, out, dtype = "f32", shard_size = "5GB";
        bool force = false, quiet = false;
    };
    auto o = std::make_shared<Options>();
    CLI::App* sub = app.add_subcommand(
        "export", "Write a checkpoint as a Hugging Face model directory or a GGUF file");
    sub->add_option("--model", o->model, "Checkpoint directory to read")->required();
    sub->add_option("--format", o->format, "hf (transformers) or gguf (llama.cpp)")
        ->required()
        ->check(CLI::IsMember({"hf", "gguf"}));
    sub->add_option("--out", o->out, "Directory (hf) or .gguf file (gguf) to write")->required();
    sub->add_option("--dtype", o->dtype, "Weights: f32, bf16, f16; q8_0 for gguf")
        ->check(CLI::IsMember({"f32", "bf16", "f16", "q8_0"}))
        ->capture_default_str();
    sub->add_option("--shard-size", o->shard_size,
                    "hf: most bytes per safetensors file (e.g. 5GB, 500MB, 2GiB)")
        ->capture_default_str();
    sub->add_flag("--force", o->force, "Replace an existing export in --out");
    sub->add_flag("--quiet", o->quiet, "No progress on stderr");
    add_common_options(*sub, common);
    sub->callback([o]() {
        const interop::ProgressFn progress = o->quiet ? nullptr : stderr_progress("export");
        if (o->format == "hf") {
            interop::HfExportOptions h;
            if (o->dtype == "q8_0")
                throw UsageError(
                    "--dtype: q8_0 is a GGUF type; Hugging Face export writes "
                    "f32, bf16 or f16");
            h.dtype = o->dtype == "f16" ? StorageType::F16 : parse_storage_type(o->dtype);
            h.shard_bytes = interop::parse_byte_size(o->shard_size, "--shard-size");
            h.overwrite = o->force;
            h.progress = progress;
            const interop::HfExportReport r = interop::export_hf(o->model, o->out, h);
            std::printf("wrote %s: %s, %lld tensors in %d file%s (%s, %s)%s\n", o->out.c_str(),
                        r.architecture.c_str(), static_cast<long long>(r.tensors), r.shards,
                        r.shards == 1 ? "" : "s", fmt_bytes(r.bytes).c_str(), o->dtype.c_str(),
                        !r.tokenizer ? ", no tokenizer (none in the checkpoint)"
                        : r.tokenizer_json_skipped.empty()
                            ? ", with tokenizer (tokenizer.model, tokenizer.json)"
                            : ", with tokenizer (tokenizer.model only)");
            if (!r.tokenizer_json_skipped.empty())
                std::fprintf(stderr,
                             "warning: no tokenizer.json written: %s. Hugging Face's libraries "
                             "will convert tokenizer.model themselves, which may tokenize "
                             "differently\n",
                             r.tokenizer_json_skipped.c_str());
            return;
        }
        interop::GgufExportOptions g;
        g.dtype = interop::parse_gguf_dtype(o->dtype, "--dtype");
        g.overwrite = o->force;
        g.progress = progress;
        const interop::GgufExportReport r = interop::export_gguf(o->model, o->out, g);
        std::printf("wrote %s: GGUF v3, llama architecture, %lld tensors (%s, %s)\n",
                    o->out.c_str(), static_cast<long long>(r.tensors), fmt_bytes(r.bytes).c_str(),
                    o->dtype.c_str());
    });
}

void add_import_command(CLI::App& app, CommonOptions& common) {
    struct Options {
        std::string from, out, dtype = "auto";
        bool force = false, quiet = false;
    };
    auto o = std::make_shared<Options>();
    CLI::App* sub = app.add_subcommand(
        "import", "Make a checkpoint from a Hugging Face model directory or a GGUF file");
    sub->add_option("--from", o->from,
                    "Hugging Face directory (llama, mistral, mixtral) or .gguf file")
        ->required();
    sub->add_option("--out", o->out, "Checkpoint directory to write")->required();
    sub->add_option("--dtype", o->dtype,
                    "Weight storage: auto (the source's own: f32, bf16, f16 or q8_0), f32, bf16, "
                    "f16 or q8_0 (norms, biases and the router stay f32)")
        ->check(CLI::IsMember({"auto", "f32", "bf16", "f16", "q8_0"}))
        ->capture_default_str();
    sub->add_flag("--force", o->force, "Replace an existing checkpoint in --out");
    sub->add_flag("--quiet", o->quiet, "No progress on stderr");
    add_common_options(*sub, common);
    sub->callback([o]() {
        interop::ImportOptions opts;
        if (o->dtype != "auto") opts.dtype = parse_storage_type(o->dtype);
        opts.overwrite = o->force;
        if (!o->quiet) opts.progress = stderr_progress("import");
        const interop::ImportReport r = std::filesystem::is_directory(o->from)
                                            ? interop::import_hf(o->from, o->out, opts)
                                            : interop::import_gguf(o->from, o->out, opts);
        std::printf("wrote %s: %s model, %s parameters, %s\n", o->out.c_str(),
                    r.source_kind.c_str(), with_thousands(r.params).c_str(),
                    to_string(storage_dtype(r.dtype)));
    });
}

}  // namespace tmx::cli

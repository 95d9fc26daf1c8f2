// tmx import --from HF_DIR: a Hugging Face llama / mistral / mixtral directory as a native
// checkpoint. The config goes through engine_config_for, the mapping `tmx params` uses.
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <vector>

#include "engine/core/errors.h"
#include "engine/core/file_io.h"
#include "engine/core/json_fields.h"
#include "engine/data/tokenizer.h"
#include "engine/interop/hf_weights.h"
#include "engine/interop/interop.h"
#include "engine/model/checkpoint.h"
#include "engine/model/model.h"
#include "engine/report/param_report.h"

namespace tmx::interop {

namespace fs = std::filesystem;
using nlohmann::json;

HfWeights::HfWeights(const std::string& dir_str) {
    const fs::path dir(dir_str);
    const fs::path index = dir / "model.safetensors.index.json";
    const fs::path single = dir / "model.safetensors";
    if (fs::exists(index)) {
        read_index(dir_str, index.string());
    } else if (fs::exists(single)) {
        auto file = std::make_shared<SafetensorsFile>(single.string());
        for (const auto& [name, _] : file->entries()) where_[name] = file;
    } else {
        throw Error(dir.string() +
                    ": no model.safetensors or model.safetensors.index.json (only safetensors "
                    "weights are imported, not pytorch_model.bin)");
    }
}

void HfWeights::read_index(const std::string& dir_str, const std::string& path) {
    const fs::path dir(dir_str);
    const json j = json_fields::parse_unique_keys(read_file(path), path);
    const json_fields::Fields f(j, path);
    const json& map = f.at("weight_map", "an object of tensor name -> file");
    if (!map.is_object())
        json_fields::fail(
            path, "weight_map",
            "expected an object of tensor name -> file, got " + json_fields::describe(map));
    std::map<std::string, std::shared_ptr<SafetensorsFile>> files;
    for (const auto& [name, value] : map.items()) {
        const std::string field = "weight_map." + name;
        const std::string file = json_fields::as_string(value, path, field);
        // A shard is a file beside the index, never a path elsewhere.
        if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..")
            json_fields::fail(path, field,
                              "expected a file name in the same directory, got \"" + file + "\"");
        auto& opened = files[file];
        if (!opened) {
            if (!fs::exists(dir / file))
                json_fields::fail(path, field, "names " + file + ", which does not exist");
            opened = std::make_shared<SafetensorsFile>((dir / file).string());
        }
        if (!opened->entries().count(name))
            json_fields::fail(path, field,
                              "names " + file + ", which has no tensor '" + name + "'");
        where_[name] = opened;
    }
    // A tensor in a shard that the index places elsewhere (two tensors of one name) or
    // nowhere (one the index hides) is an error.
    for (const auto& [file, opened] : files)
        for (const auto& [name, _] : opened->entries()) {
            auto it = where_.find(name);
            if (it == where_.end())
                throw Error(opened->path() + ": tensor '" + name + "' is not in " + path);
            if (it->second != opened)
                throw Error(opened->path() + ": tensor '" + name + "' is also in " +
                            it->second->path() + ", where the index places it");
        }
}

namespace {

// Tensors a checkpoint may carry that the model does not use: rotary tables that older Llama
// checkpoints saved, and lm_head.weight when it is tied to the embedding.
bool ignorable(const std::string& name, const ModelConfig& c) {
    if (name.ends_with(".rotary_emb.inv_freq")) return true;
    return c.tie_embeddings && name == "lm_head.weight";
}

}  // namespace

ImportReport import_hf(const std::string& hf_dir, const std::string& checkpoint,
                       const ImportOptions& options) {
    const fs::path dir(hf_dir);
    if (!fs::is_directory(dir)) throw Error(hf_dir + ": no such directory");
    const std::string config_path = (dir / "config.json").string();
    if (!fs::exists(config_path))
        throw Error(hf_dir + ": no config.json (not a Hugging Face model)");
    const json cfg = json_fields::parse_unique_keys(read_file(config_path), config_path);
    if (!cfg.is_object() || !cfg.contains("model_type") || !cfg.at("model_type").is_string())
        throw Error(config_path +
                    ": field 'model_type' is missing (not a Hugging Face config; tmx "
                    "checkpoints need no import)");
    std::string why_not;
    const std::optional<ModelConfig> config = engine_config_for(cfg, config_path, &why_not);
    if (!config) throw Error(config_path + ": cannot import: " + why_not);

    // tokenizer.model where there is one (SentencePiece, as the model was trained with), else
    // tokenizer.json; with the tokenizer_config.json beside it (tokenizer_files).
    const std::string tok_path = checkpoint_tokenizer(dir.string());
    if (tok_path.empty())
        throw Error(hf_dir +
                    ": no tokenizer.model or tokenizer.json (a model without its "
                    "tokenizer cannot read or write text)");
    const Tokenizer tok = Tokenizer::load(tok_path);
    if (tok.vocab_size() > config->vocab_size)
        throw Error(tok_path + ": " + std::to_string(tok.vocab_size()) +
                    " pieces, more than the model's vocab_size " +
                    std::to_string(config->vocab_size));

    const HfWeights weights(dir);
    const std::vector<ParamSpec> specs = model_param_specs(*config);
    std::set<std::string> used;
    for (const auto& s : specs) {
        const std::string name = hf_tensor_name(s.name);
        auto it = weights.tensors().find(name);
        if (it == weights.tensors().end())
            throw Error(hf_dir + ": missing tensor '" + name + "' (the config needs it)");
        const SafetensorsEntry& e = it->second->entry(name);
        if (e.shape != s.shape)
            throw Error(it->second->path() + ": tensor '" + name + "' has shape " +
                        shape_string(e.shape) + ", but config.json needs " + shape_string(s.shape));
        used.insert(name);
    }
    for (const auto& [name, file] : weights.tensors())
        if (!used.count(name) && !ignorable(name, *config))
            throw Error(file->path() + ": unexpected tensor '" + name +
                        "' (config.json describes no such weight)");

    CheckpointWriteOptions w;
    const std::string q_name = hf_tensor_name("model.layers.0.self_attn.q_proj.weight");
    const StorageType source = weights.tensors().at(q_name)->entry(q_name).dtype;
    w.dtype = options.dtype.value_or(source == StorageType::F64 ? StorageType::F32 : source);
    w.tokenizer_path = tok_path;
    w.overwrite = options.overwrite;
    Progress progress{0, static_cast<int64_t>(specs.size()), 0, 0};
    for (const auto& s : specs)
        progress.bytes_total +=
            static_cast<uint64_t>(shape_numel(s.shape)) * (w.dtype == StorageType::F32 ? 4 : 2);
    write_checkpoint(*config, checkpoint, w, [&](const ParamSpec& spec, float* out) {
        const std::string name = hf_tensor_name(spec.name);
        const SafetensorsFile& file = *weights.tensors().at(name);
        file.read_f32(name, out);
        check_finite_tensor(file.path(), name, spec.shape, out, "weights");
        ++progress.tensors_done;
        progress.bytes_done +=
            static_cast<uint64_t>(shape_numel(spec.shape)) * (w.dtype == StorageType::F32 ? 4 : 2);
        if (options.progress) options.progress(progress);
    });
    ImportReport report;
    report.config = *config;
    report.source_kind = "Hugging Face " + cfg.at("model_type").get<std::string>();
    report.dtype = w.dtype;
    report.params = param_count(*config, config_path);
    return report;
}

}  // namespace tmx::interop

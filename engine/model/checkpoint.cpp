#include "engine/model/checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/core/errors.h"
#include "engine/core/file_io.h"

namespace tmx {
namespace fs = std::filesystem;

namespace {

// Index of the first NaN or infinity in data[0, n), or -1. Branch-free over blocks, so that
// the pass over a whole model costs little next to reading it.
int64_t first_non_finite(const float* data, int64_t n) {
    constexpr int64_t kBlock = 4096;
    for (int64_t start = 0; start < n; start += kBlock) {
        const int64_t end = std::min(n, start + kBlock);
        bool all_finite = true;
        for (int64_t i = start; i < end; ++i) all_finite &= std::isfinite(data[i]);
        if (all_finite) continue;
        for (int64_t i = start; i < end; ++i)
            if (!std::isfinite(data[i])) return i;
    }
    return -1;
}

}  // namespace

void check_finite_tensor(const std::string& path, const std::string& name, const Shape& shape,
                         const float* data, const char* what) {
    const int64_t i = first_non_finite(data, shape_numel(shape));
    if (i >= 0)
        throw Error(path + ": tensor '" + name + "' holds " +
                    (std::isnan(data[i]) ? "NaN" : "infinity") + " at element " +
                    std::to_string(i) + " of " + shape_string(shape) + " (" + what +
                    " must be finite)");
}

void write_checkpoint(const ModelConfig& config, const std::string& dir_str,
                      const CheckpointWriteOptions& options, const TensorSource& weights) {
    fs::path dir = fs::absolute(dir_str).lexically_normal();
    if (dir.filename().empty()) dir = dir.parent_path();  // "ckpt/" names the same directory
    if (fs::exists(dir)) {
        if (!fs::is_directory(dir)) throw Error(dir_str + ": exists and is not a directory");
        const bool empty = fs::is_empty(dir);
        if (!empty && !fs::exists(dir / "config.json"))
            throw Error(dir_str +
                        ": exists and is not a checkpoint directory; refusing to replace it");
        if (!empty && !options.overwrite)
            throw Error(dir_str + ": a checkpoint already exists there (use " + opt("overwrite") +
                        " to replace it)");
    }
    // The tokenizer's files, read before anything is written.
    std::vector<std::pair<std::string, std::string>> tokenizer;  // name, bytes
    if (!options.tokenizer_path.empty()) {
        for (const auto& [name, source] : tokenizer_files(options.tokenizer_path))
            tokenizer.emplace_back(name, read_file(source));
    } else if (!options.tokenizer_model.empty()) {
        tokenizer.emplace_back("tokenizer.model", options.tokenizer_model);
    }

    fs::create_directories(dir.parent_path());
    const fs::path tmp = dir.string() + ".tmp-" + std::to_string(::getpid());
    fs::remove_all(tmp);
    fs::create_directory(tmp);
    try {
        nlohmann::json cfg = config_to_json(config);
        cfg["format_version"] = kCheckpointFormatVersion;
        write_file_atomic((tmp / "config.json").string(), cfg.dump(2) + "\n");

        // Data in name order, as checkpoints have always been written.
        std::vector<ParamSpec> specs = model_param_specs(config);
        std::sort(specs.begin(), specs.end(),
                  [](const ParamSpec& a, const ParamSpec& b) { return a.name < b.name; });
        // Each tensor as a model with weights in that format stores it (stored_dtype): the
        // norms, biases and router stay F32.
        std::vector<SafetensorsEntryPlan> plan;
        for (const auto& s : specs)
            plan.push_back(
                {s.name, s.shape, storage_of(stored_dtype(s, storage_dtype(options.dtype)))});
        SafetensorsWriter writer((tmp / "model.safetensors").string(), plan);
        std::vector<float> buffer;
        for (const auto& s : specs) {
            buffer.resize(static_cast<size_t>(shape_numel(s.shape)));
            weights(s, buffer.data());
            writer.write_next(buffer.data());
        }
        writer.finish();
        for (const auto& [name, bytes] : tokenizer) write_file_atomic((tmp / name).string(), bytes);
        for (const auto& [name, bytes] : options.extra_files)
            write_file_atomic((tmp / name).string(), bytes);
        // No fallback where the filesystem cannot exchange directories: a checkpoint is
        // replaced atomically or not at all.
        const std::string previous =
            replace_directory(tmp.string(), dir.string(), "checkpoint", WithoutExchange::Fail);
        if (!previous.empty()) fs::remove_all(previous);  // the old checkpoint; throws on failure
    } catch (...) {
        std::error_code ec;
        fs::remove_all(tmp, ec);
        throw;
    }
}

void save_checkpoint(const Model& model, const std::string& dir,
                     const CheckpointWriteOptions& options) {
    const std::vector<float> host = model.params_to_host();
    const ParamLayout& layout = model.layout();
    write_checkpoint(model.config(), dir, options, [&](const ParamSpec& spec, float* out) {
        const ParamSpec* s = layout.find(spec.name);
        std::copy_n(host.data() + s->offset, shape_numel(s->shape), out);
    });
}

ModelConfig load_checkpoint_config(const std::string& dir) {
    if (!fs::is_directory(dir)) throw Error(dir + ": no such checkpoint directory");
    return load_config((fs::path(dir) / "config.json").string());
}

void load_checkpoint_weights(Model& model, const std::string& dir) {
    const std::string path = (fs::path(dir) / "model.safetensors").string();
    if (!fs::exists(path)) throw Error(path + ": missing (a checkpoint needs model.safetensors)");
    SafetensorsFile file(path);
    const ParamLayout& layout = model.layout();
    std::vector<std::string> missing;
    for (const auto& s : layout.specs) {
        auto it = file.entries().find(s.name);
        if (it == file.entries().end()) {
            missing.push_back(s.name);
            continue;
        }
        if (it->second.shape != s.shape)
            throw Error(path + ": tensor '" + s.name + "' has shape " +
                        shape_string(it->second.shape) + ", but the config needs " +
                        shape_string(s.shape));
    }
    if (!missing.empty())
        throw Error(path + ": missing tensor '" + missing.front() + "'" +
                    (missing.size() > 1 ? " and " + std::to_string(missing.size() - 1) + " more"
                                        : std::string()));
    for (const auto& [name, entry] : file.entries())
        if (!layout.find(name))
            throw Error(path + ": unexpected tensor '" + name + "' (not part of this config" +
                        (name == "lm_head.weight" ? ": tie_embeddings is true)" : ")"));
    // Tensor by tensor, so that memory stays near the model's own: each is checked in fp32, and
    // stored as the file holds it where the model keeps that dtype (no rounding twice).
    std::vector<float> values;
    std::vector<std::byte> raw;
    for (const auto& s : layout.specs) {
        values.resize(static_cast<size_t>(s.numel()));
        const DType stored = model.param(s.name).dtype();
        const bool as_stored =
            stored != DType::F32 && stored == storage_dtype(file.entry(s.name).dtype);
        if (as_stored) {
            raw.resize(static_cast<size_t>(dtype_bytes(stored, s.numel())));
            file.read_raw(s.name, raw.data());
            decode_weights(stored, raw.data(), s.numel(), values.data());  // for the check
        } else {
            file.read_f32(s.name, values.data());
        }
        check_finite_tensor(path, s.name, s.shape, values.data(), "weights");
        if (as_stored)
            model.set_param(s.name, stored, raw.data());
        else
            model.set_param(s.name, DType::F32, values.data());
    }
}

DType checkpoint_weight_format(const std::string& dir) {
    if (!fs::is_directory(dir)) throw Error(dir + ": no such checkpoint directory");
    const std::string path = (fs::path(dir) / "model.safetensors").string();
    if (!fs::exists(path)) throw Error(path + ": missing (a checkpoint needs model.safetensors)");
    SafetensorsFile file(path);
    // The format of the weights: that of the first layer's query projection (every config has
    // one), as a model in the format would store it.
    return storage_dtype(file.entry("model.layers.0.self_attn.q_proj.weight").dtype);
}

std::unique_ptr<Model> load_model(const std::string& dir, Backend& backend,
                                  std::optional<DType> weight_format) {
    const ModelConfig config = load_checkpoint_config(dir);  // a missing config.json first
    DType format = weight_format.value_or(DType::F32);
    if (!weight_format) {
        format = checkpoint_weight_format(dir);
        if (!backend.supports_weight_format(format)) format = DType::F32;
    }
    auto model = std::make_unique<Model>(config, backend, format);
    load_checkpoint_weights(*model, dir);
    return model;
}

std::string checkpoint_tokenizer(const std::string& dir) {
    std::error_code ec;
    for (const char* name : {"tokenizer.model", "tokenizer.json"}) {
        const fs::path p = fs::path(dir) / name;
        if (fs::is_regular_file(p, ec)) return p.string();
    }
    return "";
}

bool is_tokenizer_json(const std::string& file, std::string_view head) {
    if (fs::path(file).extension() == ".json") return true;
    const size_t first = head.find_first_not_of(" \t\r\n");
    return first != std::string_view::npos && head[first] == '{';
}

std::vector<std::pair<std::string, std::string>> tokenizer_files(const std::string& path) {
    std::error_code ec;
    const std::string file = fs::is_directory(path, ec) ? checkpoint_tokenizer(path) : path;
    if (file.empty() || !fs::is_regular_file(file, ec))
        throw Error(path +
                    ": tokenizer not found (expected a SentencePiece .model file or a "
                    "tokenizer.json)");
    std::ifstream in(file, std::ios::binary);
    std::string head(64, '\0');
    in.read(head.data(), static_cast<std::streamsize>(head.size()));
    head.resize(static_cast<size_t>(in.gcount()));
    std::vector<std::pair<std::string, std::string>> files = {
        {is_tokenizer_json(file, head) ? "tokenizer.json" : "tokenizer.model", file}};
    const fs::path config = fs::path(file).parent_path() / "tokenizer_config.json";
    if (fs::is_regular_file(config, ec))
        files.emplace_back("tokenizer_config.json", config.string());
    return files;
}

}  // namespace tmx

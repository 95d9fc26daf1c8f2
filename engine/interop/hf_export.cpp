// tmx export --format hf: a checkpoint as a Hugging Face model directory that transformers'
// AutoModelForCausalLM and AutoTokenizer load without code of ours.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

#include "engine/core/errors.h"
#include "engine/core/file_io.h"
#include "engine/core/json_fields.h"
#include "engine/data/tokenizer.h"
#include "engine/interop/hf_tokenizer.h"
#include "engine/interop/interop.h"
#include "engine/model/checkpoint.h"
#include "engine/model/model.h"

namespace tmx::interop {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

size_t element_bytes(StorageType t) {
    return t == StorageType::F32 ? 4 : 2;
}

// The tokenizer's files: a SentencePiece model as tokenizer.model with a tokenizer.json where
// one can say exactly what it does (else `skipped` says why not); a tokenizer.json as it is;
// and the config that loads it, with the chat template the checkpoint's tokenizer_config.json
// carries. Our datasets start every document with BOS and never append EOS, so the tokenizer
// adds BOS and not EOS.
void write_tokenizer_files(const Tokenizer& tok, const std::string& tok_path, const ModelConfig& c,
                           const fs::path& dir, std::string& skipped) {
    auto piece = [&](int32_t id) { return id >= 0 ? json(tok.piece(id)) : json(nullptr); };
    std::string tokenizer_json;
    if (tok.is_sentencepiece()) {
        write_file_atomic((dir / "tokenizer.model").string(), read_file(tok_path));
        try {
            tokenizer_json = interop::tokenizer_json(tok, tok.bos_id() >= 0);
        } catch (const Error& e) {
            skipped = e.what();
        }
    } else {
        tokenizer_json = read_file(tok_path);
    }
    if (!tokenizer_json.empty())
        write_file_atomic((dir / "tokenizer.json").string(), tokenizer_json);
    json cfg;
    // With a tokenizer.json, the generic class that loads it as it is (transformers 5's
    // LlamaTokenizer replaces its normalizer and decoder with defaults of its own).
    cfg["tokenizer_class"] = tokenizer_json.empty() ? "LlamaTokenizer" : "PreTrainedTokenizerFast";
    cfg["add_bos_token"] = tok.bos_id() >= 0;
    cfg["add_eos_token"] = false;
    cfg["bos_token"] = piece(tok.bos_id());
    cfg["eos_token"] = piece(tok.eos_id());
    cfg["unk_token"] = piece(tok.unk_id());
    cfg["pad_token"] = tok.pad_id() >= 0 ? piece(tok.pad_id()) : json(nullptr);
    cfg["model_max_length"] = c.max_seq_len;
    cfg["clean_up_tokenization_spaces"] = false;
    if (tok.is_sentencepiece()) {
        // legacy: plain SentencePiece encoding, as tmx tokenizes (no extra handling of the
        // text that follows a special token).
        cfg["legacy"] = true;
        cfg["sp_model_kwargs"] = json::object();
    }
    const fs::path source_config = fs::path(tok_path).parent_path() / "tokenizer_config.json";
    if (fs::is_regular_file(source_config)) {
        const json source = json_fields::parse_unique_keys(read_file(source_config.string()),
                                                           source_config.string());
        if (source.is_object() && source.contains("chat_template"))
            cfg["chat_template"] = source.at("chat_template");
    }
    write_file_atomic((dir / "tokenizer_config.json").string(),
                      cfg.dump(2, ' ', false, json::error_handler_t::replace) + "\n");
    json special;
    for (const auto& [key, id] : {std::pair<const char*, int32_t>{"bos_token", tok.bos_id()},
                                  {"eos_token", tok.eos_id()},
                                  {"unk_token", tok.unk_id()},
                                  {"pad_token", tok.pad_id()}})
        if (id >= 0) special[key] = tok.piece(id);
    write_file_atomic((dir / "special_tokens_map.json").string(),
                      special.dump(2, ' ', false, json::error_handler_t::replace) + "\n");
}

// Refuses to replace anything but an earlier export (a directory with config.json), and that
// only with overwrite.
void check_output_dir(const fs::path& dir, const std::string& shown, bool overwrite) {
    if (!fs::exists(dir)) return;
    if (!fs::is_directory(dir)) throw Error(shown + ": exists and is not a directory");
    if (fs::is_empty(dir)) return;
    if (!fs::exists(dir / "config.json"))
        throw Error(shown + ": exists and is not a model directory; refusing to replace it");
    if (!overwrite)
        throw Error(shown + ": a model already exists there (use " + opt("overwrite") +
                    " to replace it)");
}

}  // namespace

HfExportReport export_hf(const std::string& checkpoint, const std::string& out_dir,
                         const HfExportOptions& options) {
    if (options.dtype == StorageType::F64)
        throw UsageError(opt("dtype") + ": Hugging Face export writes f32, bf16 or f16");
    const ModelConfig config = load_checkpoint_config(checkpoint);
    const std::string config_path = (fs::path(checkpoint) / "config.json").string();
    HfExportReport report;
    report.architecture = hf_architecture(config, config_path);  // refuses before writing
    const std::string weights_path = (fs::path(checkpoint) / "model.safetensors").string();
    const SafetensorsFile weights(weights_path);
    const std::string tok_path = checkpoint_tokenizer(checkpoint);
    std::optional<Tokenizer> tok;
    if (!tok_path.empty()) tok.emplace(Tokenizer::load(tok_path));

    fs::path dir = fs::absolute(out_dir).lexically_normal();
    if (dir.filename().empty()) dir = dir.parent_path();
    check_output_dir(dir, out_dir, options.overwrite);

    // Shards: tensors in layout order, a new file when the next tensor would pass the limit.
    const std::vector<ParamSpec> specs = model_param_specs(config);
    std::vector<std::vector<const ParamSpec*>> shards(1);
    uint64_t in_shard = 0, total = 0;
    for (const auto& s : specs) {
        if (!weights.entries().count(s.name))
            throw Error(weights_path + ": missing tensor '" + s.name + "'");
        if (weights.entry(s.name).shape != s.shape)
            throw Error(weights_path + ": tensor '" + s.name + "' has shape " +
                        shape_string(weights.entry(s.name).shape) + ", but the config needs " +
                        shape_string(s.shape));
        const uint64_t bytes =
            static_cast<uint64_t>(shape_numel(s.shape)) * element_bytes(options.dtype);
        if (!shards.back().empty() && in_shard + bytes > options.shard_bytes) {
            shards.emplace_back();
            in_shard = 0;
        }
        shards.back().push_back(&s);
        in_shard += bytes;
        total += bytes;
    }
    const int n_shards = static_cast<int>(shards.size());
    auto shard_name = [&](int i) {
        if (n_shards == 1) return std::string("model.safetensors");
        char buf[64];
        std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", i + 1, n_shards);
        return std::string(buf);
    };

    fs::create_directories(dir.parent_path());
    const fs::path tmp = dir.string() + ".tmp-" + std::to_string(::getpid());
    fs::remove_all(tmp);
    fs::create_directory(tmp);
    try {
        const int32_t bos = tok ? tok->bos_id() : -1, eos = tok ? tok->eos_id() : -1;
        write_file_atomic(
            (tmp / "config.json").string(),
            hf_config_json(config, config_path, bos, eos, options.dtype).dump(2) + "\n");
        json gen = {{"bos_token_id", bos >= 0 ? json(bos) : json(nullptr)},
                    {"eos_token_id", eos >= 0 ? json(eos) : json(nullptr)}};
        write_file_atomic((tmp / "generation_config.json").string(), gen.dump(2) + "\n");

        json weight_map = json::object();
        Progress progress{0, static_cast<int64_t>(specs.size()), 0, total};
        std::vector<float> buffer;
        for (int i = 0; i < n_shards; ++i) {
            std::vector<SafetensorsEntryPlan> plan;
            for (const ParamSpec* s : shards[i])
                plan.push_back({hf_tensor_name(s->name), s->shape, options.dtype});
            SafetensorsWriter writer((tmp / shard_name(i)).string(), plan);
            for (const ParamSpec* s : shards[i]) {
                buffer.resize(static_cast<size_t>(shape_numel(s->shape)));
                weights.read_f32(s->name, buffer.data());
                check_finite_tensor(weights_path, s->name, s->shape, buffer.data(), "weights");
                writer.write_next(buffer.data());
                weight_map[hf_tensor_name(s->name)] = shard_name(i);
                ++progress.tensors_done;
                progress.bytes_done += buffer.size() * element_bytes(options.dtype);
                if (options.progress) options.progress(progress);
            }
            writer.finish();
        }
        if (n_shards > 1) {
            json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
            write_file_atomic((tmp / "model.safetensors.index.json").string(),
                              index.dump(2) + "\n");
        }
        if (tok) {
            write_tokenizer_files(*tok, tok_path, config, tmp, report.tokenizer_json_skipped);
        }
        const std::string previous =
            replace_directory(tmp.string(), dir.string(), "model", WithoutExchange::Fail);
        if (!previous.empty()) fs::remove_all(previous);
    } catch (...) {
        std::error_code ec;
        fs::remove_all(tmp, ec);
        throw;
    }
    report.tensors = static_cast<int64_t>(specs.size());
    report.shards = n_shards;
    report.bytes = total;
    report.tokenizer = tok.has_value();
    return report;
}

}  // namespace tmx::interop

// The model side of GGUF: which tensors a tmx model becomes in llama.cpp's `llama` architecture,
// in which type, and the metadata that describes it; one plan serves export and import.
#include "engine/interop/gguf_model.h"

#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "engine/core/errors.h"
#include "engine/data/tokenizer.h"
#include "engine/interop/sentencepiece_model.h"
#include "engine/model/checkpoint.h"
#include "engine/model/model.h"

namespace tmx::interop {

namespace fs = std::filesystem;
using gguf::TensorType;
using gguf::Value;

gguf::TensorType parse_gguf_dtype(const std::string& text, const std::string& flag) {
    if (text == "f32") return TensorType::F32;
    if (text == "f16") return TensorType::F16;
    if (text == "bf16") return TensorType::BF16;
    if (text == "q8_0") return TensorType::Q8_0;
    throw UsageError(flag + ": expected f32, f16, bf16 or q8_0, got \"" + text + "\"");
}

void permute_rope_rows(const float* in, float* out, int64_t heads, int64_t head_dim, int64_t cols) {
    const int64_t half = head_dim / 2;
    for (int64_t h = 0; h < heads; ++h)
        for (int64_t j = 0; j < half; ++j)
            for (int64_t t = 0; t < 2; ++t)
                std::copy_n(in + (h * head_dim + t * half + j) * cols, cols,
                            out + (h * head_dim + 2 * j + t) * cols);
}

void unpermute_rope_rows(const float* in, float* out, int64_t heads, int64_t head_dim,
                         int64_t cols) {
    const int64_t half = head_dim / 2;
    for (int64_t h = 0; h < heads; ++h)
        for (int64_t j = 0; j < half; ++j)
            for (int64_t t = 0; t < 2; ++t)
                std::copy_n(in + (h * head_dim + 2 * j + t) * cols, cols,
                            out + (h * head_dim + t * half + j) * cols);
}

namespace {

// One GGUF tensor and the native tensors it is made of.
struct PlannedTensor {
    enum class Kind { Plain, RopeRows, Experts };
    std::string name;
    std::vector<uint64_t> dims;  // GGUF order: fastest first
    TensorType type = TensorType::F32;
    Kind kind = Kind::Plain;
    int64_t rope_heads = 0;            // RopeRows: heads of this projection
    std::vector<std::string> sources;  // native names; Experts: one per expert, in order
};

uint64_t u(int64_t v) {
    return static_cast<uint64_t>(v);
}

// Norms (1-D) stay F32 in every file, and so does the router, as llama.cpp's converter keeps
// them; a Q8_0 tensor whose rows are not a whole number of blocks is written as F16.
TensorType type_for(const std::vector<uint64_t>& dims, bool router, TensorType wanted) {
    if (dims.size() == 1 || router || wanted == TensorType::F32) return TensorType::F32;
    if (wanted == TensorType::Q8_0 && dims[0] % gguf::kQ8_0BlockValues != 0) return TensorType::F16;
    return wanted;
}

std::vector<PlannedTensor> plan_tensors(const ModelConfig& c, TensorType wanted) {
    using Kind = PlannedTensor::Kind;
    std::vector<PlannedTensor> plan;
    auto add = [&](std::string name, std::vector<uint64_t> dims, std::vector<std::string> from,
                   Kind kind = Kind::Plain, int64_t rope_heads = 0, bool router = false) {
        const TensorType type = type_for(dims, router, wanted);
        plan.push_back({std::move(name), std::move(dims), type, kind, rope_heads, std::move(from)});
    };
    const uint64_t d = u(c.d_model), ff = u(c.d_ff), q = u(c.q_dim()), kv = u(c.kv_dim());
    add("token_embd.weight", {d, u(c.vocab_size)}, {"model.embed_tokens.weight"});
    for (int64_t i = 0; i < c.n_layers; ++i) {
        const std::string p = "model.layers." + std::to_string(i) + ".";
        const std::string b = "blk." + std::to_string(i) + ".";
        add(b + "attn_norm.weight", {d}, {p + "input_layernorm.weight"});
        add(b + "attn_q.weight", {d, q}, {p + "self_attn.q_proj.weight"}, Kind::RopeRows,
            c.n_heads);
        add(b + "attn_k.weight", {d, kv}, {p + "self_attn.k_proj.weight"}, Kind::RopeRows,
            c.n_kv_heads);
        add(b + "attn_v.weight", {d, kv}, {p + "self_attn.v_proj.weight"});
        add(b + "attn_output.weight", {q, d}, {p + "self_attn.o_proj.weight"});
        add(b + "ffn_norm.weight", {d}, {p + "post_attention_layernorm.weight"});
        if (c.is_moe()) {
            const std::string m = p + "block_sparse_moe.";
            add(b + "ffn_gate_inp.weight", {d, u(c.n_experts)}, {m + "gate.weight"}, Kind::Plain, 0,
                true);
            const std::pair<const char*, const char*> stacks[] = {
                {"ffn_gate_exps", "w1"}, {"ffn_up_exps", "w3"}, {"ffn_down_exps", "w2"}};
            for (const auto& [name, w] : stacks) {
                std::vector<std::string> experts;
                for (int64_t e = 0; e < c.n_experts; ++e)
                    experts.push_back(m + "experts." + std::to_string(e) + "." + w + ".weight");
                const bool down = std::string(w) == "w2";
                add(b + name + ".weight", {down ? ff : d, down ? d : ff, u(c.n_experts)}, experts,
                    Kind::Experts);
            }
        } else {
            add(b + "ffn_gate.weight", {d, ff}, {p + "mlp.w1.weight"});
            add(b + "ffn_up.weight", {d, ff}, {p + "mlp.w3.weight"});
            add(b + "ffn_down.weight", {ff, d}, {p + "mlp.w2.weight"});
        }
    }
    add("output_norm.weight", {d}, {"model.norm.weight"});
    if (!c.tie_embeddings) add("output.weight", {d, u(c.vocab_size)}, {"lm_head.weight"});
    return plan;
}

uint32_t file_type(TensorType t) {
    switch (t) {
        case TensorType::F32:
            return 0;
        case TensorType::F16:
            return 1;
        case TensorType::Q8_0:
            return 7;
        case TensorType::BF16:
            return 32;
    }
    return 0;
}

// SentencePiece piece types as GGUF's tokenizer.ggml.token_type numbers them.
enum TokenType : int32_t { kNormal = 1, kUnknown = 2, kControl = 3, kUnused = 5, kByte = 6 };

void add_vocabulary(gguf::Writer& w, const Tokenizer& tok) {
    std::vector<std::string> tokens;
    std::vector<float> scores;
    std::vector<int32_t> types;
    for (int32_t id = 0; id < tok.vocab_size(); ++id) {
        tokens.push_back(tok.piece(id));
        scores.push_back(tok.score(id));
        types.push_back(tok.is_control(id)   ? kControl
                        : tok.is_unknown(id) ? kUnknown
                        : tok.is_byte(id)    ? kByte
                        : tok.is_unused(id)  ? kUnused
                                             : kNormal);
    }
    w.add("tokenizer.ggml.model", Value::string("llama"));
    w.add("tokenizer.ggml.pre", Value::string("default"));
    w.add("tokenizer.ggml.tokens", Value::string_array(std::move(tokens)));
    w.add("tokenizer.ggml.scores", Value::f32_array(scores));
    w.add("tokenizer.ggml.token_type", Value::i32_array(types));
    if (tok.bos_id() >= 0)
        w.add("tokenizer.ggml.bos_token_id", Value::u32(static_cast<uint32_t>(tok.bos_id())));
    if (tok.eos_id() >= 0)
        w.add("tokenizer.ggml.eos_token_id", Value::u32(static_cast<uint32_t>(tok.eos_id())));
    if (tok.unk_id() >= 0)
        w.add("tokenizer.ggml.unknown_token_id", Value::u32(static_cast<uint32_t>(tok.unk_id())));
    if (tok.pad_id() >= 0)
        w.add("tokenizer.ggml.padding_token_id", Value::u32(static_cast<uint32_t>(tok.pad_id())));
    // Our datasets start each document with BOS and add no EOS.
    w.add("tokenizer.ggml.add_bos_token", Value::boolean(tok.bos_id() >= 0));
    w.add("tokenizer.ggml.add_eos_token", Value::boolean(false));
}

// tokenizer.ggml.* back into a SentencePiece model.
std::string sentencepiece_model_from_gguf(const gguf::Reader& r) {
    const std::string model = r.get_string("tokenizer.ggml.model");
    if (model != "llama")
        throw Error(r.path() + ": metadata 'tokenizer.ggml.model' is \"" + model +
                    "\": only SentencePiece vocabularies (\"llama\") are imported");
    const std::vector<std::string>& tokens = r.get_string_array("tokenizer.ggml.tokens");
    const std::vector<float> scores = r.get_f32_array("tokenizer.ggml.scores");
    const std::vector<int32_t> types = r.get_i32_array("tokenizer.ggml.token_type");
    if (scores.size() != tokens.size() || types.size() != tokens.size())
        throw Error(r.path() +
                    ": metadata 'tokenizer.ggml.scores' and 'token_type' must have "
                    "one entry per token (" +
                    std::to_string(tokens.size()) + ")");
    std::vector<VocabPiece> pieces(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) pieces[i] = {tokens[i], scores[i], types[i]};
    auto id = [&](const char* key, int32_t def) {
        return r.has(key) ? static_cast<int32_t>(r.get_u32(key)) : def;
    };
    VocabSpecialIds ids;
    ids.unk = id("tokenizer.ggml.unknown_token_id", 0);
    ids.bos = id("tokenizer.ggml.bos_token_id", 1);
    ids.eos = id("tokenizer.ggml.eos_token_id", 2);
    ids.pad = id("tokenizer.ggml.padding_token_id", -1);
    return sentencepiece_model_proto(pieces, ids, r.path());
}

}  // namespace

GgufExportReport export_gguf(const std::string& checkpoint, const std::string& out_file,
                             const GgufExportOptions& options) {
    const ModelConfig c = load_checkpoint_config(checkpoint);
    const std::string config_path = (fs::path(checkpoint) / "config.json").string();
    hf_architecture(c, config_path);  // the same flavour refusals as Hugging Face's classes
    if (c.attn_bias) throw Error(config_path + ": field 'attn_bias' is true: not written to GGUF");
    if (c.ffn_bias) throw Error(config_path + ": field 'ffn_bias' is true: not written to GGUF");
    if (c.d_model > UINT32_MAX || c.n_layers > UINT32_MAX)
        throw Error(config_path + ": sizes beyond 32 bits cannot be written to GGUF");
    if (fs::exists(out_file) && !options.overwrite)
        throw Error(out_file + ": exists (use " + opt("overwrite") + " to replace it)");
    if (fs::is_directory(out_file)) throw Error(out_file + ": is a directory");
    const std::string weights_path = (fs::path(checkpoint) / "model.safetensors").string();
    const SafetensorsFile weights(weights_path);
    const std::string tok_path = checkpoint_tokenizer(checkpoint);
    if (tok_path.empty())
        throw Error(checkpoint +
                    ": no tokenizer: a GGUF file carries its vocabulary, so export needs "
                    "the checkpoint's tokenizer");
    const Tokenizer tok = Tokenizer::load(tok_path);
    if (!tok.is_sentencepiece())
        throw Error(tok_path +
                    ": GGUF export writes SentencePiece vocabularies (\"llama\"); a "
                    "tokenizer.json is not exported to GGUF");
    if (tok.vocab_size() != c.vocab_size)
        throw Error(tok_path + ": " + std::to_string(tok.vocab_size()) +
                    " pieces, but the model's vocab_size is " + std::to_string(c.vocab_size) +
                    " (llama.cpp needs one piece per embedding row)");

    gguf::Writer w(out_file);
    w.add("general.architecture", Value::string("llama"));
    w.add("general.name",
          Value::string(fs::path(checkpoint).lexically_normal().filename().string()));
    w.add("general.file_type", Value::u32(file_type(options.dtype)));
    w.add("general.quantization_version", Value::u32(2));
    auto u32 = [](int64_t v) { return Value::u32(static_cast<uint32_t>(v)); };
    w.add("llama.vocab_size", u32(c.vocab_size));
    w.add("llama.context_length", u32(c.max_seq_len));
    w.add("llama.embedding_length", u32(c.d_model));
    w.add("llama.block_count", u32(c.n_layers));
    w.add("llama.feed_forward_length", u32(c.d_ff));
    w.add("llama.attention.head_count", u32(c.n_heads));
    w.add("llama.attention.head_count_kv", u32(c.n_kv_heads));
    w.add("llama.attention.key_length", u32(c.head_dim));
    w.add("llama.attention.value_length", u32(c.head_dim));
    w.add("llama.rope.freq_base", Value::f32(static_cast<float>(c.rope_theta)));
    w.add("llama.rope.dimension_count", u32(c.head_dim));
    w.add("llama.attention.layer_norm_rms_epsilon", Value::f32(static_cast<float>(c.norm_eps)));
    if (c.is_moe()) {
        w.add("llama.expert_count", u32(c.n_experts));
        w.add("llama.expert_used_count", u32(c.top_k));
    }
    // llama.cpp's llama architecture attends to the whole context; the window is recorded so
    // that an import gives back the model that was exported.
    if (c.sliding_window > 0) w.add("llama.attention.sliding_window", u32(c.sliding_window));
    w.add("tmx.rope_theta", Value::f64(c.rope_theta));
    w.add("tmx.norm_eps", Value::f64(c.norm_eps));
    w.add("tmx.router_aux_loss_coef", Value::f64(c.router_aux_loss_coef));
    add_vocabulary(w, tok);

    const std::vector<PlannedTensor> plan = plan_tensors(c, options.dtype);
    for (const auto& t : plan) w.add_tensor(t.name, t.dims, t.type);
    w.write_header();
    Progress progress{0, static_cast<int64_t>(plan.size()), 0, 0};
    for (const auto& t : w.tensors()) progress.bytes_total += t.bytes;
    std::vector<float> buffer, arranged;
    for (size_t i = 0; i < plan.size(); ++i) {
        const PlannedTensor& t = plan[i];
        for (const std::string& src : t.sources) {
            const SafetensorsEntry& e = weights.entry(src);
            buffer.resize(static_cast<size_t>(shape_numel(e.shape)));
            weights.read_f32(src, buffer.data());
            check_finite_tensor(weights_path, src, e.shape, buffer.data(), "weights");
            const float* out = buffer.data();
            if (t.kind == PlannedTensor::Kind::RopeRows) {
                arranged.resize(buffer.size());
                permute_rope_rows(buffer.data(), arranged.data(), t.rope_heads, c.head_dim,
                                  c.d_model);
                out = arranged.data();
            }
            w.append_f32(out, buffer.size());
        }
        progress.tensors_done = static_cast<int64_t>(i + 1);
        progress.bytes_done += w.tensors()[i].bytes;
        if (options.progress) options.progress(progress);
    }
    w.finish();
    GgufExportReport report;
    report.tensors = static_cast<int64_t>(plan.size());
    report.bytes = fs::file_size(out_file);
    return report;
}

namespace {

// The checkpoint storage of a GGUF tensor type.
StorageType storage_of_gguf(gguf::TensorType t) {
    switch (t) {
        case gguf::TensorType::F16:
            return StorageType::F16;
        case gguf::TensorType::BF16:
            return StorageType::BF16;
        case gguf::TensorType::Q8_0:
            return StorageType::Q8_0;
        default:
            return StorageType::F32;
    }
}

// The native config a GGUF llama file describes; anything we do not compute exactly is refused
// naming the key.
ModelConfig config_from_gguf(const gguf::Reader& r) {
    const std::string& path = r.path();
    auto refuse = [&](const std::string& key, const std::string& why) -> void {
        throw Error(path + ": metadata '" + key + "' " + why);
    };
    const std::string arch = r.get_string("general.architecture");
    if (arch != "llama")
        refuse("general.architecture",
               "is \"" + arch +
                   "\": only the llama architecture (Llama, Mistral, Mixtral) is "
                   "imported");
    if (r.has("llama.rope.scaling.type") && r.get_string("llama.rope.scaling.type") != "none")
        refuse("llama.rope.scaling.type", "is \"" + r.get_string("llama.rope.scaling.type") +
                                              "\": the engine implements plain RoPE only");
    if (r.has("llama.rope.scaling.factor") && r.get_f32("llama.rope.scaling.factor") != 1.0f)
        refuse("llama.rope.scaling.factor", "is not 1: the engine implements plain RoPE only");
    ModelConfig c;
    c.ffn_type = FfnType::SwiGlu;
    c.activation = Activation::Silu;  // SwiGLU gates with SiLU, as the native swiglu configs say
    c.norm_type = NormType::RmsNorm;
    c.ffn_bias = c.attn_bias = false;
    c.d_model = r.get_u32("llama.embedding_length");
    c.n_layers = r.get_u32("llama.block_count");
    c.d_ff = r.get_u32("llama.feed_forward_length");
    c.n_heads = r.get_u32("llama.attention.head_count");
    c.n_kv_heads = r.has("llama.attention.head_count_kv")
                       ? r.get_u32("llama.attention.head_count_kv")
                       : c.n_heads;
    if (c.n_heads == 0) refuse("llama.attention.head_count", "is 0");
    c.head_dim = r.has("llama.attention.key_length") ? r.get_u32("llama.attention.key_length")
                                                     : c.d_model / c.n_heads;
    if (r.has("llama.attention.value_length") &&
        r.get_u32("llama.attention.value_length") != c.head_dim)
        refuse("llama.attention.value_length", "differs from the key length: not supported");
    if (r.has("llama.rope.dimension_count") &&
        r.get_u32("llama.rope.dimension_count") != c.head_dim)
        refuse("llama.rope.dimension_count",
               "is " + std::to_string(r.get_u32("llama.rope.dimension_count")) + ", not head_dim " +
                   std::to_string(c.head_dim) + ": the engine rotates whole heads");
    c.max_seq_len = r.get_u32("llama.context_length");
    c.rope_theta = r.has("tmx.rope_theta")         ? r.get_f64("tmx.rope_theta")
                   : r.has("llama.rope.freq_base") ? r.get_f32("llama.rope.freq_base")
                                                   : 10000.0;
    c.norm_eps = r.has("tmx.norm_eps") ? r.get_f64("tmx.norm_eps")
                                       : r.get_f32("llama.attention.layer_norm_rms_epsilon");
    c.n_experts = r.has("llama.expert_count") ? r.get_u32("llama.expert_count") : 0;
    c.top_k = c.n_experts > 0 ? r.get_u32("llama.expert_used_count") : 1;
    c.sliding_window =
        r.has("llama.attention.sliding_window") ? r.get_u32("llama.attention.sliding_window") : 0;
    if (r.has("tmx.router_aux_loss_coef"))
        c.router_aux_loss_coef = r.get_f64("tmx.router_aux_loss_coef");
    const gguf::TensorInfo* embd = r.find_tensor("token_embd.weight");
    if (!embd) throw Error(path + ": missing tensor 'token_embd.weight'");
    if (embd->dims.size() != 2) throw Error(path + ": tensor 'token_embd.weight' is not 2-D");
    c.vocab_size = static_cast<int64_t>(embd->dims[1]);
    c.tie_embeddings = r.find_tensor("output.weight") == nullptr;
    validate_config(c, path + " (as a native config)");
    return c;
}

}  // namespace

ImportReport import_gguf(const std::string& gguf_file, const std::string& checkpoint,
                         const ImportOptions& options) {
    const gguf::Reader r(gguf_file);
    const ModelConfig c = config_from_gguf(r);
    const std::vector<PlannedTensor> plan = plan_tensors(c, TensorType::F32);
    // Every planned tensor present with its shape, in a type we read, and no others.
    struct Where {
        const gguf::TensorInfo* info;
        const PlannedTensor* planned;
        uint64_t index;  // the expert, for stacked tensors
    };
    std::map<std::string, Where> where;
    std::set<std::string> planned_names;
    for (const auto& t : plan) {
        planned_names.insert(t.name);
        const gguf::TensorInfo* info = r.find_tensor(t.name);
        if (!info) throw Error(gguf_file + ": missing tensor '" + t.name + "'");
        if (info->dims != t.dims) {
            std::string got, want;
            for (uint64_t x : info->dims) got += (got.empty() ? "" : ", ") + std::to_string(x);
            for (uint64_t x : t.dims) want += (want.empty() ? "" : ", ") + std::to_string(x);
            throw Error(gguf_file + ": tensor '" + t.name + "' has dims [" + got +
                        "], but the metadata needs [" + want + "]");
        }
        for (size_t e = 0; e < t.sources.size(); ++e) where[t.sources[e]] = {info, &t, e};
    }
    for (const auto& t : r.tensors())
        if (!planned_names.count(t.name) && t.name != "rope_freqs.weight")
            throw Error(gguf_file + ": unexpected tensor '" + t.name +
                        "' (the metadata describes no such weight)");
    if (r.find_tensor("rope_freqs.weight"))
        throw Error(gguf_file +
                    ": tensor 'rope_freqs.weight' scales RoPE frequencies: the "
                    "engine implements plain RoPE only");

    CheckpointWriteOptions w;
    w.dtype = options.dtype.value_or(
        storage_of_gguf(where.at("model.layers.0.self_attn.q_proj.weight").info->type));
    w.overwrite = options.overwrite;
    // The vocabulary becomes a SentencePiece model again; loading it checks it.
    w.tokenizer_model = sentencepiece_model_from_gguf(r);
    const Tokenizer tok = Tokenizer::from_bytes(w.tokenizer_model, gguf_file + " (vocabulary)");
    if (tok.vocab_size() != c.vocab_size)
        throw Error(gguf_file + ": " + std::to_string(tok.vocab_size()) +
                    " tokens, but token_embd.weight has " + std::to_string(c.vocab_size) + " rows");
    Progress progress{0, static_cast<int64_t>(where.size()), 0, 0};
    for (const auto& [name, at] : where)
        progress.bytes_total +=
            at.info->numel /
            (at.planned->kind == PlannedTensor::Kind::Experts ? static_cast<uint64_t>(c.n_experts)
                                                              : 1) *
            (w.dtype == StorageType::F32 ? 4 : 2);
    std::vector<float> buffer;
    {
        write_checkpoint(c, checkpoint, w, [&](const ParamSpec& spec, float* out) {
            auto it = where.find(spec.name);
            if (it == where.end()) throw Error(gguf_file + ": no tensor holds '" + spec.name + "'");
            const Where& at = it->second;
            const uint64_t n = static_cast<uint64_t>(shape_numel(spec.shape));
            if (at.planned->kind == PlannedTensor::Kind::RopeRows) {
                buffer.resize(n);
                r.read_f32(*at.info, 0, n, buffer.data());
                unpermute_rope_rows(buffer.data(), out, at.planned->rope_heads, c.head_dim,
                                    c.d_model);
            } else {
                r.read_f32(*at.info, at.index * n, n, out);
            }
            check_finite_tensor(gguf_file, at.planned->name, spec.shape, out, "weights");
            ++progress.tensors_done;
            progress.bytes_done += n * (w.dtype == StorageType::F32 ? 4 : 2);
            if (options.progress) options.progress(progress);
        });
    }

    ImportReport report;
    report.config = c;
    report.source_kind = "GGUF llama";
    report.dtype = w.dtype;
    report.params = param_count(c, gguf_file);
    return report;
}

}  // namespace tmx::interop

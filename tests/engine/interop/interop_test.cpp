// Export to Hugging Face and GGUF and import back: round trips bit-exact in f32 and within the
// format's rounding otherwise, logits and greedy tokens of the imported model equal to the
// original's, the config mapping both ways, llama.cpp's RoPE row order checked numerically, and
// hostile inputs refused naming the file and the field.
#include "engine/interop/interop.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backends/registry.h"
#include "engine/core/errors.h"
#include "engine/core/file_io.h"
#include "engine/core/rng.h"
#include "engine/data/tokenizer.h"
#include "engine/interop/gguf_model.h"
#include "engine/model/checkpoint.h"
#include "engine/report/param_report.h"
#include "tests/test_util.h"

namespace tmx {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::TempDir;

using test::error_of;

ModelConfig tiny_mixtral(int64_t vocab) {
    ModelConfig c;
    c.vocab_size = vocab;
    c.d_model = 64;
    c.n_layers = 2;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.head_dim = 16;
    c.ffn_type = FfnType::SwiGlu;
    c.activation = Activation::Silu;
    c.d_ff = 96;
    c.ffn_bias = false;
    c.norm_type = NormType::RmsNorm;
    c.n_experts = 4;
    c.top_k = 2;
    c.max_seq_len = 64;
    c.sliding_window = 32;
    c.tie_embeddings = false;
    return c;
}

// A trained tokenizer and a randomly initialised checkpoint per test binary run.
class Interop : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        dir_ = new TempDir;
        Rng rng(test::fresh_seed());
        const char* words[] = {"the",  "cat",  "dog",   "ran",   "saw",    "a",    "big",  "red",
                               "tree", "over", "under", "happy", "little", "bird", "sang", "and"};
        std::string text;
        for (int doc = 0; doc < 400; ++doc) {
            for (int w = 0; w < 12; ++w) text += std::string(words[rng.below(16)]) + " ";
            text += "é!\n\n";
        }
        write_file_atomic(*dir_ / "corpus.txt", text);
        tokenizer_ = *dir_ / "tok.model";
        train_tokenizer({*dir_ / "corpus.txt"}, kVocab, tokenizer_);
        checkpoint_ = *dir_ / "ckpt";
        auto backend = make_backend("cpu");
        Model model(tiny_mixtral(kVocab), *backend);
        model.init_random(rng.next_u64());
        CheckpointWriteOptions w;
        w.tokenizer_path = tokenizer_;
        save_checkpoint(model, checkpoint_, w);
    }
    static void TearDownTestSuite() {
        delete dir_;
        dir_ = nullptr;
    }

    // Last-position logits of `tokens` and 8 greedy tokens after them, on the CPU.
    static std::pair<std::vector<float>, std::vector<int32_t>> run(const std::string& ckpt,
                                                                   std::vector<int32_t> tokens) {
        auto backend = make_backend("cpu");
        auto model = load_model(ckpt, *backend);
        std::vector<float> first;
        std::vector<int32_t> greedy;
        for (int step = 0; step < 8; ++step) {
            const int64_t T = static_cast<int64_t>(tokens.size());
            ForwardResult r = model->forward(tokens, 1, T);
            std::vector<float> logits(static_cast<size_t>(T * kVocab));
            backend->download(r.logits, logits.data());
            std::vector<float> last(logits.end() - kVocab, logits.end());
            if (step == 0) first = last;
            const int32_t next =
                static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin());
            greedy.push_back(next);
            tokens.push_back(next);
        }
        return {first, greedy};
    }

    static std::vector<int32_t> prompt() {
        return Tokenizer::load(tokenizer_).encode("the little bird sang over a big red tree");
    }

    static constexpr int kVocab = 300;
    static TempDir* dir_;
    static std::string tokenizer_, checkpoint_;
};
TempDir* Interop::dir_ = nullptr;
std::string Interop::tokenizer_, Interop::checkpoint_;

TEST_F(Interop, HuggingFaceRoundTripIsBitExactInF32AndShardsFollowTheLimit) {
    TempDir dir;
    interop::HfExportOptions h;
    h.shard_bytes = 200'000;  // several files
    const auto r = interop::export_hf(checkpoint_, dir / "hf", h);
    EXPECT_EQ(r.architecture, "MixtralForCausalLM");
    EXPECT_GT(r.shards, 1);
    const json index = read_json_file(dir / "hf/model.safetensors.index.json");
    uint64_t total = 0;
    for (const auto& [name, file] : index.at("weight_map").items()) {
        const SafetensorsFile f(dir / ("hf/" + file.get<std::string>()));
        ASSERT_TRUE(f.entries().count(name)) << name;
        total += f.entry(name).end - f.entry(name).begin;
    }
    EXPECT_EQ(index.at("metadata").at("total_size").get<uint64_t>(), total);
    const json cfg = read_json_file(dir / "hf/config.json");
    EXPECT_EQ(cfg.at("model_type"), "mixtral");
    EXPECT_EQ(cfg.at("num_local_experts"), 4);
    EXPECT_EQ(cfg.at("sliding_window"), 32);
    const json tok_cfg = read_json_file(dir / "hf/tokenizer_config.json");
    EXPECT_EQ(tok_cfg.at("tokenizer_class"), "LlamaTokenizer");
    EXPECT_EQ(tok_cfg.at("add_bos_token"), true);
    EXPECT_EQ(read_file(dir / "hf/tokenizer.model"), read_file(tokenizer_));

    interop::import_hf(dir / "hf", dir / "back", {});
    EXPECT_EQ(read_file(dir / "back/model.safetensors"),
              read_file(checkpoint_ + "/model.safetensors"));
    EXPECT_EQ(read_file(dir / "back/config.json"), read_file(checkpoint_ + "/config.json"));
    const auto [logits, greedy] = run(checkpoint_, prompt());
    const auto [logits2, greedy2] = run(dir / "back", prompt());
    EXPECT_EQ(logits, logits2);
    EXPECT_EQ(greedy, greedy2);
}

TEST_F(Interop, HuggingFaceBf16AndF16StayWithinTheirRounding) {
    TempDir dir;
    for (StorageType dtype : {StorageType::BF16, StorageType::F16}) {
        SCOPED_TRACE(to_string(dtype));
        interop::HfExportOptions h;
        h.dtype = dtype;
        h.overwrite = true;
        interop::export_hf(checkpoint_, dir / "hf", h);
        EXPECT_EQ(read_json_file(dir / "hf/config.json").at("torch_dtype"),
                  dtype == StorageType::BF16 ? "bfloat16" : "float16");
        interop::ImportOptions o;
        o.overwrite = true;
        interop::import_hf(dir / "hf", dir / "back", o);
        const SafetensorsFile a(checkpoint_ + "/model.safetensors"),
            b(dir / "back/model.safetensors");
        const float rel = dtype == StorageType::BF16 ? std::ldexp(1.0f, -8) : std::ldexp(1.0f, -11);
        for (const auto& [name, e] : a.entries()) {
            std::vector<float> x(static_cast<size_t>(shape_numel(e.shape))), y(x.size());
            a.read_f32(name, x.data());
            b.read_f32(name, y.data());
            for (size_t i = 0; i < x.size(); ++i)
                ASSERT_LE(std::fabs(x[i] - y[i]), rel * std::fabs(x[i]) + 1e-7f)
                    << name << " " << i;
        }
    }
}

TEST_F(Interop, GgufRoundTripIsBitExactInF32AndQ8_0StaysWithinHalfAStep) {
    TempDir dir;
    interop::export_gguf(checkpoint_, dir / "m.gguf", {});
    interop::import_gguf(dir / "m.gguf", dir / "back", {});
    EXPECT_EQ(read_file(dir / "back/model.safetensors"),
              read_file(checkpoint_ + "/model.safetensors"));
    EXPECT_EQ(read_file(dir / "back/config.json"), read_file(checkpoint_ + "/config.json"));
    // The vocabulary rebuilt from tokenizer.ggml.* encodes and decodes as the original.
    const Tokenizer original = Tokenizer::load(tokenizer_);
    const Tokenizer rebuilt = Tokenizer::load(dir / "back/tokenizer.model");
    for (const char* text : {"the cat saw a big red tree", "  happy  birds\nsang é! ü 日本",
                             "little dog ran under and over"}) {
        EXPECT_EQ(rebuilt.encode(text), original.encode(text)) << text;
        EXPECT_EQ(rebuilt.decode(original.encode(text)), original.decode(original.encode(text)));
    }
    EXPECT_EQ(rebuilt.bos_id(), original.bos_id());
    EXPECT_EQ(rebuilt.eos_id(), original.eos_id());
    const auto [logits, greedy] = run(checkpoint_, prompt());
    const auto [logits2, greedy2] = run(dir / "back", prompt());
    EXPECT_EQ(logits, logits2);
    EXPECT_EQ(greedy, greedy2);

    interop::GgufExportOptions q;
    q.dtype = gguf::TensorType::Q8_0;
    interop::export_gguf(checkpoint_, dir / "q.gguf", q);
    const gguf::Reader r(dir / "q.gguf");
    EXPECT_EQ(r.find_tensor("blk.0.ffn_gate_exps.weight")->type, gguf::TensorType::Q8_0);
    EXPECT_EQ(r.find_tensor("blk.0.ffn_gate_inp.weight")->type, gguf::TensorType::F32);
    EXPECT_EQ(r.find_tensor("blk.0.attn_norm.weight")->type, gguf::TensorType::F32);
    EXPECT_EQ(r.get_u32("general.file_type"), 7u);
    interop::import_gguf(dir / "q.gguf", dir / "qback", {});
    const SafetensorsFile a(checkpoint_ + "/model.safetensors"), b(dir / "qback/model.safetensors");
    for (const auto& [name, e] : a.entries()) {
        std::vector<float> x(static_cast<size_t>(shape_numel(e.shape))), y(x.size());
        a.read_f32(name, x.data());
        b.read_f32(name, y.data());
        // Q8_0 rounds each value to within half a step d = max|x| / 127 of its block, plus
        // |q| <= 127 times the f16 rounding of d (2^-11 relative): d * (0.5 + 127 / 2048).
        for (size_t blk = 0; blk + 32 <= x.size(); blk += 32) {
            float amax = 0;
            for (size_t i = blk; i < blk + 32; ++i) amax = std::max(amax, std::fabs(x[i]));
            for (size_t i = blk; i < blk + 32; ++i)
                ASSERT_LE(std::fabs(x[i] - y[i]), amax / 127 * (0.5f + 127.0f / 2048) + 1e-6f)
                    << name;
        }
    }
    const auto [logits_q, greedy_q] = run(dir / "qback", prompt());
    float scale = 0, diff = 0;
    for (size_t i = 0; i < logits.size(); ++i) {
        scale = std::max(scale, std::fabs(logits[i]));
        diff = std::max(diff, std::fabs(logits[i] - logits_q[i]));
    }
    EXPECT_LT(diff, 0.05f * scale);
}

// llama.cpp rotates adjacent pairs (2j, 2j+1) at angle pos * theta^(-2j/hd); we rotate (j, j+hd/2)
// at the same angle. With q and k rows permuted for GGUF, every attention score is the same.
TEST(GgufRope, PermutedRowsUnderLlamaCppsRotationGiveOurScores) {
    Rng rng(test::fresh_seed());
    const int64_t heads = 3, hd = 8, cols = 5, pos_q = 7, pos_k = 3;
    const double theta = 10000.0;
    std::vector<float> wq(heads * hd * cols), wk(heads * hd * cols), x(cols), y(cols);
    for (float& v : wq) v = static_cast<float>(rng.normal());
    for (float& v : wk) v = static_cast<float>(rng.normal());
    for (float& v : x) v = static_cast<float>(rng.normal());
    for (float& v : y) v = static_cast<float>(rng.normal());
    auto matvec = [&](const std::vector<float>& w, const std::vector<float>& v) {
        std::vector<double> out(heads * hd);
        for (int64_t r = 0; r < heads * hd; ++r)
            for (int64_t c = 0; c < cols; ++c) out[r] += double(w[r * cols + c]) * v[c];
        return out;
    };
    auto rotate = [&](std::vector<double> v, int64_t pos, bool adjacent) {
        for (int64_t h = 0; h < heads; ++h)
            for (int64_t j = 0; j < hd / 2; ++j) {
                const double a = pos * std::pow(theta, -2.0 * j / hd);
                const int64_t i0 = h * hd + (adjacent ? 2 * j : j);
                const int64_t i1 = h * hd + (adjacent ? 2 * j + 1 : j + hd / 2);
                const double u0 = v[i0], u1 = v[i1];
                v[i0] = u0 * std::cos(a) - u1 * std::sin(a);
                v[i1] = u0 * std::sin(a) + u1 * std::cos(a);
            }
        return v;
    };
    std::vector<float> pq(wq.size()), pk(wk.size()), back(wq.size());
    interop::permute_rope_rows(wq.data(), pq.data(), heads, hd, cols);
    interop::permute_rope_rows(wk.data(), pk.data(), heads, hd, cols);
    interop::unpermute_rope_rows(pq.data(), back.data(), heads, hd, cols);
    EXPECT_EQ(back, wq);
    const auto ours_q = rotate(matvec(wq, x), pos_q, false),
               ours_k = rotate(matvec(wk, y), pos_k, false);
    const auto theirs_q = rotate(matvec(pq, x), pos_q, true),
               theirs_k = rotate(matvec(pk, y), pos_k, true);
    double unpermuted_diff = 0;
    for (int64_t h = 0; h < heads; ++h) {
        double ours = 0, theirs = 0, naive = 0;
        const auto naive_q = rotate(matvec(wq, x), pos_q, true),
                   naive_k = rotate(matvec(wk, y), pos_k, true);
        for (int64_t i = h * hd; i < (h + 1) * hd; ++i) {
            ours += ours_q[i] * ours_k[i];
            theirs += theirs_q[i] * theirs_k[i];
            naive += naive_q[i] * naive_k[i];
        }
        EXPECT_NEAR(theirs, ours, 1e-9 * (1 + std::fabs(ours))) << "head " << h;
        unpermuted_diff = std::max(unpermuted_diff, std::fabs(naive - ours));
    }
    EXPECT_GT(unpermuted_diff, 1e-3);  // without the permutation the scores differ
}

TEST_F(Interop, FlavoursNoClassExpressesAreRefusedBeforeWriting) {
    TempDir dir;
    struct Case {
        const char* field;
        std::function<void(ModelConfig&)> change;
    };
    const Case cases[] = {
        {"ffn_type", [](ModelConfig& c) { c.ffn_type = FfnType::Mlp; }},
        {"norm_type", [](ModelConfig& c) { c.norm_type = NormType::LayerNorm; }},
        {"ffn_bias", [](ModelConfig& c) { c.ffn_bias = true; }},
        {"attn_bias", [](ModelConfig& c) { c.attn_bias = true; }},
    };
    for (const Case& k : cases) {
        SCOPED_TRACE(k.field);
        ModelConfig c = tiny_mixtral(kVocab);
        k.change(c);
        auto backend = make_backend("cpu");
        Model model(c, *backend);
        model.init_random(1);
        CheckpointWriteOptions w;
        w.tokenizer_path = tokenizer_;
        w.overwrite = true;
        save_checkpoint(model, dir / "ck", w);
        const std::string hf = error_of([&] { interop::export_hf(dir / "ck", dir / "hf", {}); });
        EXPECT_NE(hf.find("field '" + std::string(k.field) + "'"), std::string::npos) << hf;
        EXPECT_FALSE(fs::exists(dir / "hf"));
        const std::string gg =
            error_of([&] { interop::export_gguf(dir / "ck", dir / "m.gguf", {}); });
        EXPECT_NE(gg.find(k.field), std::string::npos) << gg;
        EXPECT_FALSE(fs::exists(dir / "m.gguf"));
    }
    // A dense model without a window is Llama, whose biases carry ours; with a window, Mistral.
    ModelConfig dense = tiny_mixtral(kVocab);
    dense.n_experts = 0;
    EXPECT_EQ(interop::hf_architecture(dense, "c"), "MistralForCausalLM");
    dense.sliding_window = 0;
    dense.attn_bias = dense.ffn_bias = true;
    EXPECT_EQ(interop::hf_architecture(dense, "c"), "LlamaForCausalLM");
    const json j = interop::hf_config_json(dense, "c", 1, 2, StorageType::BF16);
    EXPECT_EQ(j.at("attention_bias"), true);
    EXPECT_EQ(j.at("mlp_bias"), true);
    EXPECT_EQ(interop::hf_tensor_name("model.layers.3.mlp.w1.weight"),
              "model.layers.3.mlp.gate_proj.weight");
    EXPECT_EQ(interop::native_tensor_name("model.layers.3.mlp.down_proj.bias"),
              "model.layers.3.mlp.w2.bias");
}

// Every config the mapping writes reads back (through the parameter report's reader, the one
// `tmx params` uses) as the same native config; published configs map to what they describe.
TEST(HfConfigMapping, NativeToHfToNativeIsTheIdentityAndPublishedConfigsMap) {
    Rng rng(test::fresh_seed());
    for (int trial = 0; trial < 20; ++trial) {
        ModelConfig c = tiny_mixtral(100 + static_cast<int64_t>(rng.below(1000)));
        c.n_experts = static_cast<int64_t>(rng.below(4)) * 2;
        c.top_k = c.n_experts > 0 ? 1 + static_cast<int64_t>(rng.below(2)) : 1;
        c.sliding_window = rng.below(2) ? static_cast<int64_t>(rng.below(64)) : 0;
        c.tie_embeddings = rng.below(2) == 0;
        c.rope_theta = 1000.0 + static_cast<double>(rng.below(1000000));
        c.norm_eps = 1e-6 * static_cast<double>(1 + rng.below(20));
        c.head_dim = 8 * static_cast<int64_t>(1 + rng.below(4));
        if (c.n_experts > 0)
            c.router_aux_loss_coef = 0.001 * static_cast<double>(rng.below(50));
        else
            c.router_aux_loss_coef = 0.02;  // dense: not a Hugging Face field, the default
        const json hf = interop::hf_config_json(c, "c", 1, 2, StorageType::F32);
        std::string why;
        const auto back = engine_config_for(hf, "hf.json", &why);
        ASSERT_TRUE(back) << why << "\n" << hf.dump();
        EXPECT_EQ(config_to_json(*back), config_to_json(c)) << hf.dump();
    }
    const std::string fixtures = std::string(TMX_SOURCE_DIR) + "/tests/fixtures/hf_configs/";
    const auto mixtral =
        engine_config_for(read_json_file(fixtures + "mixtral-8x7b.json"), "m", nullptr);
    ASSERT_TRUE(mixtral);
    EXPECT_EQ(mixtral->n_experts, 8);
    EXPECT_EQ(mixtral->top_k, 2);
    EXPECT_EQ(mixtral->d_model, 4096);
    EXPECT_EQ(interop::hf_architecture(*mixtral, "m"), "MixtralForCausalLM");
    const json again = interop::hf_config_json(*mixtral, "m", 1, 2, StorageType::BF16);
    for (const char* key : {"hidden_size", "intermediate_size", "num_hidden_layers",
                            "num_attention_heads", "num_key_value_heads", "num_local_experts",
                            "num_experts_per_tok", "vocab_size", "max_position_embeddings"})
        EXPECT_EQ(again.at(key), read_json_file(fixtures + "mixtral-8x7b.json").at(key)) << key;
    const auto llama = engine_config_for(read_json_file(fixtures + "llama-7b.json"), "l", nullptr);
    ASSERT_TRUE(llama);
    EXPECT_EQ(interop::hf_architecture(*llama, "l"), "LlamaForCausalLM");
    const auto mistral =
        engine_config_for(read_json_file(fixtures + "mistral-7b.json"), "s", nullptr);
    ASSERT_TRUE(mistral);
    EXPECT_EQ(interop::hf_architecture(*mistral, "s"),
              mistral->sliding_window > 0 ? "MistralForCausalLM" : "LlamaForCausalLM");
}

TEST_F(Interop, HostileHuggingFaceDirectoriesAreRefusedNamingTheFileAndField) {
    TempDir dir;
    interop::HfExportOptions h;
    h.shard_bytes = 200'000;
    interop::export_hf(checkpoint_, dir / "hf", h);
    const std::string index_path = dir / "hf/model.safetensors.index.json";
    const json index = read_json_file(index_path);
    auto attempt = [&](const std::string& index_text) {
        write_file_atomic(index_path, index_text);
        return error_of([&] {
            interop::ImportOptions o;
            o.overwrite = true;
            interop::import_hf(dir / "hf", dir / "back", o);
        });
    };
    json missing_file = index;
    missing_file["weight_map"]["model.norm.weight"] = "model-00009-of-00009.safetensors";
    std::string e = attempt(missing_file.dump());
    EXPECT_NE(e.find("weight_map.model.norm.weight"), std::string::npos) << e;
    EXPECT_NE(e.find("does not exist"), std::string::npos) << e;
    json wrong_shard = index;
    // The norm placed in a shard that does not hold it.
    for (const auto& [name, file] : index["weight_map"].items())
        if (file != index["weight_map"]["model.norm.weight"]) {
            wrong_shard["weight_map"]["model.norm.weight"] = file;
            break;
        }
    e = attempt(wrong_shard.dump());
    EXPECT_NE(e.find("has no tensor 'model.norm.weight'"), std::string::npos) << e;
    json hidden = index;
    hidden["weight_map"].erase("model.norm.weight");
    e = attempt(hidden.dump());
    EXPECT_NE(e.find("'model.norm.weight' is not in"), std::string::npos) << e;
    std::string dup = index.dump();
    dup.insert(dup.find("\"weight_map\":{") + 14,
               "\"model.norm.weight\":\"" +
                   index["weight_map"]["model.norm.weight"].get<std::string>() + "\",");
    e = attempt(dup);
    EXPECT_NE(e.find("appears twice"), std::string::npos) << e;
    json escape = index;
    escape["weight_map"]["model.norm.weight"] = "../x.safetensors";
    e = attempt(escape.dump());
    EXPECT_NE(e.find("same directory"), std::string::npos) << e;
    write_file_atomic(index_path, index.dump());

    // Configs the engine does not compute exactly.
    json cfg = read_json_file(dir / "hf/config.json");
    json scaled = cfg;
    scaled["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
    write_file_atomic(dir / "hf/config.json", scaled.dump());
    e = error_of([&] { interop::import_hf(dir / "hf", dir / "back", {}); });
    EXPECT_NE(e.find("rope_scaling"), std::string::npos) << e;
    json qwen = cfg;
    qwen["model_type"] = "qwen2";
    write_file_atomic(dir / "hf/config.json", qwen.dump());
    e = error_of([&] { interop::import_hf(dir / "hf", dir / "back", {}); });
    EXPECT_NE(e.find("qwen2"), std::string::npos) << e;
    write_file_atomic(dir / "hf/config.json", cfg.dump());
    fs::remove(dir / "hf/tokenizer.model");
    e = error_of([&] { interop::import_hf(dir / "hf", dir / "back", {}); });
    EXPECT_NE(e.find("tokenizer.model"), std::string::npos) << e;
    EXPECT_FALSE(fs::exists(dir / "back"));
}

TEST(HfExport, ShardSizesParseAsHuggingFaceWritesThem) {
    EXPECT_EQ(interop::parse_byte_size("5GB", "--shard-size"), 5'000'000'000u);
    EXPECT_EQ(interop::parse_byte_size("500MB", "--shard-size"), 500'000'000u);
    EXPECT_EQ(interop::parse_byte_size("2GiB", "--shard-size"), 2ull << 30);
    EXPECT_EQ(interop::parse_byte_size("123", "--shard-size"), 123u);
    for (const char* bad : {"", "0", "5XB", "GB", "-5GB", "99999999999999999999GB"})
        EXPECT_NE(
            error_of([&] { interop::parse_byte_size(bad, "--shard-size"); }).find("--shard-size"),
            std::string::npos)
            << bad;
}

}  // namespace
}  // namespace tmx

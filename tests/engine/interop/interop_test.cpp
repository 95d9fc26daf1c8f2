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
#include "engine/interop/hf_tokenizer.h"
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
    // tokenizer.json beside tokenizer.model, loaded as it is (hf_tokenizer_test checks that
    // Hugging Face's library encodes with it as tmx does).
    EXPECT_EQ(tok_cfg.at("tokenizer_class"), "PreTrainedTokenizerFast");
    EXPECT_EQ(read_file(dir / "hf/tokenizer.json"),
              interop::tokenizer_json(Tokenizer::load(tokenizer_), true));
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

// Dense models: Mistral (a window) and Llama (none; with every bias Llama's attention_bias and
// mlp_bias carry) round trip through Hugging Face bit-exactly, under the names those classes
// use (gate_proj, up_proj, down_proj); Mistral through GGUF in F16 and BF16 too, within their
// rounding. A config without head_dim reads as hidden_size / heads.
TEST_F(Interop, DenseMistralAndLlamaRoundTrip) {
    TempDir dir;
    for (const bool llama : {false, true}) {
        SCOPED_TRACE(llama ? "llama" : "mistral");
        ModelConfig c = tiny_mixtral(kVocab);
        c.n_experts = 0;
        c.top_k = 1;
        if (llama) {
            c.sliding_window = 0;
            c.attn_bias = c.ffn_bias = true;
        }
        auto backend = make_backend("cpu");
        Model model(c, *backend);
        model.init_random(test::fresh_seed());
        CheckpointWriteOptions w;
        w.tokenizer_path = tokenizer_;
        w.overwrite = true;
        save_checkpoint(model, dir / "ck", w);
        interop::HfExportOptions h;
        h.overwrite = true;
        EXPECT_EQ(interop::export_hf(dir / "ck", dir / "hf", h).architecture,
                  llama ? "LlamaForCausalLM" : "MistralForCausalLM");
        const SafetensorsFile exported(dir / "hf/model.safetensors");
        EXPECT_TRUE(exported.entries().count("model.layers.1.mlp.gate_proj.weight"));
        EXPECT_TRUE(exported.entries().count("model.layers.1.mlp.down_proj.weight"));
        EXPECT_EQ(exported.entries().count("model.layers.1.mlp.up_proj.bias"), llama ? 1u : 0u);
        json cfg = read_json_file(dir / "hf/config.json");
        cfg.erase("head_dim");  // 64 / 4 = 16, as the config says
        write_file_atomic(dir / "hf/config.json", cfg.dump());
        interop::ImportOptions o;
        o.overwrite = true;
        interop::import_hf(dir / "hf", dir / "back", o);
        EXPECT_EQ(read_file(dir / "back/model.safetensors"),
                  read_file(dir / "ck/model.safetensors"));
        EXPECT_EQ(read_file(dir / "back/config.json"), read_file(dir / "ck/config.json"));
        if (llama) continue;  // GGUF carries no biases
        for (const gguf::TensorType t : {gguf::TensorType::F16, gguf::TensorType::BF16}) {
            interop::GgufExportOptions g;
            g.dtype = t;
            g.overwrite = true;
            interop::export_gguf(dir / "ck", dir / "m.gguf", g);
            interop::import_gguf(dir / "m.gguf", dir / "gback", o);
            const SafetensorsFile a(dir / "ck/model.safetensors"),
                b(dir / "gback/model.safetensors");
            const float rel =
                t == gguf::TensorType::BF16 ? std::ldexp(1.0f, -8) : std::ldexp(1.0f, -11);
            for (const auto& [name, e] : a.entries()) {
                std::vector<float> x(static_cast<size_t>(shape_numel(e.shape))), y(x.size());
                a.read_f32(name, x.data());
                b.read_f32(name, y.data());
                for (size_t i = 0; i < x.size(); ++i)
                    ASSERT_LE(std::fabs(x[i] - y[i]), rel * std::fabs(x[i]) + 1e-7f) << name;
            }
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

// The exported file read byte by byte as the GGUF spec lays it out, without our reader: the
// header, each metadata key in order with its value type, the tensor infos (names, dims fastest
// first, types, offsets aligned to 32 and packed), and one Q8_0 block computed by hand from the
// checkpoint's values.
TEST_F(Interop, GgufExportFollowsTheSpecByteByByte) {
    TempDir dir;
    interop::GgufExportOptions q;
    q.dtype = gguf::TensorType::Q8_0;
    interop::export_gguf(checkpoint_, dir / "m.gguf", q);
    const std::string b = read_file(dir / "m.gguf");
    size_t pos = 0;
    auto u32 = [&] {
        uint32_t v = 0;
        for (int i = 0; i < 4; ++i) v |= uint32_t(uint8_t(b.at(pos + i))) << (8 * i);
        pos += 4;
        return v;
    };
    auto u64 = [&] {
        uint64_t v = 0;
        for (int i = 0; i < 8; ++i) v |= uint64_t(uint8_t(b.at(pos + i))) << (8 * i);
        pos += 8;
        return v;
    };
    auto str = [&] {
        const uint64_t n = u64();
        std::string s = b.substr(pos, n);
        pos += n;
        return s;
    };
    ASSERT_EQ(b.substr(0, 4), "GGUF");
    pos = 4;
    EXPECT_EQ(u32(), 3u);
    const uint64_t n_tensors = u64(), n_kv = u64();
    // 1 + 2 layers x (6 + router + 3 stacks) + output_norm + output = 23 tensors.
    EXPECT_EQ(n_tensors, 23u);
    const std::vector<std::pair<std::string, uint32_t>> expected_kv = {
        {"general.architecture", 8},
        {"general.name", 8},
        {"general.file_type", 4},
        {"general.quantization_version", 4},
        {"llama.vocab_size", 4},
        {"llama.context_length", 4},
        {"llama.embedding_length", 4},
        {"llama.block_count", 4},
        {"llama.feed_forward_length", 4},
        {"llama.attention.head_count", 4},
        {"llama.attention.head_count_kv", 4},
        {"llama.attention.key_length", 4},
        {"llama.attention.value_length", 4},
        {"llama.rope.freq_base", 6},
        {"llama.rope.dimension_count", 4},
        {"llama.attention.layer_norm_rms_epsilon", 6},
        {"llama.expert_count", 4},
        {"llama.expert_used_count", 4},
        {"llama.attention.sliding_window", 4},
        {"tmx.rope_theta", 12},
        {"tmx.norm_eps", 12},
        {"tmx.router_aux_loss_coef", 12},
        {"tokenizer.ggml.model", 8},
        {"tokenizer.ggml.pre", 8},
        {"tokenizer.ggml.tokens", 9},
        {"tokenizer.ggml.scores", 9},
        {"tokenizer.ggml.token_type", 9},
        {"tokenizer.ggml.bos_token_id", 4},
        {"tokenizer.ggml.eos_token_id", 4},
        {"tokenizer.ggml.unknown_token_id", 4},
        {"tokenizer.ggml.add_bos_token", 7},
        {"tokenizer.ggml.add_eos_token", 7}};
    ASSERT_EQ(n_kv, expected_kv.size());
    const Tokenizer tok = Tokenizer::load(tokenizer_);
    for (const auto& [key, type] : expected_kv) {
        ASSERT_EQ(str(), key);
        ASSERT_EQ(u32(), type) << key;
        switch (type) {
            case 4: {
                const uint32_t v = u32();
                if (key == "llama.embedding_length") {
                    EXPECT_EQ(v, 64u);
                }
                if (key == "llama.expert_count") {
                    EXPECT_EQ(v, 4u);
                }
                if (key == "general.file_type") {
                    EXPECT_EQ(v, 7u);  // mostly Q8_0
                }
                if (key == "llama.rope.dimension_count") {
                    EXPECT_EQ(v, 16u);
                }
                break;
            }
            case 6:
                pos += 4;
                break;
            case 7:
                EXPECT_EQ(uint8_t(b.at(pos)), key.ends_with("bos_token") ? 1 : 0);
                pos += 1;
                break;
            case 8:
                str();
                break;
            case 12:
                pos += 8;
                break;
            case 9: {
                const uint32_t elem = u32();
                const uint64_t count = u64();
                EXPECT_EQ(count, static_cast<uint64_t>(tok.vocab_size())) << key;
                if (elem == 8) {
                    for (uint64_t i = 0; i < count; ++i)
                        EXPECT_EQ(str(), tok.piece(static_cast<int32_t>(i)));
                } else {
                    EXPECT_EQ(elem, key.ends_with("scores") ? 6u : 5u) << key;  // f32, i32
                    pos += count * 4;
                }
                break;
            }
        }
    }
    struct Info {
        std::string name;
        std::vector<uint64_t> dims;
        uint32_t type;
        uint64_t offset;
    };
    std::vector<Info> infos;
    for (uint64_t t = 0; t < n_tensors; ++t) {
        Info in;
        in.name = str();
        const uint32_t nd = u32();
        for (uint32_t d = 0; d < nd; ++d) in.dims.push_back(u64());
        in.type = u32();
        in.offset = u64();
        infos.push_back(in);
    }
    const size_t data = (pos + 31) / 32 * 32;  // the data section starts aligned
    for (size_t i = pos; i < data; ++i) EXPECT_EQ(b[i], 0) << "padding byte " << i;
    EXPECT_EQ(infos[0].name, "token_embd.weight");
    EXPECT_EQ(infos[0].dims, (std::vector<uint64_t>{64, kVocab}));
    uint64_t expect_offset = 0;
    for (const Info& in : infos) {
        SCOPED_TRACE(in.name);
        EXPECT_EQ(in.offset, expect_offset);
        uint64_t numel = 1;
        for (uint64_t d : in.dims) numel *= d;
        const bool one_d = in.dims.size() == 1,
                   router = in.name.find("ffn_gate_inp") != std::string::npos;
        EXPECT_EQ(in.type, one_d || router ? 0u : 8u);  // norms and router F32, matrices Q8_0
        const uint64_t bytes = in.type == 8 ? numel / 32 * 34 : numel * 4;
        expect_offset = (in.offset + bytes + 31) / 32 * 32;
    }
    EXPECT_EQ(b.size(), data + expect_offset);
    // blk.0.ffn_gate_exps: [in 64, out 96, E 4]; its first block is expert 0's w1 row 0, [0, 32).
    const Info* gate = nullptr;
    for (const Info& in : infos)
        if (in.name == "blk.0.ffn_gate_exps.weight") gate = &in;
    ASSERT_NE(gate, nullptr);
    EXPECT_EQ(gate->dims, (std::vector<uint64_t>{64, 96, 4}));
    const SafetensorsFile ck(checkpoint_ + "/model.safetensors");
    std::vector<float> w1(96 * 64);
    ck.read_f32("model.layers.0.block_sparse_moe.experts.0.w1.weight", w1.data());
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(w1[i]));
    const float d = amax / 127;
    const uint16_t d16 = f32_to_f16(d);
    const size_t at = data + gate->offset;
    EXPECT_EQ(uint8_t(b[at]) | uint16_t(uint8_t(b[at + 1])) << 8, d16);
    for (int i = 0; i < 32; ++i)
        EXPECT_EQ(int8_t(b[at + 2 + i]), static_cast<int8_t>(std::lround(w1[i] * (1.0f / d)))) << i;
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
    // Without tokenizer.model, its tokenizer.json is the checkpoint's tokenizer; without either,
    // the import is refused.
    fs::remove(dir / "hf/tokenizer.model");
    interop::import_hf(dir / "hf", dir / "back", {});
    EXPECT_TRUE(fs::exists(dir / "back/tokenizer.json"));
    EXPECT_FALSE(fs::exists(dir / "back/tokenizer.model"));
    fs::remove_all(dir / "back");
    fs::remove(dir / "hf/tokenizer.json");
    e = error_of([&] { interop::import_hf(dir / "hf", dir / "back", {}); });
    EXPECT_NE(e.find("no tokenizer.model or tokenizer.json"), std::string::npos) << e;
    EXPECT_FALSE(fs::exists(dir / "back"));
}

// A config whose sizes disagree with the tensors: the HF import names the tensor and both
// shapes; a GGUF whose metadata disagrees with a tensor's dims names the tensor; an extra tensor
// is refused by name. Nothing is written under the output name.
TEST_F(Interop, ShapeAndTensorMismatchesAreRefusedNamingTheTensor) {
    TempDir dir;
    interop::export_hf(checkpoint_, dir / "hf", {});
    json cfg = read_json_file(dir / "hf/config.json");
    cfg["intermediate_size"] = 80;
    write_file_atomic(dir / "hf/config.json", cfg.dump());
    std::string e = error_of([&] { interop::import_hf(dir / "hf", dir / "back", {}); });
    EXPECT_NE(e.find("has shape [96, 64], but config.json needs [80, 64]"), std::string::npos) << e;
    EXPECT_NE(e.find("experts.0.w1.weight"), std::string::npos) << e;
    EXPECT_FALSE(fs::exists(dir / "back"));

    interop::export_gguf(checkpoint_, dir / "m.gguf", {});
    // Copy the file with one metadata value changed, or one tensor added.
    auto rewrite = [&](const std::string& out, const std::string& key, gguf::Value v,
                       bool extra_tensor) {
        const gguf::Reader r(dir / "m.gguf");
        gguf::Writer w(out);
        for (const auto& [k, value] : r.metadata()) w.add(k, k == key ? v : value);
        for (const auto& t : r.tensors()) w.add_tensor(t.name, t.dims, t.type);
        if (extra_tensor) w.add_tensor("blk.0.attn_q.bias", {64}, gguf::TensorType::F32);
        w.write_header();
        std::string bytes;
        for (const auto& t : r.tensors()) {
            bytes.resize(t.bytes);
            r.read_raw(t, 0, t.bytes, bytes.data());
            w.append(bytes.data(), bytes.size());
        }
        if (extra_tensor) {
            const std::vector<float> zeros(64, 0.5f);
            w.append_f32(zeros.data(), zeros.size());
        }
        w.finish();
    };
    rewrite(dir / "ff.gguf", "llama.feed_forward_length", gguf::Value::u32(80), false);
    e = error_of([&] { interop::import_gguf(dir / "ff.gguf", dir / "back", {}); });
    EXPECT_NE(e.find("ff.gguf: tensor 'blk.0.ffn_gate_exps.weight' has dims [64, 96, 4]"),
              std::string::npos)
        << e;
    rewrite(dir / "extra.gguf", "", {}, true);
    e = error_of([&] { interop::import_gguf(dir / "extra.gguf", dir / "back", {}); });
    EXPECT_NE(e.find("unexpected tensor 'blk.0.attn_q.bias'"), std::string::npos) << e;
    rewrite(dir / "arch.gguf", "general.architecture", gguf::Value::string("qwen2"), false);
    e = error_of([&] { interop::import_gguf(dir / "arch.gguf", dir / "back", {}); });
    EXPECT_NE(e.find("'general.architecture' is \"qwen2\""), std::string::npos) << e;
    rewrite(dir / "rope.gguf", "llama.rope.dimension_count", gguf::Value::u32(8), false);
    e = error_of([&] { interop::import_gguf(dir / "rope.gguf", dir / "back", {}); });
    EXPECT_NE(e.find("llama.rope.dimension_count"), std::string::npos) << e;
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

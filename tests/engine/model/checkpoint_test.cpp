#include "engine/model/checkpoint.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "backends/registry.h"
#include "engine/core/errors.h"
#include "engine/core/file_io.h"
#include "tests/test_util.h"

namespace tmx {
namespace {

namespace fs = std::filesystem;

ModelConfig tiny_config() {
    return load_config(test::source_dir() + "/assets/configs/test-tiny.json");
}

// Saves a freshly initialised test-tiny checkpoint into dir and returns its parameters.
std::vector<float> save_random(Backend& be, const std::string& dir, uint64_t seed,
                               StorageType dtype = StorageType::F32) {
    Model m(tiny_config(), be);
    m.init_random(seed);
    std::vector<float> p = m.params_to_host();
    // Perturb norms and biases too, so a mix-up among them would show.
    Rng rng(seed);
    for (auto& x : p) x += static_cast<float>(0.01 * rng.normal());
    m.params_from_host(p);
    CheckpointWriteOptions o;
    o.dtype = dtype;
    o.overwrite = true;
    save_checkpoint(m, dir, o);
    return p;
}

std::string load_error(const std::string& dir) {
    auto be = make_backend("cpu");
    try {
        load_model(dir, *be);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

// Rewrites the checkpoint's model.safetensors with the tensors edited by `edit`.
void rewrite_tensors(const std::string& dir,
                     const std::function<void(std::vector<HostTensorRef>&)>& edit) {
    auto be = make_backend("cpu");
    auto m = load_model(dir, *be);
    std::vector<float> host = m->params_to_host();
    std::vector<HostTensorRef> refs;
    for (const auto& s : m->layout().specs)
        refs.push_back({s.name, s.shape, host.data() + s.offset});
    edit(refs);
    write_file_atomic(dir + "/model.safetensors", encode_safetensors(refs, StorageType::F32));
}

class CheckpointTest : public ::testing::Test {
  protected:
    void SetUp() override {
        seed = test::fresh_seed();
        dir = tmp / "ckpt";
    }
    uint64_t seed = 0;
    test::TempDir tmp;
    std::string dir;
};

TEST_F(CheckpointTest, F32RoundTripIsBitExact) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    auto be = make_backend("cpu");
    std::vector<float> saved = save_random(*be, dir, seed);
    auto loaded = load_model(dir, *be);
    EXPECT_EQ(loaded->params_to_host(), saved);
    EXPECT_EQ(config_to_json(loaded->config()), config_to_json(tiny_config()));
    nlohmann::json cfg = read_json_file(dir + "/config.json");
    EXPECT_EQ(cfg["format_version"], kCheckpointFormatVersion);
}

TEST_F(CheckpointTest, Bf16RoundTripRoundsTheWeightsToNearestBf16) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    auto be = make_backend("cpu");
    std::vector<float> saved = save_random(*be, dir, seed, StorageType::BF16);
    auto model = load_model(dir, *be);
    EXPECT_EQ(model->weight_format(), DType::BF16);  // the cpu backend keeps the file's format
    std::vector<float> loaded = model->params_to_host();
    ASSERT_EQ(loaded.size(), saved.size());
    int64_t rounded = 0;
    for (const ParamSpec& s : model->layout().specs) {
        const bool weight = stored_dtype(s, DType::BF16) == DType::BF16;
        rounded += weight ? s.numel() : 0;
        for (int64_t j = 0; j < s.numel(); ++j) {
            const size_t i = static_cast<size_t>(s.offset + j);
            // The norms, biases and router stay f32.
            ASSERT_EQ(loaded[i], weight ? bf16_to_f32(f32_to_bf16(saved[i])) : saved[i]) << s.name;
            ASSERT_LE(std::abs(loaded[i] - saved[i]), std::abs(saved[i]) * (1.0f / 256)) << i;
        }
    }
    EXPECT_GT(rounded, static_cast<int64_t>(saved.size()) * 9 / 10);
    // Saving the loaded bf16 values again as bf16 gives the identical file.
    std::string first = read_file(dir + "/model.safetensors");
    auto m = load_model(dir, *be);
    CheckpointWriteOptions o{.dtype = StorageType::BF16, .overwrite = true};
    save_checkpoint(*m, dir, o);
    EXPECT_EQ(read_file(dir + "/model.safetensors"), first);
}

TEST(Bf16, ConversionRoundsToNearestEven) {
    EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
    EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
    // 1 + 2^-8 is halfway between bf16 1.0 and 1.0078125: ties go to the even mantissa (1.0).
    EXPECT_EQ(f32_to_bf16(1.0f + 0x1.0p-8f), 0x3f80);
    EXPECT_EQ(f32_to_bf16(1.0f + 0x1.8p-8f), 0x3f81);
    EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
    EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
    EXPECT_EQ(f16_to_f32(0xc000), -2.0f);
    EXPECT_EQ(f16_to_f32(0x0001), 0x1.0p-24f);
}

TEST_F(CheckpointTest, MissingTensorIsNamed) {
    save_random(*make_backend("cpu"), dir, seed);
    rewrite_tensors(dir, [](auto& refs) {
        std::erase_if(refs,
                      [](auto& r) { return r.name == "model.layers.1.self_attn.v_proj.weight"; });
    });
    std::string e = load_error(dir);
    EXPECT_NE(e.find("missing tensor 'model.layers.1.self_attn.v_proj.weight'"), std::string::npos)
        << e;
    EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;
}

TEST_F(CheckpointTest, ExtraTensorIsNamed) {
    save_random(*make_backend("cpu"), dir, seed);
    static const float extra[3] = {1, 2, 3};
    rewrite_tensors(dir, [](auto& refs) { refs.push_back({"model.extra.weight", {3}, extra}); });
    std::string e = load_error(dir);
    EXPECT_NE(e.find("unexpected tensor 'model.extra.weight'"), std::string::npos) << e;
}

TEST_F(CheckpointTest, MisShapedTensorIsNamedWithBothShapes) {
    save_random(*make_backend("cpu"), dir, seed);
    rewrite_tensors(dir, [](auto& refs) {
        for (auto& r : refs)
            if (r.name == "model.layers.0.self_attn.q_proj.weight") r.shape = {16, 64};
    });
    std::string e = load_error(dir);
    EXPECT_NE(e.find("'model.layers.0.self_attn.q_proj.weight' has shape [16, 64]"),
              std::string::npos)
        << e;
    EXPECT_NE(e.find("[32, 32]"), std::string::npos) << e;
}

// Weights saved from a diverged run (or corrupted) load as an error naming the first tensor in
// layout order that holds NaN or infinity, whatever the storage dtype.
TEST_F(CheckpointTest, NonFiniteWeightsAreErrorsNamingTheFirstSuchTensor) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    auto be = make_backend("cpu");
    const std::vector<float> clean = save_random(*be, dir, seed);
    const ParamLayout layout = model_param_layout(tiny_config());
    // Rewrites the checkpoint's weights with the given values set.
    auto poison = [&](const std::vector<std::pair<std::string, float>>& values, StorageType dtype) {
        std::vector<float> host = clean;
        for (const auto& [name, value] : values) host[layout.find(name)->offset + 5] = value;
        std::vector<HostTensorRef> refs;
        for (const auto& s : layout.specs)
            refs.push_back({s.name, s.shape, host.data() + s.offset});
        write_file_atomic(dir + "/model.safetensors", encode_safetensors(refs, dtype));
    };
    const std::string attn = "model.layers.1.self_attn.o_proj.weight", head = "lm_head.weight";
    poison({{head, NAN}, {attn, NAN}}, StorageType::F32);
    std::string e = load_error(dir);
    EXPECT_NE(e.find("model.safetensors: tensor '" + attn + "' holds NaN at element 5"),
              std::string::npos)
        << e;
    poison({{head, -INFINITY}}, StorageType::BF16);
    e = load_error(dir);
    EXPECT_NE(e.find("model.safetensors: tensor '" + head + "' holds infinity at element 5"),
              std::string::npos)
        << e;
    poison({}, StorageType::F32);
    EXPECT_EQ(load_error(dir), "");
}

TEST_F(CheckpointTest, TruncatedFileIsReported) {
    save_random(*make_backend("cpu"), dir, seed);
    std::string bytes = read_file(dir + "/model.safetensors");
    write_file_atomic(dir + "/model.safetensors", bytes.substr(0, bytes.size() - 100));
    std::string e = load_error(dir);
    EXPECT_NE(e.find("truncated"), std::string::npos) << e;
    write_file_atomic(dir + "/model.safetensors", bytes.substr(0, 5));
    e = load_error(dir);
    EXPECT_NE(e.find("truncated"), std::string::npos) << e;
}

TEST_F(CheckpointTest, CorruptHeaderIsReported) {
    save_random(*make_backend("cpu"), dir, seed);
    std::string bytes = read_file(dir + "/model.safetensors");
    bytes[9] = '#';  // inside the JSON header
    write_file_atomic(dir + "/model.safetensors", bytes);
    EXPECT_NE(load_error(dir).find("corrupt header"), std::string::npos);
    bytes[0] = '\xff';  // a header length far beyond the file
    bytes[5] = '\x7f';
    write_file_atomic(dir + "/model.safetensors", bytes);
    EXPECT_NE(load_error(dir).find("header"), std::string::npos);
}

TEST_F(CheckpointTest, UnreadableDtypeIsNamed) {
    save_random(*make_backend("cpu"), dir, seed);
    std::string bytes = read_file(dir + "/model.safetensors");
    // Re-label the first tensor as 32-bit integers: a dtype no checkpoint of ours holds.
    size_t at = bytes.find("\"F32\"");
    ASSERT_NE(at, std::string::npos);
    bytes.replace(at, 5, "\"I32\"");
    write_file_atomic(dir + "/model.safetensors", bytes);
    std::string e = load_error(dir);
    EXPECT_NE(e.find("dtype I32 cannot be read"), std::string::npos) << e;
}

TEST_F(CheckpointTest, MissingFilesAreNamed) {
    EXPECT_NE(load_error(tmp / "nowhere").find("no such checkpoint directory"), std::string::npos);
    save_random(*make_backend("cpu"), dir, seed);
    fs::remove(dir + "/model.safetensors");
    EXPECT_NE(load_error(dir).find("model.safetensors: missing"), std::string::npos);
    fs::remove(dir + "/config.json");
    EXPECT_NE(load_error(dir).find("config.json"), std::string::npos);
}

TEST_F(CheckpointTest, RefusesToOverwriteWithoutPermissionAndLeavesNoTemporaries) {
    auto be = make_backend("cpu");
    std::vector<float> first = save_random(*be, dir, seed);
    Model m(tiny_config(), *be);
    m.init_random(seed + 1);
    EXPECT_THROW(save_checkpoint(m, dir), Error);
    EXPECT_EQ(load_model(dir, *be)->params_to_host(), first);  // untouched
    save_checkpoint(m, dir, {.overwrite = true});
    EXPECT_EQ(load_model(dir, *be)->params_to_host(), m.params_to_host());
    for (const auto& entry : fs::directory_iterator(tmp.path()))
        EXPECT_EQ(entry.path().filename(), "ckpt") << "left behind: " << entry.path();
    // A directory that is not a checkpoint is never replaced.
    fs::create_directory(tmp / "notes");
    test::write_text(tmp / "notes/todo.txt", "keep me");
    EXPECT_THROW(save_checkpoint(m, tmp / "notes", {.overwrite = true}), Error);
    EXPECT_EQ(read_file(tmp / "notes/todo.txt"), "keep me");
}

TEST_F(CheckpointTest, CopiesTheTokenizer) {
    auto be = make_backend("cpu");
    Model m(tiny_config(), *be);
    m.init_random(seed);
    test::write_text(tmp / "tok.model", "not really a tokenizer");
    save_checkpoint(m, dir, {.tokenizer_path = tmp / "tok.model"});
    EXPECT_EQ(read_file(checkpoint_tokenizer(dir)), "not really a tokenizer");
}

}  // namespace
}  // namespace tmx

// tmx export and tmx import end to end, through the built binary, as a user runs them.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/core/file_io.h"
#include "engine/core/rng.h"
#include "tests/test_util.h"

namespace tmx {
namespace {

// A tokenizer trained with `tmx tokenizer train` and a checkpoint made with `tmx init`.
class InteropCli : public ::testing::Test {
  protected:
    void SetUp() override {
        Rng rng(test::fresh_seed());
        // d_model 64: rows of whole Q8_0 blocks.
        ASSERT_EQ(test::make_cli_checkpoint(tmp_, rng, R"({"d_model": 64})", 11), ckpt_);
    }
    test::TempDir tmp_;
    std::string ckpt_ = tmp_ / "ckpt";
};

TEST_F(InteropCli, ExportAndImportRoundTripThroughBothFormats) {
    auto r = test::run_tmx("export --model " + ckpt_ + " --format hf --out " + tmp_ / "hf");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("MixtralForCausalLM"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("with tokenizer (tokenizer.model, tokenizer.json)"), std::string::npos)
        << r.out;
    EXPECT_TRUE(std::filesystem::exists(tmp_ / "hf/tokenizer.json"));
    r = test::run_tmx("import --from " + tmp_ / "hf" + " --out " + tmp_ / "back");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(read_file(tmp_ / "back/model.safetensors"), read_file(ckpt_ + "/model.safetensors"));

    r = test::run_tmx("export --model " + ckpt_ + " --format gguf --dtype q8_0 --out " +
                      tmp_ / "m.gguf");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    r = test::run_tmx("import --from " + tmp_ / "m.gguf" + " --out " + tmp_ / "fromgguf");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("GGUF llama"), std::string::npos) << r.out;
    // Every command takes the imported checkpoint: eval scores text with its own tokenizer.
    write_file_atomic(tmp_ / "story.txt", "once upon a time there was a little fox\n");
    r = test::run_tmx("eval --model " + tmp_ / "fromgguf" + " --backend cpu --text-file " +
                      tmp_ / "story.txt" + " --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto a = nlohmann::json::parse(r.out);
    r = test::run_tmx("eval --model " + ckpt_ + " --backend cpu --text-file " + tmp_ / "story.txt" +
                      " --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto b = nlohmann::json::parse(r.out);
    EXPECT_EQ(a["tokens"], b["tokens"]);
    EXPECT_NEAR(a["loss"].get<double>(), b["loss"].get<double>(), 0.02 * b["loss"].get<double>());
}

TEST_F(InteropCli, RefusalsExitNonZeroNamingTheProblemAndWriteNothing) {
    // The seed's LayerNorm + GELU flavour has no Hugging Face or GGUF class.
    auto r = test::run_tmx("init --config " + test::source_dir() +
                           "/assets/configs/test-tiny.json --out " + tmp_ / "ln");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    r = test::run_tmx("export --model " + tmp_ / "ln" + " --format hf --out " + tmp_ / "x");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("ffn_type"), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(tmp_ / "x"));
    r = test::run_tmx("export --model " + ckpt_ + " --format hf --dtype q8_0 --out " + tmp_ / "x");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("q8_0"), std::string::npos) << r.err;
    r = test::run_tmx("export --model " + ckpt_ + " --format hf --shard-size 5XB --out " +
                      tmp_ / "x");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("--shard-size"), std::string::npos) << r.err;
    ASSERT_EQ(test::run_tmx("export --model " + ckpt_ + " --format gguf --out " + tmp_ / "m.gguf")
                  .exit_code,
              0);
    r = test::run_tmx("export --model " + ckpt_ + " --format gguf --out " + tmp_ / "m.gguf");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("--force"), std::string::npos) << r.err;
    write_file_atomic(tmp_ / "junk.gguf", "GGUF\x03\0\0\0junk");
    r = test::run_tmx("import --from " + tmp_ / "junk.gguf" + " --out " + tmp_ / "y");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("junk.gguf"), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(tmp_ / "y"));
}

}  // namespace
}  // namespace tmx

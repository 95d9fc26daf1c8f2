// tmx init and tmx eval end to end, through the built binary.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "backends/registry.h"
#include "engine/core/file_io.h"
#include "engine/model/checkpoint.h"
#include "tests/test_util.h"

namespace tmx {
namespace {

std::string tiny_config() {
    return test::source_dir() + "/assets/configs/test-tiny.json";
}

TEST(InitEvalCli, InitThenEvalMatchesTheEngine) {
    test::TempDir tmp;
    const std::string dir = tmp / "ckpt";
    auto r = test::run_tmx("init --config " + tiny_config() + " --out " + dir + " --seed 5");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("parameters"), std::string::npos);

    // Same seed, same weights, whether written by the CLI or built in process.
    auto be = make_backend("cpu");
    auto loaded = load_model(dir, *be);
    Model fresh(load_config(tiny_config()), *be);
    fresh.init_random(5);
    EXPECT_EQ(loaded->params_to_host(), fresh.params_to_host());

    const std::vector<int32_t> tokens = {1, 50, 3, 77, 12, 96, 0, 41};
    // On the CPU, as the in-process score below (auto would take a GPU in bf16 where one is).
    r = test::run_tmx("eval --model " + dir +
                      " --backend cpu --tokens 1,50,3,77,12,96,0,41 --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    nlohmann::json j = nlohmann::json::parse(r.out);
    TokenScore s = score_tokens(*loaded, tokens, loaded->config().max_seq_len);
    EXPECT_EQ(j["tokens"], 7);
    EXPECT_NEAR(j["loss"].get<double>(), s.total_nats / 7, 1e-9);
    EXPECT_NEAR(j["ppl"].get<double>(), std::exp(s.total_nats / 7), 1e-6);
    EXPECT_TRUE(j["tokens"].is_number_integer());
    EXPECT_EQ(j["backend"], "cpu");
    EXPECT_EQ(j["precision"], "fp32");
    // The JSON says which precision scored: bf16 moves the loss by bf16's rounding, not more.
    r = test::run_tmx("eval --model " + dir +
                      " --backend cpu --precision bf16 --tokens 1,50,3,77,12,96,0,41 --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const nlohmann::json b = nlohmann::json::parse(r.out);
    EXPECT_EQ(b["precision"], "bf16");
    EXPECT_NE(b["loss"].get<double>(), j["loss"].get<double>());
    EXPECT_NEAR(b["loss"].get<double>(), j["loss"].get<double>(), 1e-2 * j["loss"].get<double>());
}

TEST(InitEvalCli, RefusesToOverwriteWithoutForce) {
    test::TempDir tmp;
    const std::string dir = tmp / "ckpt";
    ASSERT_EQ(test::run_tmx("init --config " + tiny_config() + " --out " + dir).exit_code, 0);
    auto r = test::run_tmx("init --config " + tiny_config() + " --out " + dir + " --seed 9");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("--force"), std::string::npos) << r.err;
    EXPECT_EQ(
        test::run_tmx("init --config " + tiny_config() + " --out " + dir + " --force").exit_code,
        0);
}

TEST(InitEvalCli, BadInputsGiveClearErrorsAndExitCodes) {
    test::TempDir tmp;
    const std::string dir = tmp / "ckpt";
    ASSERT_EQ(test::run_tmx("init --config " + tiny_config() + " --out " + dir).exit_code, 0);

    auto r = test::run_tmx("eval --model " + dir + " --tokens 1,x,3");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("--tokens"), std::string::npos) << r.err;

    r = test::run_tmx("eval --model " + dir + " --tokens 5");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("at least 2"), std::string::npos) << r.err;

    // The last id is only a target, never embedded: it used to reach the loss unchecked and
    // come back as an internal error.
    for (const char* ids : {"1,2,500", "500,1,2", "1,2,97", "1,2,99999999999999999999"}) {
        r = test::run_tmx("eval --model " + dir + " --tokens " + ids);
        EXPECT_EQ(r.exit_code, 2) << ids;
        EXPECT_NE(r.err.find("--tokens: token id "), std::string::npos) << r.err;
        EXPECT_NE(r.err.find(" is out of range (the vocabulary has 97 ids: 0 to 96)"),
                  std::string::npos)
            << r.err;
    }

    r = test::run_tmx("eval --model " + (tmp / "missing") + " --tokens 1,2");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("no such checkpoint"), std::string::npos) << r.err;

    test::write_text(tmp / "bad.json", R"({"d_model": 64, "n_heads": 3, "n_kv_heads": 2})");
    r = test::run_tmx("init --config " + (tmp / "bad.json") + " --out " + (tmp / "x"));
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("bad.json: field 'n_heads'"), std::string::npos) << r.err;

    r = test::run_tmx("init --out " + (tmp / "x"));
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("--config"), std::string::npos) << r.err;

    r = test::run_tmx("init --config " + tiny_config() + " --out " + (tmp / "y") + " --dtype f8");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("--dtype"), std::string::npos) << r.err;

    r = test::run_tmx("frobnicate");
    EXPECT_EQ(r.exit_code, 2);
}

// Integer flags say their range in words, and a value outside it (too large for its type, or
// negative for an unsigned one) is an error rather than saturated or wrapped.
TEST(InitEvalCli, IntegerFlagsAreRangeCheckedReadably) {
    test::TempDir tmp;
    const std::string init = "init --config " + tiny_config() + " --out " + (tmp / "ckpt");
    auto r = test::run_tmx(init + " --seed -1");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("tmx: --seed: expected an integer from 0 to 2^64 - 1, got -1"),
              std::string::npos)
        << r.err;
    EXPECT_FALSE(std::filesystem::exists(tmp / "ckpt"));

    r = test::run_tmx(init + " --threads -1");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("tmx: --threads: expected an integer from 0 to 4,096, got -1"),
              std::string::npos)
        << r.err;

    // Past 64 bits: no silent saturation at 2^63 - 1.
    r = test::run_tmx("generate --model " + test::source_dir() +
                      "/assets/demo --prompt hi --max-new-tokens 99999999999999999999");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("--max-new-tokens: expected an integer from 0 to 2^63 - 1, got "
                         "99999999999999999999"),
              std::string::npos)
        << r.err;

    r = test::run_tmx("tokenizer decode --tokenizer " + test::source_dir() +
                      "/assets/demo --ids 1,2,2048");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("--ids: token id 2048 is out of range (the vocabulary has 2048 ids"),
              std::string::npos)
        << r.err;

    ASSERT_EQ(test::run_tmx(init + " --seed 010").exit_code, 0);  // decimal, not octal
    EXPECT_EQ(test::run_tmx(init + "2 --seed 10").exit_code, 0);
    EXPECT_EQ(read_file(tmp / "ckpt/model.safetensors"),
              read_file(tmp / "ckpt2/model.safetensors"));
}

// Every command that loads weights refuses NaN or infinite ones, naming the tensor.
TEST(InitEvalCli, NonFiniteWeightsAreRefusedByEveryCommand) {
    test::TempDir tmp;
    const std::string dir = tmp / "ckpt";
    ASSERT_EQ(test::run_tmx("init --config " + tiny_config() + " --out " + dir).exit_code, 0);
    {
        auto be = make_backend("cpu");
        auto m = load_model(dir, *be);
        std::vector<float> host = m->params_to_host();
        host[m->layout().find("model.norm.weight")->offset] = NAN;
        m->params_from_host(host);
        save_checkpoint(*m, dir, {.overwrite = true});
    }
    for (const std::string& command :
         {"eval --model " + dir + " --tokens 1,2,3",
          "convert --model " + dir + " --out " + (tmp / "converted") + " --dtype bf16"}) {
        auto r = test::run_tmx(command);
        EXPECT_EQ(r.exit_code, 1) << command;
        EXPECT_NE(r.err.find("model.safetensors: tensor 'model.norm.weight' holds NaN"),
                  std::string::npos)
            << command << ": " << r.err;
    }
}

TEST(InitEvalCli, Bf16CheckpointIsHalfTheSize) {
    test::TempDir tmp;
    ASSERT_EQ(test::run_tmx("init --config " + tiny_config() + " --out " + (tmp / "f32")).exit_code,
              0);
    ASSERT_EQ(test::run_tmx("init --config " + tiny_config() + " --out " + (tmp / "bf16") +
                            " --dtype bf16")
                  .exit_code,
              0);
    auto f32 = std::filesystem::file_size(tmp / "f32/model.safetensors");
    auto bf16 = std::filesystem::file_size(tmp / "bf16/model.safetensors");
    EXPECT_NEAR(static_cast<double>(bf16) / static_cast<double>(f32), 0.5, 0.05);
}

}  // namespace
}  // namespace tmx

// Weights in 16 and 8 bits end to end, through the built binary: tmx convert writes them,
// eval and generate run them on every backend present, tmx train refuses 8-bit ones.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "backends/registry.h"
#include "engine/core/file_io.h"
#include "engine/data/prepare.h"
#include "engine/model/checkpoint.h"
#include "tests/test_util.h"

namespace tmx {
namespace {

namespace fs = std::filesystem;

std::string demo() {
    return test::source_dir() + "/assets/demo";
}

// 256 random tokens of the demo's vocabulary, as --tokens takes them: enough that the mean loss
// is not a few tokens' (over 48, one seed in many moved Q8_0's loss by 0.63%; over 256 the
// largest of 15 seeds was 0.08%, against the 0.5% allowed).
std::string token_list(uint64_t seed) {
    Rng rng(seed);
    std::string out;
    for (int i = 0; i < 256; ++i)
        out += (i ? "," : "") + std::to_string(1 + static_cast<int>(rng.below(2047)));
    return out;
}

double eval_loss(const std::string& model, const std::string& backend, const std::string& tokens,
                 const std::string& extra, std::string* err = nullptr) {
    auto r = test::run_tmx("eval --model " + model + " --backend " + backend + " --tokens " +
                           tokens + " --json" + extra);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    if (err) *err = r.err;
    if (r.exit_code != 0) return NAN;
    return nlohmann::json::parse(r.out)["loss"].get<double>();
}

TEST(WeightFormatCli, ConvertedCheckpointsEvaluateCloseToF32OnEveryBackend) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    test::TempDir tmp;
    const std::string tokens = token_list(seed);
    const double f32 = eval_loss(demo(), "cpu", tokens, " --weights f32");
    // The loss moves by each format's rounding and no more (the goals: 16 bits within 0.1%,
    // Q8_0 within 0.5%).
    for (const auto& [format, tolerance] :
         {std::pair{"bf16", 2e-3}, std::pair{"f16", 1e-3}, std::pair{"q8_0", 5e-3}}) {
        SCOPED_TRACE(format);
        const std::string dir = tmp / format;
        auto r =
            test::run_tmx("convert --model " + demo() + " --out " + dir + " --dtype " + format);
        ASSERT_EQ(r.exit_code, 0) << r.err;
        EXPECT_EQ(checkpoint_weight_format(dir), parse_weight_format(format, "format"));
        std::string err;
        const double loss = eval_loss(dir, "cpu", tokens, "", &err);
        EXPECT_NE(err.find(std::string("weights: ") + format + " (as stored)"), std::string::npos)
            << err;
        EXPECT_NEAR(loss, f32, tolerance * f32);
        // The same file widened to f32 as it loads: the decoded weights' loss, as close.
        const double widened = eval_loss(dir, "cpu", tokens, " --weights f32", &err);
        EXPECT_NE(err.find("weights: f32 (as --weights asks)"), std::string::npos) << err;
        EXPECT_NEAR(widened, f32, tolerance * f32);
        for (const std::string backend : {"vulkan", "cuda"}) {
            if (!test::backend_opens(backend)) continue;
            const double there = eval_loss(dir, backend, tokens, " --precision fp32", &err);
            // The GPU backends read every format as stored and multiply the decoded weights in
            // fp32 (x is not quantised): the widened file's loss, to summation order.
            EXPECT_NE(err.find(std::string("weights: ") + format + " (as stored)"),
                      std::string::npos)
                << err;
            EXPECT_NEAR(there, widened, 1e-4 * f32) << backend;
        }
    }
}

TEST(WeightFormatCli, GenerateRunsFromAQ8_0CheckpointAndFromWeightsConvertedAtLoad) {
    test::TempDir tmp;
    ASSERT_EQ(
        test::run_tmx("convert --model " + demo() + " --out " + (tmp / "q8") + " --dtype q8_0")
            .exit_code,
        0);
    const std::string args =
        " --backend cpu --prompt 'Once upon a time' --max-new-tokens 24 "
        "--temperature 0 --json";
    auto stored = test::run_tmx("generate --model " + (tmp / "q8") + args);
    ASSERT_EQ(stored.exit_code, 0) << stored.err;
    EXPECT_NE(stored.err.find("weights: q8_0"), std::string::npos) << stored.err;
    // Quantised as the f32 checkpoint loads: the same blocks, so the same greedy text.
    auto converted = test::run_tmx("generate --model " + demo() + args + " --weights q8_0");
    ASSERT_EQ(converted.exit_code, 0) << converted.err;
    const nlohmann::json a = nlohmann::json::parse(stored.out),
                         b = nlohmann::json::parse(converted.out);
    EXPECT_EQ(a["ids"], b["ids"]);
    EXPECT_EQ(a["ids"].size(), 24u);

    auto bad = test::run_tmx("generate --model " + demo() + args + " --weights q4_0");
    EXPECT_EQ(bad.exit_code, 2);
    EXPECT_NE(bad.err.find("--weights"), std::string::npos) << bad.err;
}

TEST(WeightFormatCli, TrainRefusesToResumeFromQ8_0Weights) {
    test::TempDir tmp;
    DatasetWriter w(tmp / "data", 97);
    Rng rng(3);
    for (int doc = 0; doc < 20; ++doc) {
        std::vector<int32_t> t = {1};
        for (int i = 0; i < 30; ++i) t.push_back(3 + static_cast<int32_t>(rng.below(94)));
        w.add_document(doc % 5 == 4 ? Split::Val : Split::Train, t.data(), t.size());
    }
    w.commit({{"bos_id", 1}, {"eos_id", 2}});
    auto r = test::run_tmx("train --config " + test::source_dir() +
                           "/assets/configs/test-tiny.json --out " + (tmp / "run") + " --data " +
                           (tmp / "data") +
                           " --batch-size 2 --seq-len 16 --max-steps 2 --eval-every 0 "
                           "--checkpoint-every 2 --backend cpu");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::string step = tmp / "run/step_00000002";
    ASSERT_TRUE(fs::exists(step));
    // The step's weights replaced by their Q8_0 form, the training state left as it is.
    auto be = make_backend("cpu");
    save_checkpoint(*load_model(step, *be), tmp / "q8", {.dtype = StorageType::Q8_0});
    fs::copy_file(tmp / "q8/model.safetensors", step + "/model.safetensors",
                  fs::copy_options::overwrite_existing);
    r = test::run_tmx("train --resume " + (tmp / "run") + " --max-steps 4");
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find("q8_0 weights"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("full-precision"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace tmx

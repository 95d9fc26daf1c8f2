// tmx bench end to end on a tiny config: every backend present is measured and checked against
// the CPU backend.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "engine/compute/backend.h"
#include "tests/test_util.h"

namespace tmx {
namespace {

TEST(BenchCli, MeasuresEveryBackendPresentAndChecksItAgainstTheCpu) {
    const std::string config = test::source_dir() + "/assets/configs/test-tiny.json";
    auto r =
        test::run_tmx("bench --config " + config +
                      " --prompt 20 --decode 6 --batch 3 --gemm 37 --repeats 2 --profile --json"
                      " --threads 2");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    ASSERT_GE(j["backends"].size(), 1u);
    EXPECT_EQ(j["backends"][0]["backend"], "cpu");
    for (const auto& b : j["backends"]) {
        const std::string name = b["backend"], description = b["description"];
        SCOPED_TRACE(description);
        EXPECT_EQ(description.rfind(name, 0), 0u);  // the name, then what it runs on
        // fp32 results agree to summation order; fp16 weights (u = 2^-11) move results by
        // about u relative (2.7e-4 seen), logits after several layers by a few u. A backend in
        // bf16 (CUDA's default) is checked against the CPU in bf16: the same roundings, but a
        // different summation order can send a later operand to the neighbouring bf16 value
        // (2^-8 relative), so 1e-2, as the CUDA model tests state.
        const bool fp16 = description.find("f32 weights read as fp16") != std::string::npos;
        const bool bf16 = b["precision"] == "bf16";
        EXPECT_EQ(bf16, description.find("bf16 matmuls") != std::string::npos);
        const double tol = bf16 ? 1e-2 : fp16 ? 3e-3 : 1e-4;
        ASSERT_GE(b["ops"].size(), 9u);
        for (const auto& op : b["ops"]) {
            EXPECT_GT(op["ms"].get<double>(), 0.0) << op["op"];
            EXPECT_GE(op["launches"].get<int>(), 1) << op["op"];
            EXPECT_LE(op["launches"].get<int>(), 1024) << op["op"];
            EXPECT_LT(op["max_error_vs_cpu"].get<double>(), tol) << op["op"];
        }
        // --gemm: the square matmul, last, fp32 on every backend.
        const auto& gemm = b["ops"].back();
        EXPECT_EQ(gemm["op"], "gemm (fp32)");
        EXPECT_EQ(gemm["shape"], "37x37x37");
        EXPECT_LT(gemm["max_error_vs_cpu"].get<double>(), 1e-4);
        // A 37^3 product takes microseconds on the CPU: it is timed in batches of launches
        // lasting about 2 ms, not one launch and a synchronize.
        if (name == "cpu") {
            EXPECT_GT(gemm["launches"].get<int>(), 1);
        }
        for (const char* key :
             {"prefill_tokens_per_s", "decode_tokens_per_s", "batch_decode_tokens_per_s"})
            EXPECT_GT(b[key].get<double>(), 0.0) << key;
        EXPECT_LT(b["logits_max_error_vs_cpu"].get<double>(), tol);
        // Steps are counted up to the first token that differs from the CPU's; in bf16 a
        // near-tie between the top two logits may end the count early.
        if (bf16) {
            EXPECT_GE(b["greedy_steps"].get<int64_t>(), 1);
        } else {
            EXPECT_EQ(b["greedy_steps"], 6);
        }
        // --profile: on the backends that time their commands (Vulkan), batch 1 and batch 3,
        // six steps each; each kind of command once, its device time within the wall time.
        if (name == "cpu") {
            EXPECT_FALSE(b.contains("decode_profiles"));
            EXPECT_FALSE(b.contains("prefill_profile"));
        }
        if (name != "vulkan") continue;
        // The prompt's prefill in one profiled step: its attention and products among the
        // commands, their device time within its wall time.
        {
            const auto& p = b["prefill_profile"];
            EXPECT_EQ(p["steps"], 1);
            EXPECT_EQ(p["tokens"], j["prompt_tokens"]);
            double device = 0;
            std::set<std::string> names;
            for (const auto& c : p["commands"]) {
                names.insert(c["name"].get<std::string>());
                device += c["seconds"].get<double>();
            }
            EXPECT_TRUE(std::any_of(names.begin(), names.end(), [](const std::string& n) {
                return n.rfind("attention", 0) == 0;
            })) << "attention";
            EXPECT_GT(device, 0.0);
            EXPECT_LE(device, p["wall_seconds"].get<double>());
        }
        ASSERT_EQ(b["decode_profiles"].size(), 2u);
        for (size_t i = 0; i < 2; ++i) {
            const auto& p = b["decode_profiles"][i];
            EXPECT_EQ(p["batch"], i == 0 ? 1 : 3);
            EXPECT_EQ(p["steps"], 6);
            double device = 0;
            std::set<std::string> names;
            for (const auto& c : p["commands"]) {
                EXPECT_TRUE(names.insert(c["name"].get<std::string>()).second) << c["name"];
                EXPECT_GE(c["count"].get<int64_t>(), 6) << c["name"] << ": once a step at least";
                EXPECT_GE(c["seconds"].get<double>(), 0.0) << c["name"];
                device += c["seconds"].get<double>();
            }
            // (The norms run inside the projections' dispatches at these rows: norm_linear.)
            EXPECT_TRUE(std::any_of(names.begin(), names.end(), [](const std::string& n) {
                return n.rfind("matmul_gemv", 0) == 0;
            })) << "every layer's projections";
            // The barriers the commands waited at: some in every step, fewer than commands.
            int64_t commands = 0;
            for (const auto& c : p["commands"]) commands += c["count"].get<int64_t>();
            ASSERT_TRUE(p.contains("barriers"));
            EXPECT_GE(p["barriers"].get<int64_t>(), 6);
            EXPECT_LT(p["barriers"].get<int64_t>(), commands);
            EXPECT_GT(device, 0.0);
            EXPECT_LE(device, p["wall_seconds"].get<double>());
        }
    }
    // The CPU against itself is exact.
    EXPECT_EQ(j["backends"][0]["logits_max_error_vs_cpu"].get<double>(), 0.0);
    EXPECT_EQ(j["backends"][0]["greedy_matching"], 6);
}

// --profile with --train-batch on Vulkan: one training step profiled, its forward and backward
// shaders among the commands, their device time within the step's wall time; the table prints
// it. (The CPU cannot time its commands: no profile there.)
TEST(BenchCli, ProfilesATrainingStepOnVulkan) {
    if (!test::backend_opens("vulkan")) GTEST_SKIP() << "no Vulkan device";
    const std::string config = test::source_dir() + "/assets/configs/test-tiny.json";
    const std::string args = "bench --config " + config +
                             " --backends cpu,vulkan --prompt 4 --decode 1 --batch 1 --repeats 1"
                             " --warmup 0 --warm-seconds 0 --train-batch 2 --train-seq 8"
                             " --no-train-check --profile --threads 2";
    auto r = test::run_tmx(args + " --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    ASSERT_EQ(j["backends"].size(), 2u);
    EXPECT_FALSE(j["backends"][0]["train"].contains("profile")) << "the CPU";
    const auto& p = j["backends"][1]["train"]["profile"];
    EXPECT_EQ(p["batch"], 2);
    EXPECT_EQ(p["steps"], 1);
    double device = 0;
    std::set<std::string> names;
    for (const auto& c : p["commands"]) {
        names.insert(c["name"].get<std::string>());
        EXPECT_GE(c["count"].get<int64_t>(), 1) << c["name"];
        device += c["seconds"].get<double>();
    }
    for (const char* shader : {"attention_backward", "cross_entropy", "optimizer"})
        EXPECT_TRUE(std::any_of(names.begin(), names.end(),
                                [&](const std::string& n) { return n.rfind(shader, 0) == 0; }))
            << shader << " not among the profiled commands";
    EXPECT_GT(device, 0.0);
    EXPECT_LE(device, p["wall_seconds"].get<double>());
    ASSERT_TRUE(p.contains("barriers"));

    auto table = test::run_tmx(args);
    ASSERT_EQ(table.exit_code, 0) << table.err;
    EXPECT_NE(table.out.find("training profile, batch 2 x 8, 1 step: "), std::string::npos)
        << table.out;
}

// A training batch past the estimate's bounds or the machine's memory is a usage error naming
// the bench's own flags, before anything is measured (no table, no JSON).
TEST(BenchCli, ATrainingBatchThatCannotFitIsRefusedFirst) {
    const std::string config = test::source_dir() + "/assets/configs/test-tiny.json";
    for (const char* batch : {"1000000000000", "4611686018427387904"}) {
        SCOPED_TRACE(batch);
        auto r =
            test::run_tmx("bench --config " + config + " --backends cpu --prompt 4 --decode 1" +
                          " --train-seq 16 --json --train-batch " + batch);
        EXPECT_EQ(r.exit_code, 2) << r.err;
        EXPECT_NE(r.err.find("--train-batch"), std::string::npos) << r.err;
        EXPECT_NE(r.err.find("--train-seq"), std::string::npos) << r.err;
        EXPECT_EQ(r.out, "");
    }
}

// --precision applies to every backend measured: one without it is refused before anything
// is measured, naming the flag.
TEST(BenchCli, APrecisionABackendLacksIsAUsageError) {
    auto r = test::run_tmx("bench --config " + test::source_dir() +
                           "/assets/configs/test-tiny.json --backends vulkan --precision bf16");
    for (const char* absent : {"unavailable", "not compiled", "no Vulkan"})
        if (r.err.find(absent) != std::string::npos) TMX_SKIP_UNAVAILABLE("vulkan", r.err);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find("--precision bf16: the vulkan backend has none"), std::string::npos)
        << r.err;
    EXPECT_EQ(r.out, "");
}

// A checkpoint runs in the format it is stored in, as generate, eval and serve run it; a config's
// random weights in f32; --weights overrides either.
TEST(BenchCli, ACheckpointIsBenchedInItsOwnWeightFormat) {
    test::TempDir dir;
    const std::string q8 = dir / "q8";
    auto converted = test::run_tmx("convert --model " + test::source_dir() + "/assets/demo --out " +
                                   q8 + " --dtype q8_0");
    ASSERT_EQ(converted.exit_code, 0) << converted.err;
    const std::string quick = " --backends cpu --prompt 4 --decode 2 --batch 2 --repeats 1 --json";
    auto weights_of = [&](const std::string& args) {
        auto r = test::run_tmx("bench " + args + quick);
        EXPECT_EQ(r.exit_code, 0) << r.err;
        return r.exit_code == 0 ? nlohmann::json::parse(r.out)["weights"].get<std::string>() : "";
    };
    EXPECT_EQ(weights_of("--model " + q8), "q8_0");
    EXPECT_EQ(weights_of("--model " + q8 + " --weights f32"), "f32");
    EXPECT_EQ(weights_of("--config " + test::source_dir() + "/assets/configs/test-tiny.json"),
              "f32");
}

TEST(BenchCli, UnknownBackendIsAUsageError) {
    auto r = test::run_tmx("bench --config " + test::source_dir() +
                           "/assets/configs/test-tiny.json --backends cpu,nosuch");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("nosuch"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace tmx

// The Vulkan backend's tuning on the device (engine/report/tune.h, vulkan_tuning.h): tmx tune's
// measurement end to end, a backend started afterwards uses the file and a model computes the
// same logits with it as without it; a subgroup choice is reloaded and run; a corrupt, foreign
// or stale file is refused and the defaults run. Without a device: vulkan_tuning_test.cpp.
#ifdef TMX_HAS_VULKAN

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <set>

#include "engine/core/file_io.h"
#include "engine/model/model.h"
#include "engine/report/tune.h"
#include "tests/backends/vulkan/vulkan_fixture.h"
#include "tests/backends/vulkan/vulkan_tuning_samples.h"

namespace tmx::test {
namespace {

using vk::Kernel;

// Each test with a fresh cache directory of its own (test::CacheHome).
class VulkanTuningOnDevice : public VulkanTest {
  protected:
    void SetUp() override {
        unsetenv("TMX_VULKAN_TUNING");
        VulkanTest::SetUp();
    }

    std::unique_ptr<VulkanBackend> open(std::optional<std::string> tuning = std::nullopt) {
        return std::make_unique<VulkanBackend>(
            vk::VulkanOptions{.fp16_weights = false, .tuning = std::move(tuning)});
    }

    test::CacheHome cache_;
};

TEST_F(VulkanTuningOnDevice, TunedShapesAreUsedByTheNextStartAndComputeWhatTheDefaultsDo) {
    EXPECT_EQ(vk().tuning_status(), "untuned");
    const ModelConfig config = load_config(source_dir() + "/assets/configs/test-tiny.json");
    TuneOptions o;
    o.prompt_tokens = 20;
    o.batch = 3;
    o.train_batch = 2;
    o.train_seq = 16;  // prefill chunks stop at the window (8): training tiles the attention
    o.repeats = 1;
    o.min_ms = 0.1;
    const TuneReport r = tune_kernels(config, vk(), cpu(), o);
    ASSERT_FALSE(r.shapes.empty());
    EXPECT_EQ(r.saved_to, vk().tuning_path());
    EXPECT_EQ(r.saved_to.rfind(cache_.path().string() + "/tmx/vulkan-tuning-", 0), 0u)
        << r.saved_to;
    // Inference and training shapes, every kernel family the model runs.
    std::set<std::string> kernels;
    for (const TunedShapeReport& s : r.shapes) {
        kernels.insert(s.call.kernel);
        EXPECT_GT(s.best_ms, 0.0) << s.call.key;
        EXPECT_GT(s.default_ms, 0.0) << s.call.key;
        EXPECT_LE(s.best_ms, s.default_ms) << s.call.key;
        EXPECT_EQ(s.tried.size(), vk().variants(s.call).size()) << s.call.key;
        for (const auto& t : s.tried) EXPECT_FALSE(t.rejected) << s.call.key << " " << t.variant;
    }
    for (const char* k :
         {"matmul", "matmul_gemv", "grouped_matmul", "grouped_matmul_gemv",
          "grouped_matmul_backward_dx", "grouped_matmul_backward_dw", "attention_tiled"})
        EXPECT_TRUE(kernels.count(k)) << k;
    // Prefill attention was timed in both forms where the device has subgroup shuffles.
    for (const TunedShapeReport& s : r.shapes) {
        if (s.call.kernel != "attention_tiled") continue;
        const bool subgroup_tried = std::any_of(s.tried.begin(), s.tried.end(), [](const auto& t) {
            return t.variant.ends_with(".sg1");
        });
        EXPECT_EQ(subgroup_tried, vk().context().info().subgroup_shuffle) << s.call.key;
    }

    auto tuned = open();
    EXPECT_EQ(tuned->tuning_status().rfind(
                  "tuned (" + std::to_string(r.shapes.size()) + " shapes, " + r.saved_to, 0),
              0u)
        << tuned->tuning_status();
    EXPECT_NE(tuned->description().find(", tuned"), std::string::npos);
    auto untuned = open("off");
    EXPECT_EQ(untuned->tuning_status(), "untuned (TMX_VULKAN_TUNING=off)");
    EXPECT_NE(untuned->description().find(", untuned"), std::string::npos);

    // The model on the tuned and the untuned backend: the same logits to fp32 summation order.
    Model a(config, *tuned), b(config, *untuned);
    Model ref(config, cpu());
    ref.init_random(11);
    a.params_from_host(ref.params_to_host());
    b.params_from_host(ref.params_to_host());
    const int64_t B = 2, T = 20;
    std::vector<int32_t> tokens(B * T);
    for (int64_t i = 0; i < B * T; ++i)
        tokens[i] = static_cast<int32_t>((i * 37 + 11) % config.vocab_size);
    const std::vector<float> la = down(*tuned, a.forward(tokens, B, T, nullptr).logits);
    const std::vector<float> lb = down(*untuned, b.forward(tokens, B, T, nullptr).logits);
    EXPECT_TRUE(Close(la, lb, 1e-4));
    EXPECT_TRUE(Close(la, down(cpu(), ref.forward(tokens, B, T, nullptr).logits), 1e-4));
    // One token per sequence: the matrix-vector kernels (the decode shapes' tuned choices, from
    // the nearest rows class), which the prefill above does not run.
    const std::vector<int32_t> step(tokens.begin(), tokens.begin() + B);
    const std::vector<float> sa = down(*tuned, a.forward(step, B, 1, nullptr).logits);
    EXPECT_TRUE(Close(sa, down(*untuned, b.forward(step, B, 1, nullptr).logits), 1e-4));
    EXPECT_TRUE(Close(sa, down(cpu(), ref.forward(step, B, 1, nullptr).logits), 1e-4));
}

// A tuning file that chose a subgroup attention variant for the model's prefill (as `tmx tune`
// saves one where it wins) is taken by the next start, whose prefill then runs it and computes
// the untuned backend's logits.
TEST_F(VulkanTuningOnDevice, ASubgroupAttentionChoiceIsReloadedAndRun) {
    const vk::DeviceInfo& d = vk().context().info();
    if (!d.subgroup_shuffle) GTEST_SKIP() << "no subgroup shuffles";
    const ModelConfig config = load_config(source_dir() + "/assets/configs/test-tiny.json");
    Model ref(config, cpu());
    ref.init_random(5);
    const int64_t B = 2, T = 20;
    std::vector<int32_t> tokens(B * T);
    for (int64_t i = 0; i < B * T; ++i)
        tokens[i] = static_cast<int32_t>((i * 29 + 3) % config.vocab_size);
    // The prefill's attention call, as the backend logs it.
    auto untuned = open("off");
    Model b(config, *untuned);
    b.params_from_host(ref.params_to_host());
    std::vector<TunableCall> log;
    untuned->log_calls(&log);
    const std::vector<float> lb = down(*untuned, b.forward(tokens, B, T, nullptr).logits);
    untuned->log_calls(nullptr);
    const auto call = std::find_if(
        log.begin(), log.end(), [](const TunableCall& c) { return c.kernel == "attention_tiled"; });
    ASSERT_NE(call, log.end());

    const std::vector<vk::Variant> all = vk::candidates(Kernel::AttentionTiled, d);
    const auto sg =
        std::find_if(all.rbegin(), all.rend(), [](const vk::Variant& v) { return v.spec[3] == 1; });
    ASSERT_NE(sg, all.rend());
    const std::string name = sg->name(Kernel::AttentionTiled);
    vk().save_tuning({{*call, name, 0.1, 0.2, static_cast<int>(all.size())}});
    const vk::TuningFile file =
        vk::parse_tuning_file(read_file(vk().tuning_path()), vk().tuning_path());
    ASSERT_EQ(file.shapes.size(), 1u);
    EXPECT_EQ(file.shapes[0].best.name(Kernel::AttentionTiled), name);

    auto tuned = open();
    EXPECT_EQ(tuned->tuning_table().tuned_shapes(), 1u) << tuned->tuning_status();
    EXPECT_EQ(tuned->tuning_table()
                  .choose(Kernel::AttentionTiled, call->rows, call->n, call->k,
                          static_cast<uint32_t>(call->heads))
                  .name(Kernel::AttentionTiled),
              name);
    Model a(config, *tuned);
    a.params_from_host(ref.params_to_host());
    const std::vector<float> la = down(*tuned, a.forward(tokens, B, T, nullptr).logits);
    EXPECT_TRUE(Close(la, lb, 1e-4)) << name;
    EXPECT_TRUE(Close(la, down(cpu(), ref.forward(tokens, B, T, nullptr).logits), 1e-4)) << name;
}

TEST_F(VulkanTuningOnDevice, ACorruptForeignOrStaleFileIsRefusedAndTheDefaultsRun) {
    const std::string path = vk().tuning_path();
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    const vk::DeviceInfo& here = vk().context().info();
    vk::DeviceInfo foreign = here;
    foreign.device_id ^= 0x55;
    vk::DeviceInfo stale = here;
    stale.driver_version += 1;
    const std::string good = vk::tuning_file_json(sample_file(here));
    const std::vector<std::pair<std::string, std::string>> files = {
        {"truncated", good.substr(0, good.size() / 2)},
        {"not JSON", std::string("\x00\xff\x13garbage", 10)},
        {"another device", vk::tuning_file_json(sample_file(foreign))},
        {"another driver", vk::tuning_file_json(sample_file(stale))},
    };
    for (const auto& [what, text] : files) {
        SCOPED_TRACE(what);
        write_file_atomic(path, text);
        std::unique_ptr<VulkanBackend> be;
        ASSERT_NO_THROW(be = open());
        EXPECT_EQ(be->tuning_status().rfind("untuned (refused " + path, 0), 0u)
            << be->tuning_status();
        EXPECT_EQ(be->tuning_table().tuned_shapes(), 0u);
        // It computes as ever.
        const std::vector<float> a = normal(40 * 24), b = normal(24 * 30);
        Tensor va = up(*be, a, {40, 24}), vb = up(*be, b, {24, 30}), vo = be->alloc({40, 30});
        Tensor ca = up(cpu(), a, {40, 24}), cb = up(cpu(), b, {24, 30}), co = cpu().alloc({40, 30});
        be->matmul(va, vb, vo);
        cpu().matmul(ca, cb, co);
        EXPECT_TRUE(Close(down(*be, vo), down(cpu(), co), 1e-5));
    }
    // The same file for this device is taken; TMX_VULKAN_TUNING=off ignores it.
    write_file_atomic(path, good);
    EXPECT_EQ(open()->tuning_table().tuned_shapes(), 3u);
    // Tuning another model keeps the shapes it did not measure (one file serves every model),
    // and replaces the ones it did.
    TunableCall call{.op = TunableCall::Op::Matmul,
                     .rows = 300,
                     .n = 512,
                     .k = 512,
                     .trans_b = true,
                     .kernel = "matmul"};
    vk().save_tuning(
        {{call, "bm64.bn64.bk16.tm4.tn4", 0.2, 0.3, 16},
         {{.op = TunableCall::Op::Matmul, .rows = 5, .n = 7, .k = 9, .kernel = "matmul"},
          "bm16.bn64.bk16.tm1.tn4",
          0.1,
          0.1,
          16}});
    auto merged = open();
    EXPECT_EQ(merged->tuning_table().tuned_shapes(), 4u);
    EXPECT_EQ(merged->tuning_table().choose(Kernel::Matmul, 300, 512, 512, 2).name(Kernel::Matmul),
              "bm64.bn64.bk16.tm4.tn4");
    setenv("TMX_VULKAN_TUNING", "off", 1);
    EXPECT_EQ(open()->tuning_table().tuned_shapes(), 0u);
    unsetenv("TMX_VULKAN_TUNING");
    // A file named explicitly that does not exist is refused, not ignored.
    EXPECT_NE(open(cache_ / "missing.json")->tuning_status().find("refused"), std::string::npos);
}

}  // namespace
}  // namespace tmx::test

#endif  // TMX_HAS_VULKAN

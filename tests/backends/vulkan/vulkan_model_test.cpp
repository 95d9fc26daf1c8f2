// The engine's model on the Vulkan backend against the CPU backend: a full forward pass (logits,
// loss, aux loss) and cached generation (a prefill chunk, then one token at a time), for the
// three small configs (MoE with LayerNorm and biases, SwiGLU + RMSNorm, dense). Weights and
// tokens are fixed so that the router's choices, which a near-tie could flip between two
// fp32 summation orders, are the same run to run.
#ifdef TMX_HAS_VULKAN

#include "engine/core/threads.h"
#include "engine/data/tokenizer.h"
#include "engine/infer/generator.h"
#include "engine/model/checkpoint.h"
#include "engine/model/kv_cache.h"
#include "engine/model/model.h"
#include "tests/backends/vulkan/vulkan_fixture.h"
#include "tests/model_scenarios.h"

namespace tmx::test {
namespace {

class VulkanModel : public VulkanTest, public ::testing::WithParamInterface<std::string> {};

TEST_P(VulkanModel, ForwardAndCachedDecodingMatchCpu) {
    const ModelConfig config =
        load_config(source_dir() + "/assets/configs/" + GetParam() + ".json");
    Model on_cpu(config, cpu()), on_vk(config, vk());
    on_cpu.init_random(7);
    on_vk.params_from_host(on_cpu.params_to_host());

    const int64_t B = 2, T = 12;
    std::vector<int32_t> tokens(B * T), targets(B * T);
    for (int64_t i = 0; i < B * T; ++i) {
        tokens[i] = static_cast<int32_t>((i * 37 + 11) % config.vocab_size);
        targets[i] = i % T == T - 1 ? -1 : static_cast<int32_t>((i * 53 + 5) % config.vocab_size);
    }
    ForwardResult want = on_cpu.forward(tokens, B, T, &targets);
    ForwardResult got = on_vk.forward(tokens, B, T, &targets);
    EXPECT_TRUE(Close(down(vk(), got.logits), down(cpu(), want.logits), 1e-4));
    EXPECT_NEAR(got.loss, want.loss, 1e-4 * want.loss);
    EXPECT_NEAR(got.aux, want.aux, 1e-4 * std::max(1.0, want.aux));

    // Cached decoding of sequence 0: a 5-token prefill, then single tokens past the window.
    KvCache cache_cpu(config, cpu(), 1), cache_vk(config, vk(), 1);
    const int64_t prefill = 5;
    for (int64_t p = 0; p < T;) {
        const int64_t n = p == 0 ? prefill : 1;
        SCOPED_TRACE("positions " + std::to_string(p) + ".." + std::to_string(p + n - 1));
        std::vector<int32_t> chunk(tokens.begin() + p, tokens.begin() + p + n);
        const std::vector<int32_t> start{static_cast<int32_t>(p)};
        Tensor lc = on_cpu.forward_cached(chunk, 1, n, start, cache_cpu);
        const uint64_t submits = vk().counters().submits;
        Tensor lv = on_vk.forward_cached(chunk, 1, n, start, cache_vk);
        EXPECT_TRUE(Close(down(vk(), lv), down(cpu(), lc), 1e-4));
        EXPECT_EQ(vk().counters().submits, submits + 1) << "a step is one submit";
        p += n;
    }
}

INSTANTIATE_TEST_SUITE_P(Configs, VulkanModel,
                         ::testing::Values("test-tiny", "test-tiny-swiglu", "test-tiny-dense"),
                         [](const auto& info) {
                             std::string s = info.param;
                             for (char& c : s)
                                 if (c == '-') c = '_';
                             return s;
                         });

// The shipped demo model, greedy, 200 tokens: Vulkan chooses the CPU's token at every step,
// unless the CPU's top two logits are within a near-tie there, which rounding may flip (the
// texts part ways after it, so the comparison ends there). On the fp32 path a near-tie is
// 1e-3; with fp16 weights (the default) logits move by up to ~10 fp16
// roundoffs relative (vulkan_fp16_test.cpp), so two of them may cross within twice that.
class VulkanGreedy : public VulkanTest, public ::testing::WithParamInterface<bool> {
  protected:
    vk::VulkanOptions options() const override { return {.fp16_weights = GetParam()}; }
};

TEST_P(VulkanGreedy, DemoModelGenerationMatchesCpu) {
    // One CPU thread: this small model's decode gains nothing from more, and under ctest's
    // parallel runs on a 2-core machine, threads waiting at barriers would only slow it.
    set_num_threads(1);
    const bool fp16 = GetParam();
    expect_greedy_demo_matches_cpu(
        cpu(), vk(),
        [fp16](const std::vector<float>& cpu_logits) {
            if (!fp16) return 1e-3;
            double scale = 1.0;  // the fp16 tolerance's: max(1, max |logit|)
            for (float v : cpu_logits) scale = std::max(scale, double(std::abs(v)));
            return 2 * 10 * 0x1p-11 * scale;
        },
        DType::F32);  // f32 weights (the demo's bf16 widened), read as fp32 or fp16 copies
}

INSTANTIATE_TEST_SUITE_P(Weights, VulkanGreedy, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "fp16" : "fp32"; });

}  // namespace
}  // namespace tmx::test

#endif  // TMX_HAS_VULKAN

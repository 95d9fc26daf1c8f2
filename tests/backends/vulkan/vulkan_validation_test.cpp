// A representative forward sequence under VK_LAYER_KHRONOS_validation: every forward op, each
// shader path (matrix-vector and tiled matmuls, cached and plain attention: split, tiled and
// per-query), weights stored in 16 and 8 bits, transfers, fill and copy, with the debug-utils
// messenger counting errors; once with the fp32 matmuls and once with fp16 weights (their
// conversions, and a copy remade after its weight is re-uploaded); training steps; recorded steps;
// profiling. The tests skip when the layer is not installed (Debian: vulkan-validationlayers).
#ifdef TMX_HAS_VULKAN

#include <cstdio>

#include "engine/compute/weight_format.h"
#include "engine/train/trainer.h"
#include "tests/backends/vulkan/vulkan_fixture.h"
#include "tests/model_scenarios.h"

namespace tmx::test {
namespace {

class VulkanValidation : public VulkanTest, public ::testing::WithParamInterface<bool> {
  protected:
    // The layer is a developer's tool, not part of the backend: without it the tests skip,
    // also where TMX_REQUIRE_BACKENDS requires Vulkan.
    void SetUp() override {
        if (!vk::validation_layer_installed())
            GTEST_SKIP() << "VK_LAYER_KHRONOS_validation is not installed "
                            "(Debian: apt-get install vulkan-validationlayers)";
        VulkanTest::SetUp();
    }
    vk::VulkanOptions options() const override {
        return {.validation = true, .fp16_weights = GetParam()};
    }
};

TEST_P(VulkanValidation, ForwardOpsRunWithoutValidationErrors) {
    SCOPED_TRACE(trace());
    VulkanBackend& be = vk();
    ASSERT_EQ(be.fp16_weights(), GetParam());
    const int64_t B = 2, T = 9, N = B * T, d = 32, H = 4, Hkv = 2, hd = 8, E = 4, k = 2, F = 48,
                  V = 50, S = 8;
    auto f = [&](Shape s) {
        Tensor t = be.alloc(s);
        be.upload(t, normal(shape_numel(s)).data());
        return t;
    };
    Tensor table = f({V, d}), ids = up_ids(be, ints(N, 0, V), {N});
    Tensor h = be.alloc({N, d}), a = be.alloc({N, d});
    be.gather_rows(table, ids, h);
    be.norm(NormType::LayerNorm, h, f({d}), f({d}), 1e-5f, a);
    be.norm(NormType::RmsNorm, h, f({d}), Tensor{}, 1e-5f, a);

    Tensor q = be.alloc({N, H * hd}), kk = be.alloc({N, Hkv * hd}), vv = be.alloc({N, Hkv * hd});
    be.linear(a, f({H * hd, d}), f({H * hd}), q);
    be.linear(a, f({Hkv * hd, d}), Tensor{}, kk);
    be.matmul(a, f({Hkv * hd, d}), kk, {.trans_b = true, .accumulate = true});
    be.matmul(a, f({d, Hkv * hd}), vv, {.accumulate = true});
    std::vector<int32_t> pos(N);
    for (int64_t n = 0; n < N; ++n) pos[n] = static_cast<int32_t>(n % T);
    Tensor positions = up_ids(be, pos, {N});
    be.rope(q.reshape({N, H, hd}), positions, 10000.0);
    be.rope(kk.reshape({N, Hkv, hd}), positions, 10000.0, true);
    Tensor o = be.alloc({B, T, H, hd});
    be.attention(q.reshape({B, T, H, hd}), kk.reshape({B, T, Hkv, hd}), vv.reshape({B, T, Hkv, hd}),
                 o, 4);
    Tensor kc = be.alloc({B, S, Hkv, hd}), vc = be.alloc({B, S, Hkv, hd});
    be.fill(kc, 0.0f);
    be.fill(vc, 0.0f);
    Tensor start = up_ids(be, std::vector<int32_t>{0, 3}, {B});
    be.attention_cached(q.reshape({B, T, H, hd}), kk.reshape({B, T, Hkv, hd}),
                        vv.reshape({B, T, Hkv, hd}), kc, vc, start, o, S);
    be.kv_cache_write(kk.reshape({B, T, Hkv, hd}), vv.reshape({B, T, Hkv, hd}), kc, vc, start);
    // The other attention paths: split over key slices and merged (decode), tiled (prefill).
    Tensor o1 = be.alloc({B, 1, H, hd});
    be.attention_cached(f({B, 1, H, hd}), f({B, 1, Hkv, hd}), f({B, 1, Hkv, hd}), kc, vc, start, o1,
                        S);
    const int64_t Tp = be.tuning().attention_tile_min_t;
    Tensor op = be.alloc({B, Tp, H, hd});
    be.attention(f({B, Tp, H, hd}), f({B, Tp, Hkv, hd}), f({B, Tp, Hkv, hd}), op, 5);
    be.attention_cached(f({B, Tp, H, hd}), f({B, Tp, Hkv, hd}), f({B, Tp, Hkv, hd}), kc, vc, start,
                        op, S);
    Tensor attn = be.alloc({N, d});
    be.linear(o.reshape({N, H * hd}), f({d, H * hd}), Tensor{}, attn);
    be.add(h, attn, h);

    // Mixture of experts: tiled (N*k slots) and matrix-vector (one token) grouped matmuls.
    Tensor logits = be.alloc({N, E}), idx = be.alloc({N, k}, DType::I32), gates = be.alloc({N, k});
    be.linear(h, f({E, d}), Tensor{}, logits);
    be.router_topk(logits, idx, gates);
    Tensor off = be.alloc({E + 1}, DType::I32), rows = be.alloc({N * k}, DType::I32),
           slot_of = be.alloc({N * k}, DType::I32);
    be.moe_group(idx, E, off, rows, slot_of);
    Tensor xs = be.alloc({N * k, d}), hid = be.alloc({N * k, F}), act = be.alloc({N * k, F}),
           ys = be.alloc({N * k, d});
    be.gather_rows(h, rows, xs);
    Tensor w1 = f({E, F, d}), w3 = f({E, F, d}), w2 = f({E, d, F});
    be.grouped_matmul(xs, w1, f({E, F}), off, hid);
    for (Activation ac : {Activation::Gelu, Activation::Silu, Activation::Relu, Activation::Relu2})
        be.activation(ac, hid, act);
    Tensor up_t = be.alloc({N * k, F});
    be.grouped_matmul(xs, w3, Tensor{}, off, up_t);
    be.swiglu(hid, up_t, act);
    be.grouped_matmul(act, w2, Tensor{}, off, ys);
    be.moe_combine(ys, slot_of, gates, h);
    Tensor one = be.alloc({1, d}), one_out = be.alloc({k, F});
    be.copy(h.rows(0, 1), one);
    be.grouped_matmul(one.reshape({1, d}).slice(0, {1, d}), w1, Tensor{}, off, one_out.rows(0, 1));
    be.upload(w1, normal(E * F * d).data());  // with fp16 weights: the copy is remade
    be.grouped_matmul(one.reshape({1, d}).slice(0, {1, d}), w1, Tensor{}, off, one_out.rows(1, 2));

    // Weights stored in 16 and 8 bits, each starting half-way into a 4-byte word (after one
    // f16 value, or one 34-byte Q8_0 block) and ending mid-word: matrix-vector, tiled and
    // grouped matmuls and gather_rows (the embedding) read them.
    for (DType t : {DType::BF16, DType::F16, DType::Q8_0}) {
        const int64_t lead = t == DType::Q8_0 ? kQ8_0BlockValues : 1;
        const auto make = [&](Shape shape) {
            const int64_t n = lead + shape_numel(shape);
            std::vector<uint8_t> bytes(static_cast<size_t>(dtype_bytes(t, n)));
            encode_weights(t, normal(n).data(), n, bytes.data());
            Tensor flat = be.alloc({n}, t);
            be.upload(flat, bytes.data());
            return flat.slice(lead, shape);
        };
        const Tensor w = make({V, d}), we = make({E, F, d});
        be.linear(a, w, Tensor{}, be.alloc({N, V}));
        be.linear(a.rows(0, 1), w, Tensor{}, be.alloc({1, V}));
        be.grouped_matmul(xs, we, Tensor{}, off, hid);
        be.grouped_matmul(one.reshape({1, d}), we, Tensor{}, off, one_out.rows(0, 1));
        be.gather_rows(w, ids, be.alloc({N, d}));
    }

    Tensor aux = be.alloc({1}), losses = be.alloc({N}), lm = be.alloc({N, V});
    be.router_aux_loss(logits, idx, aux);
    be.linear(h, table, Tensor{}, lm);
    be.cross_entropy(lm, up_ids(be, ints(N, -1, V), {N}), losses);
    auto l = down(be, losses);
    be.synchronize();
    EXPECT_EQ(be.context().validation_errors(), 0u) << "see the messages printed above";
    for (float x : l) EXPECT_TRUE(std::isfinite(x));
}

// Training under the layer: three optimizer steps of the MoE and the dense tiny configs through
// the Trainer (every backward op, the gradient clip's sum of squares and scale, AdamW, and an
// evaluation); every loss finite.
TEST_P(VulkanValidation, TrainingStepsRunWithoutValidationErrors) {
    SCOPED_TRACE(trace());
    VulkanBackend& be = vk();
    TempDir tmp;
    write_counting_dataset(tmp / "data", seed_);
    for (const char* name : {"test-tiny", "test-tiny-dense"}) {
        SCOPED_TRACE(name);
        TrainOptions o = small_train_options(tmp / "data", seed_);
        o.max_steps = 3;
        o.grad_clip = 1e-3;  // small enough to clip: the scale pass runs
        std::vector<double> losses;
        auto t = Trainer::start(test_config(name), o, tmp / name, seed_, be);
        t->run([&](const TrainReport& r) { losses.push_back(r.loss); });
        ASSERT_EQ(losses.size(), 3u);
        for (double l : losses) EXPECT_TRUE(std::isfinite(l));
        EXPECT_FALSE(be.fp16_weights()) << "training reads f32 weights as they are";
    }
    be.synchronize();
    EXPECT_EQ(be.context().validation_errors(), 0u) << "see the messages printed above";
    EXPECT_EQ(be.fp16_weights(), GetParam()) << "a trainer's mode ends with it";
}

// Recorded steps (run_recorded: a secondary command buffer) under the layer: recorded, replayed
// twice in one submit, and, with fp16 weights, recorded afresh after the weight's copy is
// dropped by a re-upload; every run computes its inputs.
TEST_P(VulkanValidation, RecordedStepsRunWithoutValidationErrors) {
    SCOPED_TRACE(trace());
    VulkanBackend& be = vk();
    const int64_t n = 3, d = 32, F = 40;
    Tensor x = be.alloc({n, d}), w = be.alloc({F, d}), out = be.alloc({n, F});
    std::vector<float> hw = normal(F * d), hx;
    be.upload(w, hw.data());
    Backend::StepRecording rec;
    int calls = 0;
    const auto step = [&] {
        ++calls;
        Tensor tmp = be.alloc({n, F});
        be.linear(x, w, Tensor{}, tmp);
        be.activation(Activation::Relu, tmp, out);
    };
    // relu(x w^T) on the host, in double: the GPU's within fp16-weight rounding of it.
    const auto expect_step = [&] {
        const std::vector<float> got = down(be, out);
        for (int64_t i = 0; i < n; ++i)
            for (int64_t j = 0; j < F; ++j) {
                double s = 0.0;
                for (int64_t c = 0; c < d; ++c) s += double{hx[i * d + c]} * hw[j * d + c];
                ASSERT_NEAR(got[i * F + j], std::max(s, 0.0), 2e-2) << i << "," << j;
            }
    };
    for (int run = 0; run < 4; ++run) {
        hx = normal(n * d);
        be.upload(x, hx.data());
        be.run_recorded(rec, step);
        if (run != 2) expect_step();  // runs 3 and 4 replay in one submit
    }
    hw = normal(F * d);
    be.upload(w, hw.data());  // with fp16 weights: drops the copy the recording reads
    for (int run = 0; run < 2; ++run) {
        hx = normal(n * d);
        be.upload(x, hx.data());
        be.run_recorded(rec, step);
        expect_step();
    }
    be.synchronize();
    EXPECT_EQ(be.context().validation_errors(), 0u) << "see the messages printed above";
    EXPECT_EQ(calls, be.fp16_weights() ? 3 : 2);
}

// Profiling under the layer: timestamps after every command of a submit that a download cuts
// short, of a recorded step (dropped and run op by op), and of a submit with more commands than
// its timestamps (cut in two); every command counted once.
TEST_P(VulkanValidation, ProfiledCommandsRunWithoutValidationErrors) {
    SCOPED_TRACE(trace());
    VulkanBackend& be = vk();
    if (!be.can_profile()) GTEST_SKIP() << "this Vulkan device writes no timestamps";
    const int64_t n = 3, d = 32, F = 40;
    Tensor x = be.alloc({n, d}), w = be.alloc({F, d}), out = be.alloc({n, F});
    be.upload(x, normal(n * d).data());
    be.upload(w, normal(F * d).data());
    Backend::StepRecording rec;
    const auto step = [&] { be.linear(x, w, Tensor{}, out); };
    for (int run = 0; run < 3; ++run) be.run_recorded(rec, step);  // recorded, then replayed
    be.synchronize();
    const auto commands = [&] { return be.counters().dispatches + be.counters().transfers; };
    const uint64_t before = commands(), submits = be.counters().submits;
    be.begin_profile();
    be.run_recorded(rec, step);
    const std::vector<float> mid = down(be, out);  // a submit inside the profile
    be.upload(x, normal(n * d).data());
    be.run_recorded(rec, step);
    for (int i = 0; i < 8200; ++i) be.fill(out, static_cast<float>(i));
    int64_t timed = 0;
    for (const Backend::ProfiledCommands& c : be.end_profile()) timed += c.count;
    EXPECT_EQ(static_cast<uint64_t>(timed), commands() - before);
    EXPECT_GE(be.counters().submits - submits, 3u);
    EXPECT_EQ(down(be, out)[0], 8199.0f);
    be.run_recorded(rec, step);  // recorded afresh
    be.synchronize();
    EXPECT_EQ(be.context().validation_errors(), 0u) << "see the messages printed above";
}

// The messenger does count: a buffer of size 0 is invalid usage the layer reports.
TEST_P(VulkanValidation, TheMessengerCountsErrors) {
    const uint64_t before = vk().context().validation_errors();
    VkBufferCreateInfo info{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
    info.size = 0;
    info.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT;
    VkBuffer buffer = VK_NULL_HANDLE;
    std::fprintf(stderr, "(the next validation error is deliberate)\n");
    if (vkCreateBuffer(vk().context().device(), &info, nullptr, &buffer) == VK_SUCCESS)
        vkDestroyBuffer(vk().context().device(), buffer, nullptr);
    EXPECT_GT(vk().context().validation_errors(), before);
}

INSTANTIATE_TEST_SUITE_P(Matmuls, VulkanValidation, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "fp16_weights" : "fp32"; });

}  // namespace
}  // namespace tmx::test

#endif  // TMX_HAS_VULKAN

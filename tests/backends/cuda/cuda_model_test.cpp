// The engine on the CUDA backend against the CPU backend: a model's logits, losses and every
// parameter gradient; 30 training steps; a stopped and resumed run against an uninterrupted
// one; cached generation against recomputing; greedy text from the demo model; and bad ids in
// a kernel. Every test skips, saying why, where no CUDA device is usable (a build machine
// without a GPU). The ops one by one are in tests/backends/ops_test.cpp (forward) and
// tests/backends/backward_ops_test.cpp (backward, optimizer), which run on CUDA too.
#ifdef TMX_HAS_CUDA

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "engine/data/token_shards.h"
#include "engine/data/tokenizer.h"
#include "engine/infer/generator.h"
#include "engine/model/checkpoint.h"
#include "engine/model/kv_cache.h"
#include "engine/model/model.h"
#include "engine/train/trainer.h"
#include "tests/backends/backend_pair_fixture.h"
#include "tests/model_scenarios.h"
#include "tests/test_util.h"

namespace tmx::test {
namespace {

// The CUDA backend, and the CPU as the oracle.
class CudaTest : public BackendPair {
  protected:
    void SetUp() override { open("cuda", needs_training()); }
    virtual bool needs_training() const { return false; }
    Backend& cuda() { return be(); }
};

class CudaTrainingTest : public CudaTest {
  protected:
    bool needs_training() const override { return true; }
};

std::string param_name(const ::testing::TestParamInfo<std::string>& info) {
    std::string s = info.param;
    std::replace(s.begin(), s.end(), '-', '_');
    return s;
}

// ---------------------------------------------------------------- forward and gradients

class CudaModel : public CudaTrainingTest, public ::testing::WithParamInterface<std::string> {};

// Both in bf16 matmuls. The operands are rounded alike, so the two differ by fp32 summation
// order, and by the occasional later operand that this sends to the neighbouring bf16 value
// (2^-8 relative): stated tolerances 1e-2 of max|logit|, 1e-3 relative on the losses, and 2e-2
// of each gradient tensor's scale plus 2e-3 of the model's. Measured on the H100: logits within
// 1.2e-3, losses within 1.3e-6, gradients at most 0.09 of the allowance.
TEST_P(CudaModel, LogitsLossesAndEveryGradientMatchTheCpuInBf16) {
    SCOPED_TRACE(trace());
    if (!cuda().supports_precision(Precision::BF16)) GTEST_SKIP() << "no bf16 on this GPU";
    Backend::ModeScope cpu_bf16(cpu(), {.precision = Precision::BF16});
    Backend::ModeScope cuda_bf16(cuda(), {.precision = Precision::BF16});
    expect_model_matches_cpu(
        cpu(), cuda(), GetParam(),
        {.logits = 1e-2, .loss = 1e-3, .grad_tensor = 2e-2, .grad_model = 2e-3});
}

INSTANTIATE_TEST_SUITE_P(Configs, CudaModel,
                         ::testing::Values("test-tiny", "test-tiny-swiglu", "test-tiny-dense"),
                         param_name);

// ---------------------------------------------------------------- training

class CudaTraining : public CudaTrainingTest, public ::testing::WithParamInterface<std::string> {};

// In bf16 both backends round the same operands the same way, but an fp32 sum that differs in
// its last bit can round a later operand to the neighbouring bf16 value (2^-8 relative), so the
// two drift faster than in fp32: stated tolerance 1e-2 relative per step (an error in a kernel
// moves the loss by far more: see the op tests for the exact contract).
TEST_P(CudaTraining, LossesFollowTheCpuFor30StepsInBf16) {
    SCOPED_TRACE(trace());
    expect_losses_follow_the_cpu(cpu(), cuda(), seed_, GetParam(), Precision::BF16, 1e-2);
}

INSTANTIATE_TEST_SUITE_P(Configs, CudaTraining, ::testing::Values("test-tiny-dense", "test-tiny"),
                         param_name);

// ---------------------------------------------------------------- generation

class CudaCachedDecoding : public CudaTest, public ::testing::WithParamInterface<CacheCase> {};

// At every step, the logits of cached decoding on CUDA equal those of running the whole
// sequence again on CUDA: through the rolling buffer's wrap (several windows), with prompts
// longer than the window, for several chunk sizes. The two paths run different kernels
// (attention_cached and kv_cache_write against attention), so they differ by fp32 rounding,
// ~1e-6 of the logits' scale; 1e-4 leaves a wide margin, while a wrong slot, window bound or
// position changes the spread model's logits by 1e-2 .. 1 of their scale.
TEST_P(CudaCachedDecoding, MatchesRecomputingTheWholeSequence) {
    SCOPED_TRACE(trace());
    expect_cached_decoding_matches_recompute(cuda(), GetParam(), seed_, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(
    Generation, CudaCachedDecoding,
    ::testing::Values(
        // test-tiny: window 8; lengths of 1, 3 and 5 windows; chunks 1, W/2 and W.
        CacheCase{"test-tiny", 1, 3, 0}, CacheCase{"test-tiny", 3, 5, 1},
        CacheCase{"test-tiny", 3, 20, 0}, CacheCase{"test-tiny", 5, 11, 1},
        CacheCase{"test-tiny", 5, 19, 4}, CacheCase{"test-tiny", 5, 30, 0},
        // SwiGLU, rmsnorm, tied embeddings, 5 experts with top-3.
        CacheCase{"test-tiny-swiglu", 5, 17, 4}, CacheCase{"test-tiny-swiglu", 3, 9, 0},
        // Full attention: the cache holds max_seq_len positions.
        CacheCase{"test-tiny-dense", 1, 10, 4}, CacheCase{"test-tiny-dense", 1, 21, 1}),
    cache_case_name);

using CudaGreedy = CudaTest;

// The shipped demo model, greedy, 200 tokens: CUDA chooses the CPU's token at every step,
// unless the CPU's top two logits are within a near-tie (1e-3) there, which fp32 rounding may
// flip (the texts part ways after it, so the comparison ends there).
TEST_F(CudaGreedy, DemoModelGenerationMatchesCpu) {
    expect_greedy_demo_matches_cpu(cpu(), cuda(), [](const std::vector<float>&) { return 1e-3; });
}

// The same in bf16 on both (generation's default on CUDA): the bf16 weight copy and matmul
// operands. Both round alike, so logits differ by summation order and the occasional operand
// sent to the neighbouring bf16 value; the model tests above allow 1e-2 of max|logit| for
// that, so two top logits within twice that are a near-tie.
TEST_F(CudaGreedy, DemoModelGenerationMatchesCpuInBf16) {
    if (!cuda().supports_precision(Precision::BF16)) GTEST_SKIP() << "no bf16 on this GPU";
    Backend::ModeScope cpu_bf16(cpu(), {.precision = Precision::BF16});
    Backend::ModeScope cuda_bf16(cuda(), {.precision = Precision::BF16});
    expect_greedy_demo_matches_cpu(cpu(), cuda(), [](const std::vector<float>& cpu_logits) {
        double scale = 1.0;
        for (float v : cpu_logits) scale = std::max(scale, double(std::abs(v)));
        return 2 * 1e-2 * scale;
    });
}

// ---------------------------------------------------------------- memory

using CudaMemory = CudaTest;

// memory_capacity() (what Trainer checks a run's estimate against) is the device's free memory
// plus what the memory pool holds: making a tensor, and freeing it, moves memory between the
// two, so the capacity stays put (within the pool's and the driver's rounding), and it never
// passes the device's memory. Other processes' allocations move the free memory too, so it
// needs the GPU to itself (scripts/gpu-check.sh runs it after the parallel tests, alone).
TEST_F(CudaMemory, CapacityIsFreeMemoryPlusWhatThePoolHolds) {
    SCOPED_TRACE(trace());
    const auto& device = static_cast<CudaBackend&>(cuda()).device();
    const double total = static_cast<double>(device.memory_bytes);
    const double slack = 64.0 * (1 << 20);
    cuda().synchronize();
    const double before = static_cast<double>(cuda().memory_capacity());
    EXPECT_GT(before, 0.5 * total) << "most of an idle device's memory is free";
    EXPECT_LE(before, total);
    {
        Tensor big = cuda().alloc({int64_t{1} << 28});  // 1 GiB
        cuda().fill(big, 1.0f);
        cuda().synchronize();
        EXPECT_NEAR(static_cast<double>(cuda().memory_capacity()), before, slack)
            << "a live tensor of tmx's own is not memory taken from tmx";
    }
    cuda().synchronize();
    EXPECT_NEAR(static_cast<double>(cuda().memory_capacity()), before, slack)
        << "the pool keeps what the tensor freed";
}

// ---------------------------------------------------------------- errors

using CudaErrors = CudaTest;

// A kernel that meets an invalid id records it and skips the element; the host throws
// tmx::Error at the next sync point (synchronize() or a download), once, and later work runs
// normally. Ops only enqueue, so the op itself does not throw (except under
// TMX_CUDA_DEBUG_SYNC, which syncs after every op).
TEST_F(CudaErrors, BadIdsThrowAtTheNextSyncAndTheBackendStaysUsable) {
    SCOPED_TRACE(trace());
    const char* debug = std::getenv("TMX_CUDA_DEBUG_SYNC");
    const bool debug_sync = debug && *debug && std::strcmp(debug, "0") != 0;
    Backend& b = cuda();
    // The message of the tmx::Error that `op` then synchronize() throw ("" if none).
    auto error_at_sync = [&](const std::function<void()>& op) -> std::string {
        try {
            op();
        } catch (const Error& e) {
            if (!debug_sync)
                ADD_FAILURE() << "thrown while enqueueing, not at the sync: " << e.what();
            return e.what();
        }
        try {
            b.synchronize();
        } catch (const Error& e) {
            return e.what();
        }
        return "";
    };
    auto contains = [](const std::string& s, const std::string& part) {
        return s.find(part) != std::string::npos;
    };

    const int64_t V = 5, d = 3;
    const std::vector<float> table_host = normal(V * d);
    Tensor table = up(b, table_host, {V, d});
    Tensor out = b.alloc({2, d});
    for (int32_t bad : {5, -3, 1 << 30}) {
        SCOPED_TRACE("token id " + std::to_string(bad));
        Tensor ids = up_ids(b, {1, bad}, {2});
        const std::string e = error_at_sync([&] { b.gather_rows(table, ids, out); });
        EXPECT_TRUE(
            contains(e, "row " + std::to_string(bad) + " outside [0, " + std::to_string(V) + ")"))
            << "message: '" << e << "'";
        EXPECT_NO_THROW(b.synchronize()) << "an error is reported once";
    }

    // Another kernel's check: a target past the vocabulary.
    Tensor logits = up(b, normal(2 * 4), {2, 4}), losses = b.alloc({2});
    const std::string ce = error_at_sync([&] {
        b.cross_entropy(logits, up_ids(b, {0, 4}, {2}), losses);
    });
    EXPECT_TRUE(contains(ce, "target 4")) << "message: '" << ce << "'";
    EXPECT_NO_THROW(b.synchronize());

    // Later work runs normally: the embedding's gather with valid ids (a copy: exact), an add.
    b.gather_rows(table, up_ids(b, {4, 0}, {2}), out);
    const std::vector<float> rows = down(b, out);
    EXPECT_TRUE(BitwiseEqual(std::vector<float>(rows.begin(), rows.begin() + d),
                             std::vector<float>(table_host.begin() + 4 * d, table_host.end())));
    EXPECT_TRUE(BitwiseEqual(std::vector<float>(rows.begin() + d, rows.end()),
                             std::vector<float>(table_host.begin(), table_host.begin() + d)));
    const std::vector<float> a = normal(7);
    Tensor y = b.alloc({7});
    b.add(up(b, a, {7}), up(b, a, {7}), y);
    std::vector<float> twice(7);
    for (int i = 0; i < 7; ++i) twice[i] = a[i] + a[i];
    EXPECT_TRUE(BitwiseEqual(down(b, y), twice));
}

}  // namespace
}  // namespace tmx::test

#endif  // TMX_HAS_CUDA

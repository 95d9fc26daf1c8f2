// The Vulkan backend's profiler (Backend::begin_profile, tmx bench --profile): every command is
// counted under its shader, the times are the device's and add up to no more than the wall
// time, the barriers between them are counted (profiled_barriers), and decode steps profiled
// compute what unprofiled (recorded) ones do, with recording resuming afterwards. A backend that
// cannot time: tests/engine/compute/backend_profile_test.cpp.
#ifdef TMX_HAS_VULKAN

#include <chrono>
#include <map>
#include <optional>
#include <vector>

#include "engine/model/kv_cache.h"
#include "engine/model/model.h"
#include "tests/backends/vulkan/vulkan_fixture.h"

namespace tmx::test {
namespace {

class VulkanProfile : public VulkanTest {
  protected:
    void SetUp() override {
        VulkanTest::SetUp();
        if (IsSkipped() || HasFatalFailure()) return;
        if (!vk().can_profile()) GTEST_SKIP() << "this Vulkan device writes no timestamps";
    }
    uint64_t commands() const { return vk_->counters().dispatches + vk_->counters().transfers; }
};

TEST_F(VulkanProfile, CountsEveryCommandUnderItsShaderAndTimesWithinTheWallTime) {
    SCOPED_TRACE(trace());
    // A matmul of 2 * 200 * 1000 * 250 = 100 MFLOP, then additions of 50,000 numbers: the
    // matmul takes far longer on any device (on a large GPU, its few 64x64 output tiles each
    // run 1000 steps, while an addition costs about a dispatch's latency), which shows each
    // time is charged to its command. (A depth of 1,024 or more would split it along k into
    // two commands, matmul.cpp.)
    const int64_t M = 200, K = 1000, N = 250;
    Tensor a = up(vk(), normal(M * K), {M, K}), b = up(vk(), normal(K * N), {K, N});
    Tensor c = vk().alloc({M, N}), d = vk().alloc({M, N});
    vk().synchronize();

    const uint64_t dispatches = vk().counters().dispatches, before = commands();
    const auto t0 = std::chrono::steady_clock::now();
    vk().begin_profile();
    vk().matmul(a, b, c);
    for (int i = 0; i < 3; ++i) vk().add(c, c, d);
    vk().copy(d, c);
    const std::vector<Backend::ProfiledCommands> profile = vk().end_profile();
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    std::map<std::string, int64_t> counts;
    int64_t total = 0;
    double seconds = 0;
    for (const Backend::ProfiledCommands& p : profile) {
        EXPECT_TRUE(counts.emplace(p.name, p.count).second) << p.name << " listed twice";
        EXPECT_GT(p.count, 0) << p.name;
        EXPECT_TRUE(std::isfinite(p.seconds) && p.seconds >= 0) << p.name << ": " << p.seconds;
        total += p.count;
        seconds += p.seconds;
    }
    // Every command the stream issued, each once: the matmul's shader, the three adds' and the
    // copy, in the order each kind first ran.
    EXPECT_EQ(static_cast<uint64_t>(total), commands() - before);
    EXPECT_EQ(vk().counters().dispatches - dispatches, 4u) << "one matmul and three adds";
    // Each command after the first reads or overwrites what the one before it wrote: a barrier
    // before each of the four.
    EXPECT_EQ(vk().profiled_barriers(), std::optional<int64_t>(4));
    ASSERT_EQ(profile.size(), 3u);
    EXPECT_EQ(profile[0].name.rfind("matmul", 0), 0u) << profile[0].name;
    EXPECT_EQ(profile[0].count, 1);
    EXPECT_EQ(profile[1].name, "elementwise");
    EXPECT_EQ(profile[1].count, 3);
    EXPECT_EQ(profile[2].name, "copy");
    EXPECT_EQ(profile[2].count, 1);
    EXPECT_GT(seconds, 0.0);
    EXPECT_LE(seconds, wall);
    EXPECT_GT(profile[0].seconds, profile[1].seconds) << "the matmul against three additions";
    // The work itself is unchanged: c = d = 2 (a b).
    Tensor ac = up(cpu(), down(vk(), a), {M, K}), bc = up(cpu(), down(vk(), b), {K, N});
    Tensor cc = cpu().alloc({M, N}), dc = cpu().alloc({M, N});
    cpu().matmul(ac, bc, cc);
    cpu().add(cc, cc, dc);
    EXPECT_TRUE(Close(down(vk(), c), down(cpu(), dc), reduction_tol(K)));

    // Nothing is timed after end_profile(), and ending twice is a programming error.
    vk().add(c, c, d);
    vk().synchronize();
    EXPECT_THROW(vk().end_profile(), std::logic_error);
}

// Decode steps: two unprofiled (the second is recorded), three profiled, three unprofiled
// (recorded afresh, then replayed), each step's logits against the same model stepping
// unprofiled on another cache; a profiled step's commands are all the stream issued, with
// fewer barriers than commands, as many on each step after the first profiled one (whose
// uploads go in a submit of their own).
TEST_F(VulkanProfile, ProfiledDecodeStepsComputeWhatRecordedOnesDoAndRecordingResumes) {
    const ModelConfig config = load_config(source_dir() + "/assets/configs/test-tiny.json");
    Model model(config, vk());
    model.init_random(seed_);
    KvCache profiled(config, vk(), 1), plain(config, vk(), 1);
    const int64_t steps = 8;
    std::vector<int64_t> barriers;
    for (int64_t s = 0; s < steps; ++s) {
        SCOPED_TRACE("step " + std::to_string(s) + ", " + trace());
        const std::vector<int32_t> token{static_cast<int32_t>(rng_.below(config.vocab_size))};
        const std::vector<int32_t> start{static_cast<int32_t>(s)};
        const std::vector<float> want = down(vk(), model.forward_cached(token, 1, 1, start, plain));
        const bool profile = s >= 2 && s <= 4;
        const uint64_t before = commands(), submits = vk().counters().submits;
        if (profile) vk().begin_profile();
        Tensor logits = model.forward_cached(token, 1, 1, start, profiled);
        if (profile) {
            int64_t timed = 0;
            for (const Backend::ProfiledCommands& p : vk().end_profile()) timed += p.count;
            EXPECT_EQ(static_cast<uint64_t>(timed), commands() - before);
            EXPECT_GT(timed, 10) << "a decode step issues every op of every layer";
            const std::optional<int64_t> waits = vk().profiled_barriers();
            ASSERT_TRUE(waits.has_value());
            EXPECT_GE(*waits, 1) << "each layer's ops read what the one before wrote";
            EXPECT_LT(*waits, timed) << "the step's first command waits for nothing";
            if (s > 2) barriers.push_back(*waits);
            // One submit a step; the first profiled one drops the step's recording, which
            // first submits what is pending (here the step's uploads) in case it runs there.
            EXPECT_EQ(vk().counters().submits, submits + (s == 2 ? 2 : 1));
        }
        EXPECT_TRUE(Close(down(vk(), logits), want, 1e-6));
    }
    ASSERT_EQ(barriers.size(), 2u);
    EXPECT_EQ(barriers[0], barriers[1]) << "two identical steps";
}

}  // namespace
}  // namespace tmx::test

#endif  // TMX_HAS_VULKAN

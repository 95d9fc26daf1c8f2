// The Vulkan block allocator: tensors are ranges of large blocks, freed ranges are reused,
// a large tensor gets a block of its own, and a view is bound within maxStorageBufferRange.
#ifdef TMX_HAS_VULKAN

#include "tests/backends/vulkan/vulkan_fixture.h"

namespace tmx::test {
namespace {

class VulkanMemory : public VulkanTest {};

TEST_F(VulkanMemory, ManyTensorsShareOneBlock) {
    const auto before = vk().allocator_stats();
    std::vector<Tensor> tensors;
    for (int i = 0; i < 1000; ++i) tensors.push_back(vk().alloc({1 + i % 97, 3}));
    const auto during = vk().allocator_stats();
    EXPECT_LE(during.blocks, before.blocks + 1) << "1000 small tensors, more than one new block";
    EXPECT_EQ(during.live_ranges, before.live_ranges + 1000);
    tensors.clear();
    EXPECT_EQ(vk().allocator_stats().live_ranges, before.live_ranges);
    EXPECT_EQ(vk().allocator_stats().used, before.used);
}

TEST_F(VulkanMemory, FreedRangesAreReused) {
    { Tensor warm = vk().alloc({1 << 16}); }
    const auto before = vk().allocator_stats();
    for (int i = 0; i < 200; ++i) {
        Tensor a = vk().alloc({1 << 16}), b = vk().alloc({12345});
        vk().fill(a, 1.0f);
    }
    vk().synchronize();
    EXPECT_EQ(vk().allocator_stats().reserved, before.reserved);
}

TEST_F(VulkanMemory, ALargeTensorGetsItsOwnBlockReleasedAfterUse) {
    const auto before = vk().allocator_stats();
    const int64_t big = (160 << 20) / 4;  // more than half a 256 MiB block
    {
        Tensor t = vk().alloc({big});
        EXPECT_EQ(vk().allocator_stats().blocks, before.blocks + 1);
        Tensor tail = t.slice(big - 4, {4});
        vk().fill(tail, 3.0f);
        EXPECT_EQ(down(vk(), tail), std::vector<float>(4, 3.0f));
    }
    vk().synchronize();  // the block goes once no recorded command can use it
    EXPECT_EQ(vk().allocator_stats().blocks, before.blocks);
}

// A tensor larger than maxStorageBufferRange is fine to hold and to view in parts (the
// engine's flat parameter tensor is); binding all of it to a shader is an error that says so.
TEST_F(VulkanMemory, ViewsAreBoundWithinMaxStorageBufferRange) {
    SCOPED_TRACE(trace());
    const uint64_t range = vk().context().info().max_storage_buffer_range;
    if (range > (256ull << 20))
        GTEST_SKIP() << "maxStorageBufferRange is " << (range >> 20) << " MiB";
    const int64_t n = static_cast<int64_t>(range / 4) + (1 << 20);
    Tensor t = vk().alloc({n});
    const int64_t m = 1000;
    auto x = normal(m), y = normal(m);
    Tensor a = t.slice(n - 3 * m - 1, {m}), b = t.slice(n - 2 * m - 1, {m}),
           c = t.slice(n - m - 1, {m});  // past the first maxStorageBufferRange bytes
    vk().upload(a, x.data());
    vk().upload(b, y.data());
    vk().add(a, b, c);
    std::vector<float> want(m);
    for (int64_t i = 0; i < m; ++i) want[i] = x[i] + y[i];
    EXPECT_TRUE(Close(down(vk(), c), want, 1e-6));
    try {
        vk().add(t, t, t);
        ADD_FAILURE() << "binding " << n * 4 << " bytes did not throw";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("maxStorageBufferRange"), std::string::npos)
            << e.what();
    }
}

TEST_F(VulkanMemory, UploadsAndDownloadsLargerThanStaging) {
    SCOPED_TRACE(trace());
    const int64_t n = (80 << 20) / 4;  // 80 MiB: more than one submit's staging (64 MiB)
    std::vector<float> x(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(i % 1000003);
    Tensor t = vk().alloc({n});
    vk().upload(t, x.data());
    EXPECT_EQ(down(vk(), t), x);
}

}  // namespace
}  // namespace tmx::test

#endif  // TMX_HAS_VULKAN

// The on-disk VkPipelineCache (vk::Pipelines' cache_file): written at destruction, loaded by
// the next start when its header names this device, ignored (never crashing) when it does not,
// and left alone under TMX_VULKAN_PIPELINE_CACHE=off.
#ifdef TMX_HAS_VULKAN

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <string>

#include "backends/vulkan/vulkan_context.h"
#include "backends/vulkan/vulkan_pipelines.h"
#include "engine/core/errors.h"
#include "engine/core/file_io.h"
#include "tests/test_util.h"

namespace tmx::test {
namespace {

constexpr const char* kEnv = "TMX_VULKAN_PIPELINE_CACHE";

class VulkanPipelineCache : public ::testing::Test {
  protected:
    void SetUp() override {
        // The test may run where the variable is set; each test sets it as it needs.
        if (const char* v = std::getenv(kEnv)) saved_env_ = v;
        ::unsetenv(kEnv);
        try {
            ctx_ = std::make_shared<vk::Context>(vk::VulkanOptions{});
        } catch (const Error& e) {
            TMX_SKIP_UNAVAILABLE("vulkan", "no usable Vulkan device: " << e.what());
        }
    }
    void TearDown() override {
        if (saved_env_)
            ::setenv(kEnv, saved_env_->c_str(), 1);
        else
            ::unsetenv(kEnv);
    }

    // Creates a pipeline as the backend's run_elementwise does (x, y, out; WG, op).
    static void make_pipeline(vk::Pipelines& p) {
        const vk::Pipeline& pl = p.get("elementwise", 3, {64, 0});
        EXPECT_NE(pl.pipeline, VK_NULL_HANDLE);
        EXPECT_EQ(p.size(), 1u);
    }

    // Writes a cache file at `path` through a first Pipelines; returns its contents.
    std::string write_valid_cache(const std::string& path) {
        {
            vk::Pipelines p(ctx_, path);
            EXPECT_FALSE(p.loaded_cache_file());
            make_pipeline(p);
        }
        EXPECT_TRUE(std::filesystem::exists(path)) << path;
        return std::filesystem::exists(path) ? read_file(path) : std::string();
    }

    // Whether `data` starts with a pipeline-cache header (Vulkan spec) naming this device.
    ::testing::AssertionResult HeaderMatches(const std::string& data) const {
        if (data.size() < 32) return ::testing::AssertionFailure() << data.size() << " bytes";
        uint32_t h[4];
        std::memcpy(h, data.data(), sizeof h);
        const vk::DeviceInfo& info = ctx_->info();
        if (h[0] < 32 || h[0] > data.size())
            return ::testing::AssertionFailure() << "header size " << h[0];
        if (h[1] != VK_PIPELINE_CACHE_HEADER_VERSION_ONE)
            return ::testing::AssertionFailure() << "header version " << h[1];
        if (h[2] != info.vendor_id || h[3] != info.device_id)
            return ::testing::AssertionFailure() << "vendor " << h[2] << " device " << h[3];
        if (std::memcmp(data.data() + 16, info.pipeline_cache_uuid.data(), VK_UUID_SIZE) != 0)
            return ::testing::AssertionFailure() << "pipeline-cache UUID differs";
        return ::testing::AssertionSuccess();
    }

    std::shared_ptr<vk::Context> ctx_;
    std::optional<std::string> saved_env_;
};

TEST_F(VulkanPipelineCache, WrittenAtDestructionAndLoadedNextTime) {
    TempDir dir;
    const std::string path = dir / "nested/dir/pipelines.bin";  // the directories are made too
    const std::string data = write_valid_cache(path);
    EXPECT_TRUE(HeaderMatches(data));

    {
        vk::Pipelines p(ctx_, path);
        EXPECT_TRUE(p.loaded_cache_file());
        make_pipeline(p);
    }
    EXPECT_TRUE(HeaderMatches(read_file(path)));

    // Nothing created since loading: nothing is written back.
    {
        vk::Pipelines p(ctx_, path);
        EXPECT_TRUE(p.loaded_cache_file());
        std::filesystem::remove(path);
    }
    EXPECT_FALSE(std::filesystem::exists(path));

    // Without a file the cache stays in memory.
    vk::Pipelines p(ctx_);
    EXPECT_FALSE(p.loaded_cache_file());
    make_pipeline(p);
    p.save_cache();
}

TEST_F(VulkanPipelineCache, BadFilesAreIgnored) {
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(static_cast<uint32_t>(seed));
    TempDir dir;
    const std::string path = dir / "pipelines.bin";
    const std::string valid = write_valid_cache(path);
    ASSERT_TRUE(HeaderMatches(valid));

    std::string garbage(1 + rng() % 4096, '\0');
    for (char& c : garbage) c = static_cast<char>(rng() & 0xff);
    auto flipped = [&](size_t at) {  // one byte of the header changed
        std::string d = valid;
        d[at] = static_cast<char>(d[at] ^ (1 + rng() % 255));
        return d;
    };
    const std::pair<const char*, std::string> cases[] = {
        {"random bytes", garbage},
        {"truncated", valid.substr(0, 10)},
        {"empty", ""},
        {"header size", flipped(3)},
        {"header version", flipped(4)},
        {"vendor id", flipped(8 + rng() % 4)},
        {"device id", flipped(12 + rng() % 4)},
        {"pipeline-cache UUID", flipped(16 + rng() % VK_UUID_SIZE)},
    };
    for (const auto& [what, bytes] : cases) {
        SCOPED_TRACE(what);
        write_file_atomic(path, bytes);
        ::testing::internal::CaptureStderr();
        std::optional<vk::Pipelines> p;
        p.emplace(ctx_, path);
        const std::string err = ::testing::internal::GetCapturedStderr();
        EXPECT_FALSE(p->loaded_cache_file());
        EXPECT_NE(err.find("tmx: ignoring Vulkan pipeline cache " + path + ": "), std::string::npos)
            << err;
        make_pipeline(*p);
        p.reset();
        // The bad file was replaced by a good one.
        EXPECT_TRUE(HeaderMatches(read_file(path)));
    }
}

TEST_F(VulkanPipelineCache, OffReadsAndWritesNoFile) {
    TempDir dir;
    const std::string path = dir / "pipelines.bin";
    const std::string valid = write_valid_cache(path);
    ASSERT_TRUE(HeaderMatches(valid));

    ::setenv(kEnv, "off", 1);
    {
        vk::Pipelines p(ctx_, path);
        EXPECT_FALSE(p.loaded_cache_file());
        make_pipeline(p);
        std::filesystem::remove(path);
    }
    EXPECT_FALSE(std::filesystem::exists(path));

    const std::string other = dir / "other.bin";
    {
        vk::Pipelines p(ctx_, other);
        make_pipeline(p);
        p.save_cache();
        EXPECT_FALSE(std::filesystem::exists(other));
    }
    EXPECT_FALSE(std::filesystem::exists(other));
}

}  // namespace
}  // namespace tmx::test

#endif  // TMX_HAS_VULKAN

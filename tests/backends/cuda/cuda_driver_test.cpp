// What `tmx devices` and --backend cuda tell a user whose driver cannot run the build
// (backends/cuda/cuda_driver.h; no GPU needed).
#include "backends/cuda/cuda_driver.h"

#include <gtest/gtest.h>

#include <string>

namespace tmx::cuda {
namespace {

bool has(const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
}

TEST(CudaDriverAdvice, NoDriverLoadedSaysSoAndWhichDriverTheBuildNeeds) {
    const std::string a = insufficient_driver_advice(0, 13000);
    EXPECT_TRUE(has(a, "built with CUDA 13.0, which needs an NVIDIA driver 580 or newer")) << a;
    EXPECT_TRUE(has(a, "no NVIDIA driver is loaded")) << a;
    EXPECT_FALSE(has(a, "installed driver")) << a;
}

// Debian 12's driver (535, CUDA 12.2) under a CUDA 13 build: update it, or build with 12.x.
TEST(CudaDriverAdvice, AnOlderDriverGetsTheToolkitItRuns) {
    const std::string a = insufficient_driver_advice(12020, 13000);
    EXPECT_TRUE(has(a, "the installed driver supports CUDA 12.2: update the driver")) << a;
    EXPECT_TRUE(has(a, "or build tmx with a CUDA 12.x toolkit")) << a;
    EXPECT_FALSE(has(a, "no NVIDIA driver")) << a;
}

// A driver older than any CUDA tmx builds with (12.0): only an update helps.
TEST(CudaDriverAdvice, ADriverBelowCuda12IsToldToUpdateOnly) {
    const std::string a = insufficient_driver_advice(11080, 12040);
    EXPECT_TRUE(has(a, "built with CUDA 12.4, which needs an NVIDIA driver 525 or newer")) << a;
    EXPECT_TRUE(has(a, "supports CUDA 11.8: update the driver")) << a;
    EXPECT_FALSE(has(a, "toolkit")) << a;
}

TEST(CudaDriverAdvice, ARuntimeOfUnknownDriverNeedsSaysNoNumber) {
    EXPECT_EQ(minimum_driver_for(12), 525);
    EXPECT_EQ(minimum_driver_for(13), 580);
    EXPECT_EQ(minimum_driver_for(14), 0);
    const std::string a = insufficient_driver_advice(13000, 14000);
    EXPECT_TRUE(has(a, "built with CUDA 14.0, which needs an NVIDIA driver that supports it")) << a;
    EXPECT_TRUE(has(a, "or build tmx with a CUDA 13.x toolkit")) << a;
}

}  // namespace
}  // namespace tmx::cuda

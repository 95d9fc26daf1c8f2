// A fixture for the Vulkan backend's own tests: a Vulkan backend (the test skips, saying why,
// when this machine has no Vulkan device), the CPU backend as the oracle, and seeded random
// inputs (the seed is printed on failure; TMX_TEST_SEED=<seed> replays it); uploads and
// downloads are tensor_io.h's.
#pragma once

#ifdef TMX_HAS_VULKAN

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "backends/registry.h"
#include "backends/vulkan/vulkan_backend.h"
#include "engine/core/errors.h"
#include "tests/backends/tensor_io.h"
#include "tests/test_util.h"

namespace tmx::test {

class VulkanTest : public ::testing::Test {
  protected:
    VulkanTest() : seed_(fresh_seed()), rng_(seed_) {}

    void SetUp() override {
        try {
            vk_ = std::make_unique<VulkanBackend>(options());
        } catch (const Error& e) {
            TMX_SKIP_UNAVAILABLE("vulkan", "no usable Vulkan device: " << e.what());
        }
        cpu_ = make_backend("cpu");
    }
    // The portable fp32 path, which the CPU backend's fp32 tolerances hold for; the fp16-weight
    // path (the default where the device allows) has its own tests (vulkan_fp16_test.cpp).
    virtual vk::VulkanOptions options() const { return {.fp16_weights = false}; }

    std::string trace() const {
        return "seed " + std::to_string(seed_) +
               " (replay with TMX_TEST_SEED=" + std::to_string(seed_) + ")";
    }

    std::vector<float> normal(int64_t n, double scale = 1.0) {
        return random_normal(rng_, static_cast<size_t>(n), scale);
    }
    std::vector<int32_t> ints(int64_t n, int32_t lo, int32_t hi) {
        return random_ints(rng_, static_cast<size_t>(n), lo, hi);
    }
    // grouped_matmul's expert offsets [E + 1] for slots sorted by expert, counts[e] each.
    static std::vector<int32_t> expert_offsets(const std::vector<int32_t>& counts) {
        std::vector<int32_t> offsets(counts.size() + 1, 0);
        for (size_t e = 0; e < counts.size(); ++e) offsets[e + 1] = offsets[e] + counts[e];
        return offsets;
    }

    // max |got - want| / max(1, max |want|), as tests/backends/ops_test.cpp measures.
    static ::testing::AssertionResult Close(const std::vector<float>& got,
                                            const std::vector<float>& want, double tol) {
        if (got.size() != want.size())
            return ::testing::AssertionFailure() << "sizes " << got.size() << " vs " << want.size();
        double scale = 1.0, worst = 0.0;
        size_t at = 0;
        for (float w : want) scale = std::max(scale, std::abs(static_cast<double>(w)));
        for (size_t i = 0; i < got.size(); ++i) {
            if (!std::isfinite(got[i]))
                return ::testing::AssertionFailure() << "element " << i << " is " << got[i];
            const double err = std::abs(static_cast<double>(got[i]) - want[i]);
            if (err > worst) worst = err, at = i;
        }
        if (worst / scale <= tol) return ::testing::AssertionSuccess();
        std::ostringstream os;
        os << "relative error " << worst / scale << " > " << tol << " at element " << at << ": got "
           << got[at] << ", want " << want[at];
        return ::testing::AssertionFailure() << os.str();
    }
    static double reduction_tol(int64_t length) {
        return std::max(1e-5, 2e-7 * static_cast<double>(length));
    }

    VulkanBackend& vk() { return *vk_; }
    Backend& cpu() { return *cpu_; }

    uint64_t seed_;
    Rng rng_;
    std::unique_ptr<VulkanBackend> vk_;
    std::unique_ptr<Backend> cpu_;
};

}  // namespace tmx::test

#endif  // TMX_HAS_VULKAN

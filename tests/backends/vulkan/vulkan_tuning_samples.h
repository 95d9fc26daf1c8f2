// A tuning file for the Vulkan tuning tests (vulkan_tuning_test.cpp without a device,
// vulkan_tuning_device_test.cpp on one): three shapes of three kernel families, each with a
// variant every test device can run.
#pragma once

#ifdef TMX_HAS_VULKAN

#include "backends/vulkan/vulkan_tuning.h"

namespace tmx::test {

inline vk::TuningFile sample_file(const vk::DeviceInfo& d) {
    vk::TuningFile f;
    f.device = vk::identity_of(d);
    f.shaders = vk::shaders_hash();
    f.shapes.push_back({vk::shape_key(vk::Kernel::Matmul, 300, 512, 512, 2),
                        *vk::parse_variant(vk::Kernel::Matmul, "bm32.bn64.bk16.tm2.tn4"), 0.25, 0.5,
                        16});
    f.shapes.push_back({vk::shape_key(vk::Kernel::MatmulGemv, 8, 32000, 512, 2),
                        *vk::parse_variant(vk::Kernel::MatmulGemv, "wg128.nr2"), 0.1, 0.12, 16});
    f.shapes.push_back({vk::shape_key(vk::Kernel::GroupedMatmulDw, 4096, 2048, 512, 8),
                        *vk::parse_variant(vk::Kernel::GroupedMatmulDw, "bm64.bn64.bk8.tm4.tn4"),
                        1.0, 1.5, 16});
    return f;
}

}  // namespace tmx::test

#endif  // TMX_HAS_VULKAN

// Device listing and selection: what `tmx devices` shows, and make_backend("vulkan:N").
#ifdef TMX_HAS_VULKAN

#include <nlohmann/json.hpp>

#include "backends/registry.h"
#include "tests/backends/vulkan/vulkan_fixture.h"

namespace tmx::test {
namespace {

std::vector<vk::DeviceInfo> devices_or_skip() {
    try {
        auto d = vk::list_vulkan_devices();
        if (!d.empty()) return d;
    } catch (const Error&) {
    }
    return {};
}

TEST(VulkanDevices, ListsDevicesWithTheirFeatures) {
    auto devices = devices_or_skip();
    if (devices.empty()) TMX_SKIP_UNAVAILABLE("vulkan", "no Vulkan device");
    for (const vk::DeviceInfo& d : devices) {
        SCOPED_TRACE(d.name);
        EXPECT_FALSE(d.name.empty());
        EXPECT_TRUE(d.type == "discrete" || d.type == "integrated" || d.type == "virtual" ||
                    d.type == "cpu" || d.type == "other");
        if (!d.usable) continue;
        EXPECT_GE(d.subgroup_size, 1u);
        EXPECT_GE(d.shared_memory_bytes, 16384u);  // the Vulkan minimum
        EXPECT_GE(d.max_workgroup_invocations, 128u);
        EXPECT_GE(d.max_storage_buffer_range, 1u << 27);
    }
    const uint32_t chosen = vk::default_vulkan_device(devices);
    ASSERT_LT(chosen, devices.size());
    EXPECT_TRUE(devices[chosen].usable);
}

TEST(VulkanDevices, DeviceIndexIsChecked) {
    auto devices = devices_or_skip();
    if (devices.empty()) TMX_SKIP_UNAVAILABLE("vulkan", "no Vulkan device");
    try {
        make_backend("vulkan:" + std::to_string(devices.size()));
        ADD_FAILURE() << "a device index past the list did not throw";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("does not exist"), std::string::npos) << e.what();
    }
    EXPECT_THROW(make_backend("vulkan:first"), UsageError);
    auto be = make_backend("vulkan:" + std::to_string(vk::default_vulkan_device(devices)));
    EXPECT_EQ(be->name(), "vulkan");
}

TEST(VulkanDevices, TmxDevicesListsThem) {
    auto devices = devices_or_skip();
    if (devices.empty()) TMX_SKIP_UNAVAILABLE("vulkan", "no Vulkan device");
    CommandResult r = run_tmx("devices");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    for (const vk::DeviceInfo& d : devices)
        EXPECT_NE(r.out.find(d.name), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("subgroup"), std::string::npos) << r.out;

    r = run_tmx("devices --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto j = nlohmann::json::parse(r.out);
    ASSERT_EQ(j["devices"].size(), devices.size());
    EXPECT_EQ(j["devices"][0]["name"], devices[0].name);
    EXPECT_EQ(j["devices"][0]["subgroup_size"], devices[0].subgroup_size);
    EXPECT_EQ(j["default"], vk::default_vulkan_device(devices));
    EXPECT_EQ(j["devices"][0]["coopmat_columns"], devices[0].coopmat_columns);
}

TEST(VulkanCoopmatChoice, OnUnlessTheEnvironmentSaysZero) {
    const char* saved = std::getenv("TMX_VULKAN_COOPMAT");
    const std::string saved_value = saved ? saved : "";
    unsetenv("TMX_VULKAN_COOPMAT");
    EXPECT_TRUE(vk::coopmat_allowed());
    setenv("TMX_VULKAN_COOPMAT", "0", 1);
    EXPECT_FALSE(vk::coopmat_allowed());
    setenv("TMX_VULKAN_COOPMAT", "1", 1);
    EXPECT_TRUE(vk::coopmat_allowed());
    setenv("TMX_VULKAN_COOPMAT", "off", 1);
    const std::string m = error_of([] { vk::coopmat_allowed(); });
    EXPECT_NE(m.find("TMX_VULKAN_COOPMAT must be 0 or 1, got 'off'"), std::string::npos) << m;
    if (saved)
        setenv("TMX_VULKAN_COOPMAT", saved_value.c_str(), 1);
    else
        unsetenv("TMX_VULKAN_COOPMAT");
}

}  // namespace
}  // namespace tmx::test

#endif  // TMX_HAS_VULKAN

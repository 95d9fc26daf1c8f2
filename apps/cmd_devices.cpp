// tmx devices: the Vulkan devices on this machine, with what the backend picks pipelines by
// (type, memory, subgroup size, shared memory, fp16, cooperative matrix), whether the backend
// reads matmul weights as fp16 there, and which one make_backend("vulkan") uses by default.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "apps/commands.h"
#include "engine/errors.h"
#ifdef TMX_HAS_VULKAN
#include "backends/vulkan/vulkan_context.h"
#endif

namespace tmx::cli {

#ifdef TMX_HAS_VULKAN
namespace {

std::string gib(uint64_t bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f GiB", static_cast<double>(bytes) / (1ull << 30));
    return buf;
}

void print_devices(bool json) {
    const std::vector<vk::DeviceInfo> devices = vk::list_vulkan_devices();
    int default_index = -1;
    try {
        default_index = static_cast<int>(vk::default_vulkan_device(devices));
    } catch (const Error&) {  // none usable: listed all the same
    }
    std::vector<bool> fp16_weights;  // before any output: a bad TMX_VULKAN_FP16 throws
    for (const vk::DeviceInfo& d : devices) fp16_weights.push_back(vk::use_fp16_weights(d));
    if (json) {
        nlohmann::json list = nlohmann::json::array();
        for (const vk::DeviceInfo& d : devices)
            list.push_back({{"index", d.index},
                            {"name", d.name},
                            {"type", d.type},
                            {"api_version", d.api_version},
                            {"usable", d.usable},
                            {"memory_bytes", d.device_local_bytes},
                            {"subgroup_size", d.subgroup_size},
                            {"shared_memory_bytes", d.shared_memory_bytes},
                            {"fp16", d.fp16},
                            {"fp16_weights", bool(fp16_weights[d.index])},
                            {"cooperative_matrix", d.cooperative_matrix},
                            {"max_storage_buffer_range", d.max_storage_buffer_range},
                            {"max_allocation_bytes", d.max_allocation_bytes}});
        nlohmann::json out = {{"devices", list}};
        out["default"] = default_index >= 0 ? nlohmann::json(default_index) : nlohmann::json();
        std::printf("%s\n", out.dump().c_str());
        return;
    }
    if (devices.empty()) {
        std::printf("no Vulkan devices\n");
        return;
    }
    std::printf("  %-3s %-36s %-10s %-8s %-10s %-8s %-8s %-5s %-12s %s\n", "#", "name", "type",
                "vulkan", "memory", "subgroup", "shared", "fp16", "fp16-weights", "coop-matrix");
    for (const vk::DeviceInfo& d : devices)
        std::printf("%c %-3u %-36s %-10s %-8s %-10s %-8u %-8s %-5s %-12s %s%s\n",
                    static_cast<int>(d.index) == default_index ? '*' : ' ', d.index, d.name.c_str(),
                    d.type.c_str(), d.api_version.c_str(), gib(d.device_local_bytes).c_str(),
                    d.subgroup_size,
                    (std::to_string(d.shared_memory_bytes / 1024) + " KiB").c_str(),
                    d.fp16 ? "yes" : "no", fp16_weights[d.index] ? "yes" : "no",
                    d.cooperative_matrix ? "yes" : "no",
                    d.usable ? "" : "  (unusable: needs Vulkan 1.2 compute)");
    std::printf(
        "* the default (backend \"vulkan\"); choose another with backend \"vulkan:N\" or "
        "TMX_VULKAN_DEVICE=N\n"
        "fp16-weights: matmuls read weights as fp16, where the device has 16-bit storage "
        "(TMX_VULKAN_FP16=0 turns it off)\n");
}

}  // namespace
#endif

void add_devices_command(CLI::App& app, CommonOptions& common) {
    auto json = std::make_shared<bool>(false);
    CLI::App* sub = app.add_subcommand(
        "devices",
        "List the Vulkan devices: type, memory, subgroup size, shared memory, fp16, "
        "cooperative matrix");
    sub->add_flag("--json", *json, "Print one JSON object instead of a table");
    add_common_options(*sub, common);
    sub->callback([json]() {
#ifdef TMX_HAS_VULKAN
        print_devices(*json);
#else
        throw Error(
            "this tmx was built without the Vulkan backend (install libvulkan-dev and "
            "glslang-tools, then rebuild)");
#endif
    });
}

}  // namespace tmx::cli

// The Vulkan backend in the build's list of backends (backends/registry.h): "vulkan" and
// "vulkan:N", --backend auto's choice after CUDA where a Vulkan GPU is present, and the devices
// `tmx devices` lists: what the backend picks pipelines by (type, memory, subgroup size, shared
// memory, fp16, cooperative matrix), whether it reads matmul weights as fp16, which device it
// opens by default, and whether `tmx tune` measured the device's matmul shapes.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/registry.h"
#include "backends/vulkan/vulkan_backend.h"
#include "backends/vulkan/vulkan_context.h"
#include "backends/vulkan/vulkan_tuning.h"
#include "engine/core/errors.h"

namespace tmx {
namespace {

// A Vulkan GPU; a CPU implementation such as lavapipe is slower than the CPU backend.
bool vulkan_gpu_present() {
    try {
        for (const vk::DeviceInfo& d : vk::list_vulkan_devices())
            if (d.usable && d.type != "cpu") return true;
    } catch (const Error&) {  // no Vulkan driver
    }
    return false;
}

DeviceListing list_devices() {
    const std::vector<vk::DeviceInfo> devices = vk::list_vulkan_devices();
    int default_index = -1;
    try {
        default_index = static_cast<int>(vk::default_vulkan_device(devices));
    } catch (const Error&) {  // none usable: listed all the same
    }
    const bool fp16_weights = vk::use_fp16_weights();  // throws for a bad TMX_VULKAN_FP16
    auto yes_no = [](bool b) { return std::string(b ? "yes" : "no"); };

    DeviceListing l{.title = "Vulkan",
                    .columns = {{"#", 3},
                                {"name", 36},
                                {"type", 10},
                                {"vulkan", 8},
                                {"memory", 10},
                                {"subgroup", 8},
                                {"shared", 8},
                                {"fp16", 5},
                                {"fp16-weights", 12},
                                {"coop-matrix"}},
                    .none = "no devices",
                    .json_key = "devices"};
    for (const vk::DeviceInfo& d : devices) {
        // Which matmul shapes the device runs (`tmx tune`, vulkan_tuning.h).
        const std::string tuning = vk::load_tuning(d, std::nullopt).status;
        l.rows.push_back(
            {.cells = {std::to_string(d.index), d.name, d.type, d.api_version,
                       device_memory_text(d.device_local_bytes), std::to_string(d.subgroup_size),
                       std::to_string(d.shared_memory_bytes / 1024) + " KiB", yes_no(d.fp16),
                       yes_no(fp16_weights),
                       yes_no(d.cooperative_matrix) +
                           (d.coopmat_columns
                                ? " (matmuls: 16x" + std::to_string(d.coopmat_columns) + "x16)"
                                : "") +
                           (d.usable ? "" : "  (unusable: needs Vulkan 1.2 compute)")},
             .marked = static_cast<int>(d.index) == default_index,
             .fields = {{"index", d.index},
                        {"name", d.name},
                        {"type", d.type},
                        {"api_version", d.api_version},
                        {"usable", d.usable},
                        {"memory_bytes", d.device_local_bytes},
                        {"subgroup_size", d.subgroup_size},
                        {"shared_memory_bytes", d.shared_memory_bytes},
                        {"fp16", d.fp16},
                        {"fp16_weights", fp16_weights},
                        {"cooperative_matrix", d.cooperative_matrix},
                        // the ".cm" matmul variants' 16 x N x 16 shape, 0: none usable
                        {"coopmat_columns", d.coopmat_columns},
                        {"max_storage_buffer_range", d.max_storage_buffer_range},
                        {"max_allocation_bytes", d.max_allocation_bytes},
                        {"tuning", tuning}}});
        if (d.usable)
            l.notes.push_back("  " + std::to_string(d.index) + ": matmul shapes " + tuning);
    }
    l.notes.insert(
        l.notes.end(),
        {"* the default (backend \"vulkan\"); choose another with backend \"vulkan:N\" or "
         "TMX_VULKAN_DEVICE=N",
         "fp16-weights: matmuls read f32 weights through fp16 copies (TMX_VULKAN_FP16=0 turns "
         "it off)",
         "tuned: `tmx tune` measured this device's matmul shapes (TMX_VULKAN_TUNING=off ignores "
         "them)",
         "coop-matrix: the device lists cooperative matrices; \"matmuls: 16xNx16\": tmx tune "
         "also times the fp16-weight matmuls on them (TMX_VULKAN_COOPMAT=0 turns it off)"});
    // "devices" and "default" keep the names they had before CUDA's devices were listed.
    l.json_extra["default"] = default_index >= 0 ? nlohmann::json(default_index) : nlohmann::json();
    return l;
}

}  // namespace

void register_vulkan_backend(BackendRegistry& registry) {
    registry.add({.name = "vulkan",
                  // "vulkan": TMX_VULKAN_DEVICE, else the first discrete, integrated, then any
                  // GPU; "vulkan:N": device N as `tmx devices` lists them.
                  .open =
                      [](std::optional<int> device) {
                          return make_vulkan_backend({.device = device.value_or(-1)});
                      },
                  .takes_device = true,
                  .auto_preference = 1,
                  .runs_here = vulkan_gpu_present,
                  .list_devices = list_devices});
}

}  // namespace tmx

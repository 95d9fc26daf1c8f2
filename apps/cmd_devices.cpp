// tmx devices: the GPUs on this machine. CUDA devices with their compute capability, SMs,
// memory (and its theoretical bandwidth) and published peak where tmx knows it; Vulkan devices
// with what the backend picks pipelines by (type, memory, subgroup size, shared memory, fp16,
// cooperative matrix), whether it reads matmul weights as fp16 there, and which one
// make_backend("vulkan") uses by default.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "apps/commands.h"
#include "backends/registry.h"
#include "engine/core/errors.h"
#ifdef TMX_HAS_VULKAN
#include "backends/vulkan/vulkan_context.h"
#include "backends/vulkan/vulkan_tuning.h"
#endif
#ifdef TMX_HAS_CUDA
#include "backends/cuda/cuda_backend.h"
#endif

namespace tmx::cli {

namespace {

[[maybe_unused]] std::string gib(uint64_t bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f GiB", static_cast<double>(bytes) / (1ull << 30));
    return buf;
}

#ifdef TMX_HAS_CUDA
// A device's published peak (backends/cuda/cuda_peaks.h), or null where tmx does not know it.
nlohmann::json peak_or_null(const cuda::DeviceInfo& d, bool bf16) {
    const double peak = cuda::spec_peak_tflops(d.name, d.sm_count, bf16);
    return peak > 0 ? nlohmann::json(peak) : nlohmann::json(nullptr);
}
#endif

// The CUDA devices into out["cuda_devices"] (and out["cuda_error"] when none can be listed),
// or as a table.
void print_cuda_devices(bool json, nlohmann::json& out) {
#ifdef TMX_HAS_CUDA
    std::vector<cuda::DeviceInfo> devices;
    std::string error;
    try {
        devices = cuda::list_cuda_devices();
    } catch (const Error& e) {
        error = e.what();
    }
    if (json) {
        out["cuda_devices"] = nlohmann::json::array();
        for (const cuda::DeviceInfo& d : devices)
            out["cuda_devices"].push_back(
                {{"index", d.index},
                 {"name", d.name},
                 {"compute_capability",
                  std::to_string(d.cc_major) + "." + std::to_string(d.cc_minor)},
                 {"sm_count", d.sm_count},
                 {"memory_bytes", d.memory_bytes},
                 {"shared_memory_per_block_bytes", d.shared_memory_per_block_optin},
                 {"memory_bus_width_bits", d.memory_bus_width_bits},
                 {"memory_clock_khz", d.memory_clock_khz},
                 {"memory_bandwidth_gbps",
                  cuda::memory_bandwidth_gbps(d.memory_clock_khz, d.memory_bus_width_bits)},
                 {"sm_clock_khz", d.sm_clock_khz},
                 {"peak_bf16_tflops", peak_or_null(d, true)},
                 {"peak_fp32_tflops", peak_or_null(d, false)}});
        if (!error.empty()) out["cuda_error"] = error;
        return;
    }
    if (devices.empty()) {
        std::printf("CUDA: no devices (%s)\n\n", error.empty() ? "none found" : error.c_str());
        return;
    }
    std::printf("CUDA\n  %-3s %-36s %-8s %-6s %-10s %-30s %s\n", "#", "name", "sm", "SMs", "memory",
                "memory bus", "published peak (dense)");
    for (const cuda::DeviceInfo& d : devices) {
        char bus[64], peak[64] = "unknown";
        std::snprintf(bus, sizeof bus, "%d-bit, %.0f MHz, %.0f GB/s", d.memory_bus_width_bits,
                      d.memory_clock_khz / 1e3,
                      cuda::memory_bandwidth_gbps(d.memory_clock_khz, d.memory_bus_width_bits));
        const double bf16 = cuda::spec_peak_tflops(d.name, d.sm_count, true);
        if (bf16 > 0)
            std::snprintf(peak, sizeof peak, "bf16 %.0f, fp32 %.1f TFLOP/s", bf16,
                          cuda::spec_peak_tflops(d.name, d.sm_count, false));
        std::printf("  %-3d %-36s %-8s %-6d %-10s %-30s %s\n", d.index, d.name.c_str(),
                    ("sm_" + std::to_string(d.cc_major) + std::to_string(d.cc_minor)).c_str(),
                    d.sm_count, gib(d.memory_bytes).c_str(), bus, peak);
    }
    std::printf(
        "backend \"cuda\" uses device 0 (or TMX_CUDA_DEVICE); choose another with "
        "\"cuda:N\" or --device N\n\n");
#else
    if (json)
        out["cuda_devices"] = nlohmann::json::array();
    else
        std::printf("CUDA: not built in (install the CUDA toolkit >= 12.0 and rebuild)\n\n");
#endif
}

#ifdef TMX_HAS_VULKAN
void print_devices(bool json, nlohmann::json& out) {
    const std::vector<vk::DeviceInfo> devices = vk::list_vulkan_devices();
    int default_index = -1;
    try {
        default_index = static_cast<int>(vk::default_vulkan_device(devices));
    } catch (const Error&) {  // none usable: listed all the same
    }
    const bool fp16_weights = vk::use_fp16_weights();  // before any output: a bad
                                                       // TMX_VULKAN_FP16 throws
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
                            {"fp16_weights", fp16_weights},
                            {"cooperative_matrix", d.cooperative_matrix},
                            {"max_storage_buffer_range", d.max_storage_buffer_range},
                            {"max_allocation_bytes", d.max_allocation_bytes},
                            {"tuning", vk::load_tuning(d, std::nullopt).status}});
        out["devices"] = list;
        out["default"] = default_index >= 0 ? nlohmann::json(default_index) : nlohmann::json();
        return;
    }
    if (devices.empty()) {
        std::printf("Vulkan: no devices\n");
        return;
    }
    std::printf("Vulkan\n  %-3s %-36s %-10s %-8s %-10s %-8s %-8s %-5s %-12s %s\n", "#", "name",
                "type", "vulkan", "memory", "subgroup", "shared", "fp16", "fp16-weights",
                "coop-matrix");
    for (const vk::DeviceInfo& d : devices)
        std::printf(
            "%c %-3u %-36s %-10s %-8s %-10s %-8u %-8s %-5s %-12s %s%s\n",
            static_cast<int>(d.index) == default_index ? '*' : ' ', d.index, d.name.c_str(),
            d.type.c_str(), d.api_version.c_str(), gib(d.device_local_bytes).c_str(),
            d.subgroup_size, (std::to_string(d.shared_memory_bytes / 1024) + " KiB").c_str(),
            d.fp16 ? "yes" : "no", fp16_weights ? "yes" : "no", d.cooperative_matrix ? "yes" : "no",
            d.usable ? "" : "  (unusable: needs Vulkan 1.2 compute)");
    // Which matmul shapes each device runs (`tmx tune`, vulkan_tuning.h).
    for (const vk::DeviceInfo& d : devices)
        if (d.usable)
            std::printf("  %u: matmul shapes %s\n", d.index,
                        vk::load_tuning(d, std::nullopt).status.c_str());
    std::printf(
        "* the default (backend \"vulkan\"); choose another with backend \"vulkan:N\" or "
        "TMX_VULKAN_DEVICE=N\n"
        "fp16-weights: matmuls read f32 weights through fp16 copies (TMX_VULKAN_FP16=0 turns "
        "it off)\n"
        "tuned: `tmx tune` measured this device's matmul shapes (TMX_VULKAN_TUNING=off ignores "
        "them)\n");
}

#endif

}  // namespace

void add_devices_command(CLI::App& app, CommonOptions& common) {
    auto json = std::make_shared<bool>(false);
    CLI::App* sub = app.add_subcommand(
        "devices",
        "List the GPUs: CUDA devices (compute capability, SMs, memory) and Vulkan devices "
        "(type, memory, subgroup size, shared memory, fp16, cooperative matrix)");
    sub->add_flag("--json", *json, "Print one JSON object instead of a table");
    add_common_options(*sub, common);
    sub->callback([json]() {
        // Vulkan's "devices" and "default" keep their names; CUDA's are "cuda_devices".
        nlohmann::json out = nlohmann::json::object();
        print_cuda_devices(*json, out);
#ifdef TMX_HAS_VULKAN
        print_devices(*json, out);
#else
        if (!*json)
            std::printf(
                "Vulkan: not built in (install libvulkan-dev and glslang-tools, then "
                "rebuild)\n");
#endif
        if (*json) std::printf("%s\n", out.dump().c_str());
    });
}

}  // namespace tmx::cli

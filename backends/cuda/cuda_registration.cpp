// The CUDA backend in the build's list of backends (backends/registry.h): "cuda" and "cuda:N",
// --backend auto's first choice wherever a CUDA device is usable, and the devices `tmx devices`
// lists: compute capability, SMs, memory (and its theoretical bandwidth) and the published
// peak where tmx knows it (cuda_peaks.h).
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "backends/registry.h"
#include "engine/core/errors.h"

namespace tmx {
namespace {

// Any CUDA error (no driver, no device, a driver too old for this toolkit) means no CUDA.
bool cuda_device_present() {
    try {
        return !cuda::list_cuda_devices().empty();
    } catch (const Error&) {
        return false;
    }
}

// A device's published peak, or null where tmx does not know it.
nlohmann::json peak_or_null(const cuda::DeviceInfo& d, bool bf16) {
    const double peak = cuda::spec_peak_tflops(d.name, d.sm_count, bf16);
    return peak > 0 ? nlohmann::json(peak) : nlohmann::json(nullptr);
}

DeviceListing list_devices() {
    std::vector<cuda::DeviceInfo> devices;
    std::string error;
    try {
        devices = cuda::list_cuda_devices();
    } catch (const Error& e) {
        error = e.what();
    }
    DeviceListing l{.title = "CUDA",
                    .columns = {{"#", 3},
                                {"name", 36},
                                {"sm", 8},
                                {"SMs", 6},
                                {"memory", 10},
                                {"memory bus", 30},
                                {"published peak (dense)"}},
                    .none = "no devices (" + (error.empty() ? "none found" : error) + ")",
                    .notes = {"backend \"cuda\" uses device 0 (or TMX_CUDA_DEVICE); choose "
                              "another with \"cuda:N\" or --device N"},
                    .json_key = "cuda_devices"};
    for (const cuda::DeviceInfo& d : devices) {
        const double bandwidth =
            cuda::memory_bandwidth_gbps(d.memory_clock_khz, d.memory_bus_width_bits);
        char bus[64], peak[64] = "unknown";
        std::snprintf(bus, sizeof bus, "%d-bit, %.0f MHz, %.0f GB/s", d.memory_bus_width_bits,
                      d.memory_clock_khz / 1e3, bandwidth);
        const double bf16 = cuda::spec_peak_tflops(d.name, d.sm_count, true);
        if (bf16 > 0)
            std::snprintf(peak, sizeof peak, "bf16 %.0f, fp32 %.1f TFLOP/s", bf16,
                          cuda::spec_peak_tflops(d.name, d.sm_count, false));
        const std::string cc = std::to_string(d.cc_major) + std::to_string(d.cc_minor);
        l.rows.push_back(
            {.cells = {std::to_string(d.index), d.name, "sm_" + cc, std::to_string(d.sm_count),
                       device_memory_text(d.memory_bytes), bus, peak},
             .fields = {{"index", d.index},
                        {"name", d.name},
                        {"compute_capability",
                         std::to_string(d.cc_major) + "." + std::to_string(d.cc_minor)},
                        {"sm_count", d.sm_count},
                        {"memory_bytes", d.memory_bytes},
                        {"shared_memory_per_block_bytes", d.shared_memory_per_block_optin},
                        {"memory_bus_width_bits", d.memory_bus_width_bits},
                        {"memory_clock_khz", d.memory_clock_khz},
                        {"memory_bandwidth_gbps", bandwidth},
                        {"sm_clock_khz", d.sm_clock_khz},
                        {"peak_bf16_tflops", peak_or_null(d, true)},
                        {"peak_fp32_tflops", peak_or_null(d, false)}}});
    }
    if (!error.empty()) l.json_extra["cuda_error"] = error;
    return l;
}

}  // namespace

void register_cuda_backend(BackendRegistry& registry) {
    registry.add({.name = "cuda",
                  // "cuda": TMX_CUDA_DEVICE, else device 0; "cuda:N": device N as `tmx devices`
                  // lists them.
                  .open =
                      [](std::optional<int> device) {
                          return make_cuda_backend({.device = device.value_or(-1)});
                      },
                  .takes_device = true,
                  .auto_preference = 2,
                  .runs_here = cuda_device_present,
                  .list_devices = list_devices});
}

}  // namespace tmx

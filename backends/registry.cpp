// The backends compiled into this build.
#include "backends/registry.h"

#include <cstdlib>

#include "backends/cpu/cpu_backend.h"
#include "engine/compute/backend.h"
#include "engine/core/errors.h"
#ifdef TMX_HAS_VULKAN
#include "backends/vulkan/vulkan_backend.h"
#endif
#ifdef TMX_HAS_CUDA
#include "backends/cuda/cuda_backend.h"
#endif

namespace tmx {

namespace {

// The N of "<backend>:N" (a device index), or a usage error naming the backend.
[[maybe_unused]] int device_index(const std::string& name, const std::string& backend) {
    const std::string index = name.substr(backend.size() + 1);
    char* end = nullptr;
    const long n = std::strtol(index.c_str(), &end, 10);
    if (index.empty() || *end != '\0' || n < 0 || n > 1 << 20)
        throw UsageError("backend '" + name + "': expected " + backend +
                         ":N with a device index N");
    return static_cast<int>(n);
}

}  // namespace

std::unique_ptr<Backend> make_backend(const std::string& name) {
    if (name == "cpu") return std::make_unique<CpuBackend>();
#ifdef TMX_HAS_CUDA
    // "cuda": TMX_CUDA_DEVICE, else device 0; "cuda:N": device N as `tmx devices` lists them.
    if (name == "cuda") return make_cuda_backend();
    if (name.starts_with("cuda:")) return make_cuda_backend({.device = device_index(name, "cuda")});
#endif
#ifdef TMX_HAS_VULKAN
    // "vulkan": the default device (TMX_VULKAN_DEVICE, else the first discrete, integrated,
    // then any GPU); "vulkan:N": device N as `tmx devices` lists them.
    if (name == "vulkan") return make_vulkan_backend();
    if (name.starts_with("vulkan:"))
        return make_vulkan_backend({.device = device_index(name, "vulkan")});
#endif
    throw UsageError("unknown backend '" + name + "' (available: " + backend_list() + ")");
}

std::string resolve_backend(const std::string& name, bool training) {
    if (name != "auto") return name;
#ifdef TMX_HAS_CUDA
    // Any CUDA error (no driver, no device, a driver too old for this toolkit) means no CUDA.
    try {
        if (!cuda::list_cuda_devices().empty()) return "cuda";
    } catch (const Error&) {
    }
#endif
#ifdef TMX_HAS_VULKAN
    // A Vulkan GPU; a CPU implementation such as lavapipe is slower than the CPU backend.
    try {
        for (const vk::DeviceInfo& d : vk::list_vulkan_devices())
            if (d.usable && d.type != "cpu") return "vulkan";
    } catch (const Error&) {  // no Vulkan driver: fall back to the CPU
    }
#endif
    (void)training;  // every backend trains: the same choice for training and inference
    return "cpu";
}

std::vector<std::string> backend_names() {
    std::vector<std::string> names{"cpu"};
#ifdef TMX_HAS_CUDA
    names.push_back("cuda");
#endif
#ifdef TMX_HAS_VULKAN
    names.push_back("vulkan");
#endif
    return names;
}

namespace {

std::string join(const std::vector<std::string>& names) {
    std::string list;
    for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
    return list;
}

}  // namespace

std::string backend_list() {
    return join(backend_names());
}

}  // namespace tmx

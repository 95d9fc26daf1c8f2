// The backends compiled into this build.
#include <cstdlib>

#include "backends/cpu/cpu_backend.h"
#include "engine/backend.h"
#include "engine/errors.h"
#ifdef TMX_HAS_VULKAN
#include "backends/vulkan/vulkan_backend.h"
#endif

namespace tmx {

std::unique_ptr<Backend> make_backend(const std::string& name) {
    if (name == "cpu") return std::make_unique<CpuBackend>();
#ifdef TMX_HAS_VULKAN
    // "vulkan": the default device (TMX_VULKAN_DEVICE, else the first discrete, integrated,
    // then any GPU); "vulkan:N": device N as `tmx devices` lists them.
    if (name == "vulkan") return make_vulkan_backend();
    if (name.starts_with("vulkan:")) {
        const std::string index = name.substr(7);
        char* end = nullptr;
        const long n = std::strtol(index.c_str(), &end, 10);
        if (index.empty() || *end != '\0' || n < 0)
            throw UsageError("backend '" + name + "': expected vulkan:N with a device index N");
        return make_vulkan_backend({.device = static_cast<int>(n)});
    }
#endif
    throw UsageError("unknown backend '" + name + "' (available: " + backend_list() + ")");
}

std::string resolve_backend(const std::string& name) {
    if (name != "auto") return name;
    // A CUDA backend, once compiled in, goes first here (with its own device check).
#ifdef TMX_HAS_VULKAN
    // A Vulkan GPU; a CPU implementation such as lavapipe is slower than the CPU backend.
    try {
        for (const vk::DeviceInfo& d : vk::list_vulkan_devices())
            if (d.usable && d.type != "cpu") return "vulkan";
    } catch (const Error&) {  // no Vulkan driver: fall back to the CPU
    }
#endif
    return "cpu";
}

std::vector<std::string> backend_names() {
#ifdef TMX_HAS_VULKAN
    return {"cpu", "vulkan"};
#else
    return {"cpu"};
#endif
}

std::string backend_list() {
    std::string list;
    for (const std::string& n : backend_names()) {
        if (!list.empty()) list += ", ";
        list += n;
    }
    return list;
}

}  // namespace tmx

// The CPU backend in the build's list of backends (backends/registry.h): always present, the
// last choice of --backend auto, and no devices to list.
#include <memory>

#include "backends/cpu/cpu_backend.h"
#include "backends/registry.h"

namespace tmx {

void register_cpu_backend(BackendRegistry& registry) {
    registry.add({.name = "cpu",
                  .open = [](std::optional<int>) { return std::make_unique<CpuBackend>(); },
                  .auto_preference = 0,
                  .runs_here = [] { return true; }});
}

}  // namespace tmx

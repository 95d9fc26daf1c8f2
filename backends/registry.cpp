// The backends compiled into this build.
#include "backends/cpu/cpu_backend.h"
#include "engine/backend.h"
#include "engine/errors.h"

namespace tmx {

std::unique_ptr<Backend> make_backend(const std::string& name) {
    if (name == "cpu") return std::make_unique<CpuBackend>();
    throw UsageError("unknown backend '" + name + "' (available: cpu)");
}

}  // namespace tmx

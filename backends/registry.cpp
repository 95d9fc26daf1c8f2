// The backends compiled into this build.
#include "backends/cpu/cpu_backend.h"
#include "engine/backend.h"
#include "engine/errors.h"

namespace tmx {

std::unique_ptr<Backend> make_backend(const std::string& name) {
    if (name == "cpu") return std::make_unique<CpuBackend>();
    throw UsageError("unknown backend '" + name + "' (available: " + backend_list() + ")");
}

std::string resolve_backend(const std::string& name) {
    return name == "auto" ? "cpu" : name;  // the only backend of this build
}

std::vector<std::string> backend_names() { return {"cpu"}; }

std::string backend_list() {
    std::string list;
    for (const std::string& n : backend_names()) {
        if (!list.empty()) list += ", ";
        list += n;
    }
    return list;
}

}  // namespace tmx

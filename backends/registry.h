// The backends compiled into this build, by name (docs/design.md#15-layering: backend selection
// is generic). Declared here, in backends/, and not on the engine's Backend interface: the engine
// only ever sees a Backend&, and links without any backend (the tmx_engine_alone target
// checks that at build time).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/compute/backend.h"

namespace tmx {

// A backend compiled into this build, by name ("cpu", ...).
std::unique_ptr<Backend> make_backend(const std::string& name);
// The names make_backend() accepts, in this build, and the same as "cpu, vulkan".
std::vector<std::string> backend_names();
std::string backend_list();
// "auto" becomes the best backend present on this machine (CUDA, then a Vulkan GPU, then the
// CPU); any other name is returned as it is.
std::string resolve_backend(const std::string& name, bool training = false);

}  // namespace tmx

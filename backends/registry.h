// The backends compiled into this build, by name (docs/design.md#15-layering: backend selection
// is generic). Declared here, in backends/, and not on the engine's Backend interface: the engine
// only ever sees a Backend&, and links without any backend (the tmx_engine_alone target
// checks that at build time).
//
// Each backend registers itself from its own folder (backends/<name>/<name>_registration.cpp:
// register_<name>_backend): its name, how it opens ("name" and "name:N"), when --backend auto
// takes it, and what `tmx devices` lists of it. The one function that calls every registration
// is generated from CMakeLists.txt's tmx_backend(<name>) lines (cmake/TmxBackends.cmake), and
// this file's functions call it: so a backend of the build cannot be dropped by the linker (a
// registration function that is missing fails the link), and nothing here names a backend.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/compute/backend.h"

namespace tmx {

// What `tmx devices` shows of one backend: its devices as data, which apps/cmd_devices.cpp
// prints as a table, or with --json as keys of one JSON object.
struct DeviceListing {
    struct Column {
        std::string heading;
        int width = 0;  // cells are padded to it; the last column is not padded
    };
    struct Row {
        std::vector<std::string> cells;  // one per column, as the table prints them
        bool marked = false;             // '*' before the row: the device opened by default
        nlohmann::json fields;           // the device in --json: raw values, and more of them
    };
    std::string title;  // "CUDA": the table's heading
    std::vector<Column> columns;
    std::vector<Row> rows;
    std::string none;                // without rows, the line "<title>: <none>" is the table
    std::vector<std::string> notes;  // lines under the table
    std::string json_key;            // where --json puts the rows' fields ("": left out)
    nlohmann::json json_extra = nlohmann::json::object();  // more keys for --json
};

// A memory size as `tmx devices` prints it: "11.9 GiB".
std::string device_memory_text(uint64_t bytes);

// One backend of the build, as its registration function describes it.
struct BackendRegistration {
    std::string name;  // what --backend and make_backend() take: "cuda"
    // Opens the backend: on its default device without a device index, else on that device
    // ("name:N"; only where takes_device). Throws tmx::Error when it cannot run here.
    std::function<std::unique_ptr<Backend>(std::optional<int> device)> open;
    bool takes_device = false;
    // --backend auto takes, of the backends whose runs_here() says yes, the one of the highest
    // auto_preference (CUDA, then a Vulkan GPU, then the CPU). runs_here() does not throw: no
    // driver or no device is a no.
    int auto_preference = 0;
    std::function<bool()> runs_here;
    // What `tmx devices` lists; unset for a backend without devices (the CPU). Throws
    // tmx::Error for what the user must fix (a bad environment variable); a device that cannot
    // be listed is said in the listing.
    std::function<DeviceListing()> list_devices;
};

// A backend this build was configured without, which `tmx devices` names all the same.
struct MissingBackend {
    std::string name;          // "cuda"
    std::string title;         // "CUDA"
    std::string how_to_build;  // "install the CUDA toolkit >= 12.0 and rebuild"
    std::string json_key;      // an empty list of its devices in --json, where set
};

// What a backend's registration function adds to.
class BackendRegistry {
  public:
    void add(BackendRegistration backend);
    void add_missing(MissingBackend backend);

    // By name.
    const std::vector<BackendRegistration>& backends() const { return backends_; }
    const std::vector<MissingBackend>& missing() const { return missing_; }

  private:
    std::vector<BackendRegistration> backends_;
    std::vector<MissingBackend> missing_;
};

// Opens a backend of this build by name: "cpu", "vulkan", or "vulkan:N" for device N of a
// backend with devices. Throws UsageError for a name the build does not have.
std::unique_ptr<Backend> make_backend(const std::string& name);
// The names make_backend() accepts, in this build, and the same as "cpu, vulkan".
std::vector<std::string> backend_names();
std::string backend_list();
// Whether make_backend() takes "<name>:N" (a backend with devices, e.g. a GPU's).
bool backend_takes_device(const std::string& name);
// "auto" becomes the best backend present on this machine (CUDA, then a Vulkan GPU, then the
// CPU; every backend trains, so training or not is the same choice); any other name is
// returned as it is.
std::string resolve_backend(const std::string& name);
// What `tmx devices` lists, one function per backend with devices, by name: each lists that
// backend's devices when called (a backend the build lacks: a listing that says so).
std::vector<std::function<DeviceListing()>> device_listings();

}  // namespace tmx

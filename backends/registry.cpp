// The backends compiled into this build, from their registrations (registry.h).
#include "backends/registry.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#include "engine/core/errors.h"

namespace tmx {

// Generated from CMakeLists.txt's tmx_backend lines (cmake/TmxBackends.cmake): calls each
// backend's registration function, and names each backend the build lacks.
void register_builtin_backends(BackendRegistry& registry);

void BackendRegistry::add(BackendRegistration backend) {
    auto at = std::lower_bound(
        backends_.begin(), backends_.end(), backend.name,
        [](const BackendRegistration& b, const std::string& name) { return b.name < name; });
    if (at != backends_.end() && at->name == backend.name)
        throw std::logic_error("backend '" + backend.name + "' is registered twice");
    backends_.insert(at, std::move(backend));
}

void BackendRegistry::add_missing(MissingBackend backend) {
    auto at = std::lower_bound(
        missing_.begin(), missing_.end(), backend.name,
        [](const MissingBackend& b, const std::string& name) { return b.name < name; });
    missing_.insert(at, std::move(backend));
}

namespace {

const BackendRegistry& registry() {
    static const BackendRegistry built_in = [] {
        BackendRegistry r;
        register_builtin_backends(r);
        return r;
    }();
    return built_in;
}

const BackendRegistration* find_backend(const std::string& name) {
    for (const BackendRegistration& b : registry().backends())
        if (b.name == name) return &b;
    return nullptr;
}

// The N of "<backend>:N" (a device index), or a usage error naming the backend.
int device_index(const std::string& name, const std::string& backend) {
    const std::string index = name.substr(backend.size() + 1);
    char* end = nullptr;
    const long n = std::strtol(index.c_str(), &end, 10);
    if (index.empty() || *end != '\0' || n < 0 || n > 1 << 20)
        throw UsageError("backend '" + name + "': expected " + backend +
                         ":N with a device index N");
    return static_cast<int>(n);
}

}  // namespace

std::string device_memory_text(uint64_t bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f GiB", static_cast<double>(bytes) / (1ull << 30));
    return buf;
}

std::unique_ptr<Backend> make_backend(const std::string& name) {
    const std::string base = name.substr(0, name.find(':'));
    if (const BackendRegistration* b = find_backend(base)) {
        if (name == base) return b->open(std::nullopt);
        if (b->takes_device) return b->open(device_index(name, base));
    }
    throw UsageError("unknown backend '" + name + "' (available: " + backend_list() + ")");
}

std::string resolve_backend(const std::string& name) {
    if (name != "auto") return name;
    std::vector<const BackendRegistration*> by_preference;
    for (const BackendRegistration& b : registry().backends()) by_preference.push_back(&b);
    std::stable_sort(by_preference.begin(), by_preference.end(), [](const auto* a, const auto* b) {
        return a->auto_preference > b->auto_preference;
    });
    for (const BackendRegistration* b : by_preference)
        if (b->runs_here()) return b->name;
    throw Error("--backend auto: no backend of this build runs here");
}

bool backend_takes_device(const std::string& name) {
    const BackendRegistration* b = find_backend(name);
    return b && b->takes_device;
}

std::vector<std::string> backend_names() {
    std::vector<std::string> names;
    for (const BackendRegistration& b : registry().backends()) names.push_back(b.name);
    return names;
}

std::string backend_list() {
    std::string list;
    for (const std::string& n : backend_names()) list += (list.empty() ? "" : ", ") + n;
    return list;
}

std::vector<std::function<DeviceListing()>> device_listings() {
    // Those of the build and those it lacks, merged by name.
    std::vector<std::pair<std::string, std::function<DeviceListing()>>> by_name;
    for (const BackendRegistration& b : registry().backends())
        if (b.list_devices) by_name.emplace_back(b.name, b.list_devices);
    for (const MissingBackend& m : registry().missing())
        by_name.emplace_back(m.name, [m] {
            return DeviceListing{.title = m.title,
                                 .none = "not built in (" + m.how_to_build + ")",
                                 .json_key = m.json_key};
        });
    std::stable_sort(by_name.begin(), by_name.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<std::function<DeviceListing()>> listings;
    for (auto& [name, list] : by_name) listings.push_back(std::move(list));
    return listings;
}

}  // namespace tmx

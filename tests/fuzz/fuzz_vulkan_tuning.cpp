// libFuzzer target: the Vulkan backend's tuning-file reader (backends/vulkan/vulkan_tuning.h) on
// arbitrary bytes, and what the backend does with a file it accepts: the check that it applies to
// a device of the file's own identity (with this build's shaders, so that every variant is
// checked against the device's limits), the table's choices for every kernel, and the file
// written back out and read again. Anything wrong must be a tmx::Error.
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>

#include "backends/vulkan/vulkan_tuning.h"
#include "engine/core/errors.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

namespace vk = tmx::vk;

// A device of the file's identity: a typical desktop GPU, or one at Vulkan's minimum limits.
vk::DeviceInfo device_for(const vk::TuningFile& f, bool minimal) {
    vk::DeviceInfo d;
    d.name = "fuzz device";
    d.usable = true;
    d.subgroup_size = 32;
    d.max_workgroup_invocations = minimal ? 128 : 1024;
    d.max_workgroup_size_x = minimal ? 128 : 1024;
    d.shared_memory_bytes = minimal ? 16 * 1024 : 48 * 1024;
    d.vendor_id = f.device.vendor_id;
    d.device_id = f.device.device_id;
    d.driver_version = f.device.driver_version;
    d.pipeline_cache_uuid = f.device.pipeline_cache_uuid;
    return d;
}

bool applies(const vk::TuningFile& f, const vk::DeviceInfo& d) {
    try {
        vk::check_tuning_applies(f, d, "fuzz.json");
        return true;
    } catch (const tmx::Error&) {
        return false;
    }
}

void use_table(const vk::TuningFile& f, const vk::DeviceInfo& d) {
    using tmx::fuzz::require;
    vk::TuningTable table(d);
    table.set_tuned(f, "fuzz.json");
    // Each tuned shape is chosen at its own key (the last of the file's duplicates wins).
    std::map<vk::ShapeKey, const vk::Variant*> tuned;
    for (const vk::TunedShape& s : f.shapes) tuned[s.key] = &s.best;
    require(table.tuned_shapes() == tuned.size(), "the table holds every tuned shape");
    for (const auto& [key, best] : tuned)
        require(table.choose(key.kernel, key.rows_class, key.n, key.k, key.layout) == *best,
                "a tuned shape is chosen at its own key");
    const int64_t n = f.shapes.empty() ? 512 : f.shapes.front().key.n;
    const int64_t k = f.shapes.empty() ? 512 : f.shapes.front().key.k;
    const uint32_t layout = f.shapes.empty() ? 0 : f.shapes.front().key.layout;
    for (int i = 0; i < vk::kKernelCount; ++i) {
        const auto kernel = static_cast<vk::Kernel>(i);
        for (const int64_t rows : {1, 7, 64, 5000}) {
            const vk::Variant v = table.choose(kernel, rows, n, k, layout);
            require(vk::invalid_reason(kernel, v, d).empty(),
                    "the table chooses a variant the device can run");
        }
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    vk::TuningFile f;
    try {
        f = vk::parse_tuning_file(tmx::fuzz::as_text(data, size), "fuzz.json");
    } catch (const tmx::Error&) {
        return 0;
    }

    // What the reader accepted, written out, reads back the same.
    try {
        const vk::TuningFile again = vk::parse_tuning_file(vk::tuning_file_json(f), "again.json");
        tmx::fuzz::require(again.shapes.size() == f.shapes.size(),
                           "the written file has the shapes that were read");
    } catch (const tmx::Error& e) {
        std::fprintf(stderr, "written file refused: %s\n", e.what());
        tmx::fuzz::require(false, "the written file of an accepted file reads back");
    }

    for (const bool minimal : {false, true}) {
        const vk::DeviceInfo d = device_for(f, minimal);
        // As written: its shaders hash is almost never this build's, so this is refused.
        if (applies(f, d)) use_table(f, d);
        // With this build's shaders, so that each variant is checked against the device.
        vk::TuningFile here = f;
        here.shaders = vk::shaders_hash();
        if (applies(here, d)) use_table(here, d);
    }
    return 0;
}

// The tuning file (vulkan_tuning.h): the device identity and shader hash it is keyed by, its
// JSON both ways, the checks that it applies here, where it lives, and loading it at start.
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "backends/vulkan/vulkan_shaders.h"
#include "backends/vulkan/vulkan_tuning.h"
#include "engine/core/errors.h"
#include "engine/core/file_io.h"
#include "engine/core/json_fields.h"
#include "engine/core/sha256.h"

namespace tmx::vk {
namespace {

std::string hex(const uint8_t* bytes, size_t n) {
    static const char* digits = "0123456789abcdef";
    std::string s;
    for (size_t i = 0; i < n; ++i) {
        s += digits[bytes[i] >> 4];
        s += digits[bytes[i] & 15];
    }
    return s;
}

std::string hex32(uint32_t v) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%04x", v);
    return buf;
}

}  // namespace

DeviceIdentity identity_of(const DeviceInfo& d) {
    return {d.vendor_id, d.device_id, d.driver_version, d.pipeline_cache_uuid, d.name};
}

const std::string& shaders_hash() {
    static const std::string hash = [] {
        std::string all;
        for (const EmbeddedShader& s : embedded_shaders()) {
            all += s.name;
            all += '\0';
            all.append(reinterpret_cast<const char*>(s.code), s.words * sizeof(uint32_t));
        }
        return sha256_hex(all);
    }();
    return hash;
}

// ---- the file

std::string tuning_file_json(const TuningFile& f) {
    nlohmann::json shapes = nlohmann::json::array();
    for (const TunedShape& s : f.shapes)
        shapes.push_back({{"kernel", kernel_name(s.key.kernel)},
                          {"rows_class", s.key.rows_class},
                          {"n", s.key.n},
                          {"k", s.key.k},
                          {"layout", s.key.layout},
                          {"variant", s.best.name(s.key.kernel)},
                          {"ms", s.best_ms},
                          {"default_ms", s.default_ms},
                          {"candidates", s.candidates_tried}});
    const nlohmann::json j = {{"format", "tmx-vulkan-tuning"},
                              {"version", 1},
                              {"device",
                               {{"name", f.device.name},
                                {"vendor_id", f.device.vendor_id},
                                {"device_id", f.device.device_id},
                                {"driver_version", f.device.driver_version},
                                {"pipeline_cache_uuid", hex(f.device.pipeline_cache_uuid.data(),
                                                            f.device.pipeline_cache_uuid.size())}}},
                              {"shaders", f.shaders},
                              {"shapes", shapes}};
    return j.dump(1) + "\n";
}

TuningFile parse_tuning_file(std::string_view text, const std::string& path) {
    using json_fields::Fields;
    const nlohmann::json j = json_fields::parse_unique_keys(text, path);
    const Fields top(j, path);
    if (top.string("format") != "tmx-vulkan-tuning")
        json_fields::fail(path, "format", "expected \"tmx-vulkan-tuning\"");
    if (top.integer("version") != 1)
        json_fields::fail(path, "version", "expected 1 (the version this tmx reads)");
    TuningFile f;
    const Fields dev(top.at("device", "an object"), path, "device.");
    constexpr int64_t kU32 = 0xFFFFFFFFll;
    f.device.name = dev.string("name");
    f.device.vendor_id = static_cast<uint32_t>(dev.integer("vendor_id", 0, kU32));
    f.device.device_id = static_cast<uint32_t>(dev.integer("device_id", 0, kU32));
    f.device.driver_version = static_cast<uint32_t>(dev.integer("driver_version", 0, kU32));
    const std::string uuid = dev.string("pipeline_cache_uuid");
    if (uuid.size() != 32 || uuid.find_first_not_of("0123456789abcdef") != std::string::npos)
        json_fields::fail(path, "device.pipeline_cache_uuid", "expected 32 lowercase hex digits");
    for (size_t i = 0; i < 16; ++i)
        f.device.pipeline_cache_uuid[i] =
            static_cast<uint8_t>(std::stoul(uuid.substr(2 * i, 2), nullptr, 16));
    f.shaders = top.string("shaders");
    const nlohmann::json& shapes = top.at("shapes", "an array");
    if (!shapes.is_array()) json_fields::fail(path, "shapes", "expected an array");
    for (size_t i = 0; i < shapes.size(); ++i) {
        const std::string at = "shapes[" + std::to_string(i) + "].";
        const Fields s(shapes[i], path, at);
        TunedShape t;
        const std::string kernel = s.string("kernel");
        const std::optional<Kernel> k = kernel_from_name(kernel);
        if (!k) json_fields::fail(path, at + "kernel", "no tunable kernel '" + kernel + "'");
        const int64_t rows = s.integer("rows_class", 1, int64_t{1} << 30);
        if (!std::has_single_bit(static_cast<uint64_t>(rows)))
            json_fields::fail(path, at + "rows_class", "expected a power of two");
        t.key = {*k, static_cast<uint32_t>(rows),
                 static_cast<uint32_t>(s.integer("n", 0, int64_t{1} << 30)),
                 static_cast<uint32_t>(s.integer("k", 0, int64_t{1} << 30)),
                 static_cast<uint32_t>(s.integer("layout", 0, int64_t{1} << 20))};
        const std::string name = s.string("variant");
        const std::optional<Variant> v = parse_variant(*k, name);
        if (!v)
            json_fields::fail(path, at + "variant", "'" + name + "' is not a variant of " + kernel);
        t.best = *v;
        t.best_ms = s.number("ms");
        t.default_ms = s.number("default_ms");
        t.candidates_tried = static_cast<int>(s.integer("candidates", 0, 1 << 20));
        f.shapes.push_back(std::move(t));
    }
    return f;
}

void check_tuning_applies(const TuningFile& f, const DeviceInfo& here, const std::string& path) {
    const DeviceIdentity me = identity_of(here);
    const auto refuse = [&](const std::string& why) {
        throw Error(path + ": " + why + "; run `tmx tune` again for this device");
    };
    // The name too: lavapipe keeps its ids at every vector width, and names the width.
    if (f.device.vendor_id != me.vendor_id || f.device.device_id != me.device_id ||
        f.device.name != me.name)
        refuse("tuned for another device ('" + f.device.name + "', " + hex32(f.device.vendor_id) +
               ":" + hex32(f.device.device_id) + "), not '" + me.name + "' (" +
               hex32(me.vendor_id) + ":" + hex32(me.device_id) + ")");
    if (f.device.driver_version != me.driver_version ||
        f.device.pipeline_cache_uuid != me.pipeline_cache_uuid)
        refuse("tuned under another driver (version " + std::to_string(f.device.driver_version) +
               ", pipeline cache " + hex(f.device.pipeline_cache_uuid.data(), 16) +
               "); this one is version " + std::to_string(me.driver_version) + ", " +
               hex(me.pipeline_cache_uuid.data(), 16));
    if (f.shaders != shaders_hash()) refuse("tuned with the shaders of another tmx build");
    for (const TunedShape& s : f.shapes)
        if (std::string why =
                invalid_reason(s.key.kernel, runnable_form(s.key.kernel, s.best, here), here);
            !why.empty())
            refuse(s.key.to_string() + ": variant " + s.best.name(s.key.kernel) +
                   " cannot run here: " + why);
}

std::string cache_dir() {
    if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x == '/')
        return std::string(x) + "/tmx";
    if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/tmx";
    throw Error("no cache directory: neither XDG_CACHE_HOME nor HOME is set");
}

namespace {
std::string device_stem(const DeviceInfo& d) {
    return hex32(d.vendor_id) + "-" + hex32(d.device_id);
}
}  // namespace

std::string tuning_file_path(const DeviceInfo& d) {
    return cache_dir() + "/vulkan-tuning-" + device_stem(d) + ".json";
}

std::string pipeline_cache_path(const DeviceInfo& d) {
    return cache_dir() + "/vulkan-pipelines-" + device_stem(d) + ".bin";
}

TuningSource tuning_source(const std::optional<std::string>& requested) {
    std::string v;
    if (requested) {
        v = *requested;
    } else if (const char* env = std::getenv("TMX_VULKAN_TUNING")) {
        v = env;
    }
    if (v.empty()) return {};
    if (v == "off") return {TuningSource::Kind::Off, ""};
    return {TuningSource::Kind::File, v};
}

LoadedTuning load_tuning(const DeviceInfo& d, const std::optional<std::string>& requested) {
    LoadedTuning t;
    const TuningSource src = tuning_source(requested);
    if (src.kind == TuningSource::Kind::Off) {
        t.status = "untuned (TMX_VULKAN_TUNING=off)";
        return t;
    }
    t.path = src.path;
    if (src.kind == TuningSource::Kind::DeviceFile) {
        try {
            t.path = tuning_file_path(d);
        } catch (const Error&) {
            return t;  // no cache directory: nothing was tuned
        }
        std::error_code ec;
        if (!std::filesystem::exists(t.path, ec)) return t;
    }
    try {
        TuningFile f = parse_tuning_file(read_file(t.path), t.path);
        check_tuning_applies(f, d, t.path);
        t.status = "tuned (" + std::to_string(f.shapes.size()) + " shapes, " + t.path + ")";
        t.file = std::move(f);
    } catch (const Error& e) {
        t.refused = e.what();
        t.status = "untuned (refused " + t.refused + ")";
    }
    return t;
}

}  // namespace tmx::vk

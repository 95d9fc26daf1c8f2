// Shared by the libFuzzer targets: a scratch directory for readers that take a path, and a
// check that makes libFuzzer report a broken promise as a finding.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace tmx::fuzz {

// A directory of this process's own, made on first use (the fuzzers run single-threaded).
inline const std::string& scratch_dir() {
    static const std::string dir = [] {
        char name[] = "/tmp/tmx-fuzz-XXXXXX";
        if (!mkdtemp(name)) std::abort();
        return std::string(name);
    }();
    return dir;
}

// Writes `bytes` to scratch_dir()/name and returns the path.
inline std::string write_scratch(const std::string& name, std::string_view bytes) {
    const std::string path = scratch_dir() + "/" + name;
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size() || std::fclose(f))
        std::abort();
    return path;
}

// A violated invariant: a crash libFuzzer records with the input.
inline void require(bool ok, const char* what) {
    if (!ok) {
        std::fprintf(stderr, "fuzz invariant violated: %s\n", what);
        std::abort();
    }
}

inline std::string_view as_text(const uint8_t* data, size_t size) {
    return {reinterpret_cast<const char*>(data), size};
}

}  // namespace tmx::fuzz

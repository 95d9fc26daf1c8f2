// Flag-value parsing shared by the subcommands.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "apps/commands.h"
#include "engine/errors.h"

namespace tmx::cli {

void add_backend_options(CLI::App& sub, BackendChoice& choice, bool training) {
    sub.add_option("--backend", choice.backend,
                   training ? "Backend: auto (CUDA when a GPU is present, else the CPU) or one "
                              "of " + training_backend_list()
                            : "Backend: auto (the best present: CUDA, else a Vulkan GPU, else "
                              "the CPU) or one of " + backend_list())
        ->capture_default_str();
    sub.add_option("--device", choice.device,
                   "GPU index of the chosen backend, as `tmx devices` lists them (default: "
                   "CUDA device 0; the first discrete Vulkan GPU)")
        ->check(CLI::NonNegativeNumber);
    choice.training = training;
}

std::string with_device(const std::string& name, int device) {
    if (device < 0) return name;
    if (name == "vulkan" || name == "cuda") return name + ":" + std::to_string(device);
    throw UsageError("--device " + std::to_string(device) +
                     " selects a GPU; backend '" + name + "' has none");
}

std::unique_ptr<Backend> BackendChoice::open() const {
    const std::string name = resolve_backend(backend, training);
    auto be = make_backend(with_device(name, device));
    if (training && !be->supports_training())
        throw UsageError("--backend " + backend + ": the " + be->name() +
                         " backend runs inference only; backends that train: " +
                         training_backend_list());
    std::fprintf(stderr, "backend: %s%s\n", be->description().c_str(),
                 backend == "auto" ? " (auto)" : "");
    return be;
}

std::vector<int32_t> parse_id_list(const std::string& text, const char* flag) {
    std::vector<int32_t> out;
    size_t i = 0;
    while (i <= text.size()) {
        size_t j = text.find(',', i);
        if (j == std::string::npos) j = text.size();
        std::string item = text.substr(i, j - i);
        size_t a = item.find_first_not_of(" \t"), b = item.find_last_not_of(" \t");
        item = a == std::string::npos ? "" : item.substr(a, b - a + 1);
        char* end = nullptr;
        long long v = item.empty() ? -1 : std::strtoll(item.c_str(), &end, 10);
        if (item.empty() || *end != '\0' || v < 0 || v > INT32_MAX)
            throw UsageError(std::string(flag) + ": expected comma-separated token ids, got '" +
                             item + "'");
        out.push_back(static_cast<int32_t>(v));
        i = j + 1;
    }
    return out;
}

}  // namespace tmx::cli

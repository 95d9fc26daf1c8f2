// The Vulkan backend's tunable kernels (engine/compute/kernel_tuning.h over vulkan_tuning.h):
// the choice per call, the call log `tmx tune` reads, forced variants, and the tuning file,
// loaded when the backend starts and written by save_tuning().
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "backends/vulkan/vulkan_backend.h"
#include "engine/core/errors.h"
#include "engine/core/file_io.h"

namespace tmx {
namespace {

vk::Kernel kernel_named(const std::string& name) {
    const std::optional<vk::Kernel> k = vk::kernel_from_name(name);
    if (!k) throw Error("Vulkan: no tunable kernel '" + name + "'");
    return *k;
}

// The kernel's shape of a call's op, as vk::ShapeKey takes it: rows (classed), the other two
// dimensions, and the layout (dense: transposes; grouped: experts; attention: heads).
struct KernelShape {
    int64_t rows, n, k;
    uint32_t layout;
};
KernelShape kernel_shape(vk::Kernel kernel, const TunableCall& c) {
    const uint32_t experts = static_cast<uint32_t>(c.experts);
    switch (kernel) {
        case vk::Kernel::Matmul:
        case vk::Kernel::MatmulGemv:
            return {c.rows, c.n, c.k, (c.trans_a ? 1u : 0u) | (c.trans_b ? 2u : 0u)};
        case vk::Kernel::GroupedMatmulDx:
            return {c.rows, c.k, c.n, experts};
        case vk::Kernel::AttentionTiled:
        case vk::Kernel::AttentionSplit:
            return {c.rows, c.n, c.k, static_cast<uint32_t>(c.heads)};
        default:
            return {c.rows, c.n, c.k, experts};
    }
}

bool is_coop(vk::Kernel k, const vk::Variant& v) {
    return !vk::is_gemv(k) && k != vk::Kernel::AttentionTiled && k != vk::Kernel::AttentionSplit &&
           v.spec.size() == 7 && v.spec[6] == vk::kTiledCoopmat;
}

}  // namespace

vk::Variant VulkanBackend::choose(vk::Kernel kernel, TunableCall call) {
    const KernelShape s = kernel_shape(kernel, call);
    if (call_log_) {
        call.kernel = vk::kernel_name(kernel);
        call.key = vk::shape_key(kernel, s.rows, s.n, s.k, s.layout).to_string();
        call_log_->push_back(std::move(call));
    }
    return table_.choose(kernel, s.rows, s.n, s.k, s.layout);
}

std::vector<std::string> VulkanBackend::variants(const TunableCall& call) const {
    const vk::Kernel k = kernel_named(call.kernel);
    // The cooperative-matrix form runs for fp16 weights only (a model's f16 weights or the
    // copies of f32 ones, matmul.cpp); for other calls it would time its fp32 tile again.
    const bool fp16_weights =
        (call.op == TunableCall::Op::Linear || call.op == TunableCall::Op::GroupedMatmul) &&
        (call.weight == DType::F16 || (call.weight == DType::F32 && call.reduced_weights));
    std::vector<std::string> names;
    for (const vk::Variant& v : vk::candidates(k, ctx_->info()))
        if (fp16_weights || !is_coop(k, v)) names.push_back(v.name(k));
    return names;
}

std::string VulkanBackend::default_variant(const TunableCall& call) const {
    const vk::Kernel k = kernel_named(call.kernel);
    const KernelShape s = kernel_shape(k, call);
    return table_.default_variant(k, s.rows, s.n, s.k, s.layout).name(k);
}

void VulkanBackend::force_variant(const std::string& kernel, const std::string& variant) {
    const vk::Kernel k = kernel_named(kernel);
    if (variant.empty()) return table_.force(k, std::nullopt);
    const std::optional<vk::Variant> v = vk::parse_variant(k, variant);
    if (!v) throw Error("Vulkan: '" + variant + "' is not a variant of " + kernel);
    table_.force(k, v);
}

std::string VulkanBackend::tuning_path() const {
    return vk::tuning_file_path(ctx_->info());
}

std::string VulkanBackend::save_tuning(const std::vector<TunedChoice>& choices) {
    vk::TuningFile f;
    f.device = vk::identity_of(ctx_->info());
    f.shaders = vk::shaders_hash();
    for (const TunedChoice& c : choices) {
        const vk::Kernel k = kernel_named(c.call.kernel);
        const KernelShape s = kernel_shape(k, c.call);
        const std::optional<vk::Variant> best = vk::parse_variant(k, c.best);
        if (!best)
            throw std::logic_error("save_tuning: '" + c.best + "' is no variant of " +
                                   c.call.kernel);
        f.shapes.push_back({vk::shape_key(k, s.rows, s.n, s.k, s.layout), *best, c.best_ms,
                            c.default_ms, c.candidates_tried});
    }
    const std::string path = tuning_path();
    // Shapes an earlier tune on this device measured (another model's) and this one did not
    // are kept: one file serves every model run here.
    std::error_code ec;
    if (std::filesystem::exists(path, ec)) {
        const vk::LoadedTuning before = vk::load_tuning(ctx_->info(), path);
        if (before.file)
            for (const vk::TunedShape& old : before.file->shapes)
                if (std::none_of(f.shapes.begin(), f.shapes.end(),
                                 [&](const vk::TunedShape& s) { return s.key == old.key; }))
                    f.shapes.push_back(old);
    }
    std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
    if (ec)
        throw Error("cannot create " + std::filesystem::path(path).parent_path().string() + ": " +
                    ec.message());
    write_file_atomic(path, vk::tuning_file_json(f));
    table_.set_tuned(f, path);
    tuning_status_ = "tuned (" + std::to_string(f.shapes.size()) + " shapes, " + path + ")";
    return path;
}

void VulkanBackend::load_tuning(const vk::VulkanOptions& options) {
    const vk::LoadedTuning t = vk::load_tuning(ctx_->info(), options.tuning);
    tuning_status_ = t.status;
    if (t.file) table_.set_tuned(*t.file, t.path);
    // A file that does not apply never stops the backend: the defaults run, and the user is
    // told why once.
    if (!t.refused.empty())
        std::fprintf(stderr, "tmx: Vulkan tuning refused, using the defaults: %s\n",
                     t.refused.c_str());
}

}  // namespace tmx

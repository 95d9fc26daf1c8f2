// Shader modules, descriptor-set layouts and compute pipelines, all cached.
#include "backends/vulkan/vulkan_pipelines.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <system_error>

#include "backends/vulkan/vulkan_shaders.h"
#include "engine/core/errors.h"
#include "engine/core/file_io.h"

namespace tmx::vk {

namespace {

// TMX_VULKAN_PIPELINE_CACHE=off: no pipeline-cache file is read or written (the in-memory
// cache stays), e.g. to time cold pipeline creation or to rule out a bad cache file.
bool cache_file_disabled() {
    const char* env = std::getenv("TMX_VULKAN_PIPELINE_CACHE");
    return env && std::strcmp(env, "off") == 0;
}

uint32_t read_u32(const std::string& data, size_t offset) {
    uint32_t v = 0;
    std::memcpy(&v, data.data() + offset, sizeof v);  // the header is in host byte order
    return v;
}

std::string hex(uint32_t v) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "0x%04x", v);
    return buf;
}

// Why the driver should not be given `data`, or "" when its header (Vulkan spec, "Pipeline
// Cache Header") names this device and driver. Drivers are meant to reject a foreign cache
// themselves, but not all do so safely, so a mismatch never reaches them.
std::string header_mismatch(const std::string& data, const DeviceInfo& info) {
    constexpr size_t kHeaderBytes = 16 + VK_UUID_SIZE;
    if (data.size() < kHeaderBytes)
        return "truncated (" + std::to_string(data.size()) + " bytes, the header alone is " +
               std::to_string(kHeaderBytes) + ")";
    const uint32_t header_size = read_u32(data, 0), version = read_u32(data, 4);
    const uint32_t vendor = read_u32(data, 8), device = read_u32(data, 12);
    if (header_size < kHeaderBytes || header_size > data.size())
        return "invalid header size " + std::to_string(header_size) + " in a file of " +
               std::to_string(data.size()) + " bytes";
    if (version != VK_PIPELINE_CACHE_HEADER_VERSION_ONE)
        return "unknown header version " + std::to_string(version);
    if (vendor != info.vendor_id || device != info.device_id)
        return "written for vendor " + hex(vendor) + " device " + hex(device) + ", not " +
               hex(info.vendor_id) + " " + hex(info.device_id);
    if (std::memcmp(data.data() + 16, info.pipeline_cache_uuid.data(), VK_UUID_SIZE) != 0)
        return "written by another driver version (pipeline-cache UUID differs)";
    return "";
}

}  // namespace

Pipelines::Pipelines(std::shared_ptr<Context> ctx, std::string cache_file)
    : ctx_(std::move(ctx)), cache_file_(cache_file_disabled() ? "" : std::move(cache_file)) {
    std::string data;
    std::error_code ec;
    if (!cache_file_.empty() && std::filesystem::exists(cache_file_, ec)) {
        std::string why;
        try {
            data = read_file(cache_file_);
            why = header_mismatch(data, ctx_->info());
        } catch (const Error& e) {
            why = e.what();
        }
        if (!why.empty()) {
            std::fprintf(stderr, "tmx: ignoring Vulkan pipeline cache %s: %s\n",
                         cache_file_.c_str(), why.c_str());
            data.clear();
        }
    }
    VkPipelineCacheCreateInfo info{VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO};
    if (!data.empty()) {
        info.initialDataSize = data.size();
        info.pInitialData = data.data();
        const VkResult r = vkCreatePipelineCache(ctx_->device(), &info, nullptr, &cache_);
        if (r == VK_SUCCESS) {
            loaded_ = true;
            saved_bytes_ = data.size();
            return;
        }
        // A driver may still refuse data whose header matched; starting cold is always fine.
        std::fprintf(stderr, "tmx: ignoring Vulkan pipeline cache %s: the driver refused it (%d)\n",
                     cache_file_.c_str(), static_cast<int>(r));
        cache_ = VK_NULL_HANDLE;
        info.initialDataSize = 0;
        info.pInitialData = nullptr;
    }
    check(vkCreatePipelineCache(ctx_->device(), &info, nullptr, &cache_), "vkCreatePipelineCache");
}

void Pipelines::save_cache() {
    if (cache_file_.empty() || created_ == 0 || cache_ == VK_NULL_HANDLE) return;
    // Never throws: the destructor calls it, and a cache that cannot be kept only costs time.
    auto warn = [&](const std::string& why) {
        std::fprintf(stderr, "tmx: cannot write Vulkan pipeline cache %s: %s\n",
                     cache_file_.c_str(), why.c_str());
    };
    try {
        size_t size = 0;
        check(vkGetPipelineCacheData(ctx_->device(), cache_, &size, nullptr),
              "vkGetPipelineCacheData");
        std::string data(size, '\0');
        check(vkGetPipelineCacheData(ctx_->device(), cache_, &size, data.data()),
              "vkGetPipelineCacheData");
        data.resize(size);
        // Pipelines the file already held leave the cache as it was: no rewrite at every exit.
        if (size == saved_bytes_) {
            created_ = 0;
            return;
        }
        const std::filesystem::path parent = std::filesystem::path(cache_file_).parent_path();
        if (!parent.empty()) {
            std::error_code ec;
            std::filesystem::create_directories(parent, ec);
            if (ec) return warn("cannot create " + parent.string() + ": " + ec.message());
        }
        write_file_atomic(cache_file_, data);
        created_ = 0;
        saved_bytes_ = size;
    } catch (const std::exception& e) {
        warn(e.what());
    }
}

Pipelines::~Pipelines() {
    try {
        save_cache();
    } catch (...) {
        // save_cache() reports its own failures; nothing may escape a destructor.
    }
    VkDevice dev = ctx_->device();
    for (auto& [key, p] : pipelines_) vkDestroyPipeline(dev, p.pipeline, nullptr);
    for (auto& [n, l] : layouts_) vkDestroyPipelineLayout(dev, l, nullptr);
    for (auto& [n, l] : set_layouts_) vkDestroyDescriptorSetLayout(dev, l, nullptr);
    for (auto& [name, m] : modules_) vkDestroyShaderModule(dev, m, nullptr);
    vkDestroyPipelineCache(dev, cache_, nullptr);
}

VkShaderModule Pipelines::module(const std::string& shader) {
    if (auto it = modules_.find(shader); it != modules_.end()) return it->second;
    for (const EmbeddedShader& s : embedded_shaders()) {
        if (shader != s.name) continue;
        VkShaderModuleCreateInfo info{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
        info.codeSize = s.words * sizeof(uint32_t);
        info.pCode = s.code;
        VkShaderModule m = VK_NULL_HANDLE;
        check(vkCreateShaderModule(ctx_->device(), &info, nullptr, &m), "vkCreateShaderModule");
        return modules_[shader] = m;
    }
    throw std::logic_error("Vulkan backend: no embedded shader '" + shader + "'");
}

VkDescriptorSetLayout Pipelines::set_layout(uint32_t bindings) {
    if (auto it = set_layouts_.find(bindings); it != set_layouts_.end()) return it->second;
    std::vector<VkDescriptorSetLayoutBinding> b(bindings);
    for (uint32_t i = 0; i < bindings; ++i)
        b[i] = {i, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1, VK_SHADER_STAGE_COMPUTE_BIT, nullptr};
    VkDescriptorSetLayoutCreateInfo info{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
    info.bindingCount = bindings;
    info.pBindings = b.data();
    VkDescriptorSetLayout l = VK_NULL_HANDLE;
    check(vkCreateDescriptorSetLayout(ctx_->device(), &info, nullptr, &l),
          "vkCreateDescriptorSetLayout");
    set_layouts_[bindings] = l;

    VkPushConstantRange push{VK_SHADER_STAGE_COMPUTE_BIT, 0, kPushBytes};
    VkPipelineLayoutCreateInfo pl{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
    pl.setLayoutCount = 1;
    pl.pSetLayouts = &l;
    pl.pushConstantRangeCount = 1;
    pl.pPushConstantRanges = &push;
    VkPipelineLayout layout = VK_NULL_HANDLE;
    check(vkCreatePipelineLayout(ctx_->device(), &pl, nullptr, &layout), "vkCreatePipelineLayout");
    layouts_[bindings] = layout;
    return l;
}

const Pipeline& Pipelines::get(const std::string& shader, uint32_t bindings,
                               const std::vector<uint32_t>& spec) {
    auto key = std::make_pair(shader + "/" + std::to_string(bindings), spec);
    if (auto it = pipelines_.find(key); it != pipelines_.end()) return it->second;

    Pipeline p;
    p.shader = shader;
    p.bindings = bindings;
    p.set_layout = set_layout(bindings);
    p.layout = layouts_.at(bindings);
    std::vector<VkSpecializationMapEntry> entries(spec.size());
    for (uint32_t i = 0; i < spec.size(); ++i)
        entries[i] = {i, i * static_cast<uint32_t>(sizeof(uint32_t)), sizeof(uint32_t)};
    VkSpecializationInfo si{static_cast<uint32_t>(entries.size()), entries.data(),
                            spec.size() * sizeof(uint32_t), key.second.data()};
    VkComputePipelineCreateInfo info{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
    info.stage = {VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO};
    info.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
    info.stage.module = module(shader);
    info.stage.pName = "main";
    info.stage.pSpecializationInfo = spec.size() ? &si : nullptr;
    info.layout = p.layout;
    check(vkCreateComputePipelines(ctx_->device(), cache_, 1, &info, nullptr, &p.pipeline),
          ("vkCreateComputePipelines for " + shader).c_str());
    ++created_;
    return pipelines_[key] = p;
}

}  // namespace tmx::vk

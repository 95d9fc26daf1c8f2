// Shader modules, descriptor-set layouts and compute pipelines, all cached.
#include "backends/vulkan/vulkan_pipelines.h"

#include "backends/vulkan/vulkan_shaders.h"
#include "engine/core/errors.h"

namespace tmx::vk {

Pipelines::Pipelines(std::shared_ptr<Context> ctx) : ctx_(std::move(ctx)) {
    VkPipelineCacheCreateInfo info{VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO};
    check(vkCreatePipelineCache(ctx_->device(), &info, nullptr, &cache_), "vkCreatePipelineCache");
}

Pipelines::~Pipelines() {
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
                               std::initializer_list<uint32_t> spec) {
    auto key = std::make_pair(shader + "/" + std::to_string(bindings), std::vector<uint32_t>(spec));
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
    return pipelines_[key] = p;
}

}  // namespace tmx::vk

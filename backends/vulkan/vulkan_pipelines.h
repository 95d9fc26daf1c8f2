// Compute pipelines built from the embedded SPIR-V (vulkan_shaders.h), created on first use and
// cached per (shader, specialization constants). Specialization constants carry workgroup and
// tile sizes (constant_id i = the i-th value given); push constants carry shapes and offsets.
// Every shader's descriptor set 0 holds `bindings` storage buffers at bindings 0..n-1.
#pragma once

#include <vulkan/vulkan.h>

#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backends/vulkan/vulkan_context.h"

namespace tmx::vk {

struct Pipeline {
    std::string shader;  // the shader it runs, as Pipelines::get() was given it
    VkPipeline pipeline = VK_NULL_HANDLE;
    VkPipelineLayout layout = VK_NULL_HANDLE;
    VkDescriptorSetLayout set_layout = VK_NULL_HANDLE;
    uint32_t bindings = 0;
};

class Pipelines {
  public:
    // The push-constant range every pipeline declares: the minimum every device supports.
    static constexpr uint32_t kPushBytes = 128;

    // cache_file: where the VkPipelineCache is kept between runs ("" keeps it in memory only).
    // A file that exists is loaded when its header names this device and driver (vendor and
    // device ids, pipeline-cache UUID) and ignored otherwise (a message says why); the cache is
    // written back atomically when this object is destroyed, if pipelines were created that
    // the file did not hold. TMX_VULKAN_PIPELINE_CACHE=off: no file is read or written.
    Pipelines(std::shared_ptr<Context> ctx, std::string cache_file = "");
    ~Pipelines();
    Pipelines(const Pipelines&) = delete;
    Pipelines& operator=(const Pipelines&) = delete;

    const Pipeline& get(const std::string& shader, uint32_t bindings,
                        const std::vector<uint32_t>& spec = {});
    size_t size() const { return pipelines_.size(); }
    // Whether the on-disk cache was loaded at construction.
    bool loaded_cache_file() const { return loaded_; }
    // Writes the cache to the file now (also done at destruction); no-op without a file.
    void save_cache();

  private:
    VkShaderModule module(const std::string& shader);
    VkDescriptorSetLayout set_layout(uint32_t bindings);

    std::shared_ptr<Context> ctx_;
    VkPipelineCache cache_ = VK_NULL_HANDLE;
    std::string cache_file_;
    bool loaded_ = false;
    size_t created_ = 0;      // pipelines created since the cache was loaded or saved
    size_t saved_bytes_ = 0;  // the cache's size as the file holds it
    std::map<std::string, VkShaderModule> modules_;
    std::map<uint32_t, VkDescriptorSetLayout> set_layouts_;
    std::map<uint32_t, VkPipelineLayout> layouts_;
    std::map<std::pair<std::string, std::vector<uint32_t>>, Pipeline> pipelines_;
};

}  // namespace tmx::vk

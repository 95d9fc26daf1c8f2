// Vulkan instance, physical-device selection and the logical device with its compute queue.
//
// Device choice (make_backend("vulkan")): VulkanOptions::device when set, else the environment
// variable TMX_VULKAN_DEVICE=N, else the first discrete GPU, then the first integrated GPU,
// then the first device of any kind. Indices are those `tmx devices` lists.
//
// fp16 weights (use_fp16_weights): f32 matmul weights read from fp16 copies, halving the
// weight traffic that bounds decode (arithmetic stays fp32; logits move by about 1e-3
// relative). VulkanOptions::fp16_weights when set, else TMX_VULKAN_FP16=0/1, else on. The
// shaders unpack fp16 from 32-bit words (shaders/weights.glsl), so every device runs them. The
// fp32 path stays: the one the tests compare with the CPU backend at fp32 tolerances.
#pragma once

#include <vulkan/vulkan.h>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace tmx::vk {

// Throws tmx::Error "Vulkan: <what> failed (<VkResult name>)".
[[noreturn]] void fail(VkResult result, const std::string& what);
inline void check(VkResult result, const char* what) {
    if (result != VK_SUCCESS) fail(result, what);
}

struct VulkanOptions {
    int device = -1;          // index into list_vulkan_devices(); -1: TMX_VULKAN_DEVICE or default
    bool validation = false;  // VK_LAYER_KHRONOS_validation (also TMX_VULKAN_VALIDATION=1)
    std::optional<bool> fp16_weights;  // unset: TMX_VULKAN_FP16 or the device's default
    // The matmul shapes' tuning (vulkan_tuning.h): "off", or a tuning file; unset:
    // TMX_VULKAN_TUNING, else the device's file in tmx's cache directory if there is one.
    std::optional<std::string> tuning;
};

// What `tmx devices` shows, and what the backend uses to pick pipelines.
struct DeviceInfo {
    uint32_t index = 0;
    std::string name;
    std::string type;  // discrete, integrated, virtual, cpu, other
    std::string api_version;
    bool usable = false;  // Vulkan 1.2+ with a compute queue
    uint64_t device_local_bytes = 0;
    uint32_t subgroup_size = 0;
    bool subgroup_arithmetic = false;  // subgroupAdd & co. in compute shaders
    bool subgroup_shuffle = false;     // subgroupShuffleXor & co. in compute shaders
    uint32_t shared_memory_bytes = 0;
    uint32_t max_workgroup_invocations = 0;
    bool fp16 = false;                // shaderFloat16 and 16-bit storage buffers
    bool cooperative_matrix = false;  // VK_KHR_cooperative_matrix or VK_NV_cooperative_matrix
    // The columns N of the 16 x N x 16 fp16 product (fp32 accumulators, subgroup scope) that the
    // tiled matmuls' ".cm" variants run on VK_NV_cooperative_matrix (shaders/
    // matmul_tile_coopmat.glsl): 16 or 8, 0 where the device lacks the extension, its features
    // (cooperativeMatrix, shaderFloat16, vulkanMemoryModel) or such a shape, where
    // TMX_VULKAN_COOPMAT=0, or where the device could not be created with them (Context).
    uint32_t coopmat_columns = 0;
    uint64_t max_storage_buffer_range = 0;
    uint64_t max_allocation_bytes = 0;
    uint32_t max_workgroup_size_x = 0;
    // What tuned shapes and the on-disk pipeline cache are keyed by (vulkan_tuning.h): the
    // PCI vendor and device ids, the driver's own version number and its pipeline-cache UUID
    // (which a driver changes whenever its compiled pipelines would differ).
    uint32_t vendor_id = 0, device_id = 0, driver_version = 0;
    std::array<uint8_t, VK_UUID_SIZE> pipeline_cache_uuid{};
};

// One shape VK_NV_cooperative_matrix lists (vkGetPhysicalDeviceCooperativeMatrixPropertiesNV).
struct CoopmatShape {
    uint32_t m = 0, n = 0, k = 0;
    VkComponentTypeNV a = VK_COMPONENT_TYPE_FLOAT32_NV, b = VK_COMPONENT_TYPE_FLOAT32_NV,
                      c = VK_COMPONENT_TYPE_FLOAT32_NV, d = VK_COMPONENT_TYPE_FLOAT32_NV;
    VkScopeNV scope = VK_SCOPE_DEVICE_NV;
};
// DeviceInfo::coopmat_columns for the shapes a device lists: 16 where it has 16 x 16 x 16 with
// fp16 inputs, fp32 accumulators and subgroup scope, else 8 for 16 x 8 x 16, else 0.
uint32_t coopmat_columns(const std::vector<CoopmatShape>& shapes);

// Every physical device the loader reports. Throws tmx::Error when Vulkan is unavailable.
std::vector<DeviceInfo> list_vulkan_devices();
// Whether the loader finds VK_LAYER_KHRONOS_validation (VulkanOptions::validation needs it).
bool validation_layer_installed();
// The index make_backend("vulkan") picks without an explicit choice (see the top of the file).
uint32_t default_vulkan_device(const std::vector<DeviceInfo>& devices);
// Whether cooperative matrices may be used (DeviceInfo::coopmat_columns): TMX_VULKAN_COOPMAT
// unset or 1 yes, 0 no; throws tmx::Error for another value.
bool coopmat_allowed();
// Whether the backend reads f32 matmul weights through fp16 copies (see the top of the file).
// Throws tmx::Error for a TMX_VULKAN_FP16 other than 0 or 1.
bool use_fp16_weights(std::optional<bool> requested = {});

// One logical device with one compute queue. Not copyable; shared by the backend's parts.
class Context {
  public:
    explicit Context(const VulkanOptions& options);
    ~Context();
    Context(const Context&) = delete;
    Context& operator=(const Context&) = delete;

    VkInstance instance() const { return instance_; }
    VkPhysicalDevice physical_device() const { return physical_; }
    VkDevice device() const { return device_; }
    VkQueue queue() const { return queue_; }
    uint32_t queue_family() const { return queue_family_; }
    const DeviceInfo& info() const { return info_; }
    // use_fp16_weights() for the options.
    bool fp16_weights() const { return fp16_weights_; }
    const VkPhysicalDeviceLimits& limits() const { return limits_; }
    const VkPhysicalDeviceMemoryProperties& memory_properties() const { return memory_; }

    // Messages of severity error (and warning) the validation layer reported so far.
    uint64_t validation_errors() const { return messages_->errors; }
    uint64_t validation_warnings() const { return messages_->warnings; }

    struct MessageCounts {
        uint64_t errors = 0, warnings = 0;
    };

  private:
    void release();

    VkInstance instance_ = VK_NULL_HANDLE;
    VkDebugUtilsMessengerEXT messenger_ = VK_NULL_HANDLE;
    VkPhysicalDevice physical_ = VK_NULL_HANDLE;
    VkDevice device_ = VK_NULL_HANDLE;
    VkQueue queue_ = VK_NULL_HANDLE;
    uint32_t queue_family_ = 0;
    DeviceInfo info_;
    bool fp16_weights_ = false;
    VkPhysicalDeviceLimits limits_{};
    VkPhysicalDeviceMemoryProperties memory_{};
    std::unique_ptr<MessageCounts> messages_ = std::make_unique<MessageCounts>();
};

}  // namespace tmx::vk

// Vulkan instance, device listing and selection, logical device.
#include "backends/vulkan/vulkan_context.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "engine/core/errors.h"

namespace tmx::vk {
namespace {

const char* kValidationLayer = "VK_LAYER_KHRONOS_validation";

const char* result_name(VkResult r) {
    switch (r) {
#define TMX_VK_RESULT(x) \
    case x:              \
        return #x;
        TMX_VK_RESULT(VK_NOT_READY)
        TMX_VK_RESULT(VK_TIMEOUT)
        TMX_VK_RESULT(VK_INCOMPLETE)
        TMX_VK_RESULT(VK_ERROR_OUT_OF_HOST_MEMORY)
        TMX_VK_RESULT(VK_ERROR_OUT_OF_DEVICE_MEMORY)
        TMX_VK_RESULT(VK_ERROR_INITIALIZATION_FAILED)
        TMX_VK_RESULT(VK_ERROR_DEVICE_LOST)
        TMX_VK_RESULT(VK_ERROR_MEMORY_MAP_FAILED)
        TMX_VK_RESULT(VK_ERROR_LAYER_NOT_PRESENT)
        TMX_VK_RESULT(VK_ERROR_EXTENSION_NOT_PRESENT)
        TMX_VK_RESULT(VK_ERROR_FEATURE_NOT_PRESENT)
        TMX_VK_RESULT(VK_ERROR_INCOMPATIBLE_DRIVER)
        TMX_VK_RESULT(VK_ERROR_TOO_MANY_OBJECTS)
        TMX_VK_RESULT(VK_ERROR_FORMAT_NOT_SUPPORTED)
        TMX_VK_RESULT(VK_ERROR_FRAGMENTED_POOL)
        TMX_VK_RESULT(VK_ERROR_OUT_OF_POOL_MEMORY)
#undef TMX_VK_RESULT
        default:
            return "VkResult error";
    }
}

std::string version_string(uint32_t v) {
    return std::to_string(VK_API_VERSION_MAJOR(v)) + "." + std::to_string(VK_API_VERSION_MINOR(v)) +
           "." + std::to_string(VK_API_VERSION_PATCH(v));
}

bool env_flag(const char* name) {
    const char* v = std::getenv(name);
    return v && *v && std::strcmp(v, "0") != 0;
}

bool has_layer(const char* name) {
    uint32_t n = 0;
    vkEnumerateInstanceLayerProperties(&n, nullptr);
    std::vector<VkLayerProperties> layers(n);
    vkEnumerateInstanceLayerProperties(&n, layers.data());
    for (const auto& l : layers)
        if (std::strcmp(l.layerName, name) == 0) return true;
    return false;
}

VKAPI_ATTR VkBool32 VKAPI_CALL on_message(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                          VkDebugUtilsMessageTypeFlagsEXT,
                                          const VkDebugUtilsMessengerCallbackDataEXT* data,
                                          void* user) {
    auto* counts = static_cast<Context::MessageCounts*>(user);
    if (severity & VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT) {
        ++counts->errors;
        std::fprintf(stderr, "vulkan validation error: %s\n", data->pMessage);
    } else if (severity & VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT) {
        ++counts->warnings;
        std::fprintf(stderr, "vulkan validation warning: %s\n", data->pMessage);
    }
    return VK_FALSE;
}

VkDebugUtilsMessengerCreateInfoEXT messenger_info(Context::MessageCounts* counts) {
    VkDebugUtilsMessengerCreateInfoEXT info{
        VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT};
    info.messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT |
                           VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT;
    info.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT |
                       VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                       VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT;
    info.pfnUserCallback = on_message;
    info.pUserData = counts;
    return info;
}

// An instance for Vulkan 1.2, with the validation layer and a messenger when counts is given.
VkInstance create_instance(Context::MessageCounts* counts) {
    VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
    app.pApplicationName = "tmx";
    app.pEngineName = "tiny-mixtral";
    app.apiVersion = VK_API_VERSION_1_2;
    VkInstanceCreateInfo info{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
    info.pApplicationInfo = &app;
    const char* ext = VK_EXT_DEBUG_UTILS_EXTENSION_NAME;
    VkDebugUtilsMessengerCreateInfoEXT msg{};
    VkValidationFeaturesEXT features{VK_STRUCTURE_TYPE_VALIDATION_FEATURES_EXT};
    const VkValidationFeatureEnableEXT sync_validation =
        VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT;
    if (counts) {
        if (!has_layer(kValidationLayer))
            throw Error(std::string("Vulkan validation was requested but ") + kValidationLayer +
                        " is not installed (Debian: apt-get install vulkan-validationlayers)");
        info.enabledLayerCount = 1;
        info.ppEnabledLayerNames = &kValidationLayer;
        info.enabledExtensionCount = 1;
        info.ppEnabledExtensionNames = &ext;
        msg = messenger_info(counts);
        // Synchronization validation checks the stream's barriers (vulkan_commands.h): a
        // missing one between dependent commands is reported as a hazard error.
        features.enabledValidationFeatureCount = 1;
        features.pEnabledValidationFeatures = &sync_validation;
        features.pNext = &msg;  // the messenger also reports vkCreateInstance's own problems
        info.pNext = &features;
    }
    VkInstance instance = VK_NULL_HANDLE;
    VkResult r = vkCreateInstance(&info, nullptr, &instance);
    if (r == VK_ERROR_INCOMPATIBLE_DRIVER || r == VK_ERROR_INITIALIZATION_FAILED)
        throw Error(
            "no Vulkan driver found (install a GPU driver, or Mesa's lavapipe: apt-get install "
            "mesa-vulkan-drivers)");
    check(r, "vkCreateInstance");
    return instance;
}

std::vector<VkPhysicalDevice> physical_devices(VkInstance instance) {
    uint32_t n = 0;
    check(vkEnumeratePhysicalDevices(instance, &n, nullptr), "vkEnumeratePhysicalDevices");
    std::vector<VkPhysicalDevice> devs(n);
    check(vkEnumeratePhysicalDevices(instance, &n, devs.data()), "vkEnumeratePhysicalDevices");
    return devs;
}

bool compute_queue_family(VkPhysicalDevice dev, uint32_t* family) {
    uint32_t n = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(dev, &n, nullptr);
    std::vector<VkQueueFamilyProperties> fams(n);
    vkGetPhysicalDeviceQueueFamilyProperties(dev, &n, fams.data());
    // Prefer a family that also does graphics: on most GPUs it is the fastest queue for
    // compute, and a compute-only family is an async queue with fewer resources.
    int best = -1;
    for (uint32_t i = 0; i < n; ++i) {
        if (!(fams[i].queueFlags & VK_QUEUE_COMPUTE_BIT)) continue;
        if (best < 0 || (fams[i].queueFlags & VK_QUEUE_GRAPHICS_BIT)) best = static_cast<int>(i);
        if (fams[i].queueFlags & VK_QUEUE_GRAPHICS_BIT) break;
    }
    if (best < 0) return false;
    *family = static_cast<uint32_t>(best);
    return true;
}

// DeviceInfo::coopmat_columns of a device (0 unless it has the extension, its features and a
// shape; TMX_VULKAN_COOPMAT=0 turns it off).
uint32_t usable_coopmat_columns(VkInstance instance, VkPhysicalDevice dev, bool has_extension) {
    if (!coopmat_allowed() || !has_extension) return 0;
    VkPhysicalDeviceCooperativeMatrixFeaturesNV coop{
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV};
    VkPhysicalDeviceVulkan12Features f12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES,
                                         &coop};
    VkPhysicalDeviceFeatures2 f{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, &f12};
    vkGetPhysicalDeviceFeatures2(dev, &f);
    VkPhysicalDeviceCooperativeMatrixPropertiesNV stages{
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_PROPERTIES_NV};
    VkPhysicalDeviceProperties2 props{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, &stages};
    vkGetPhysicalDeviceProperties2(dev, &props);
    if (!coop.cooperativeMatrix || !f12.shaderFloat16 || !f12.vulkanMemoryModel ||
        !(stages.cooperativeMatrixSupportedStages & VK_SHADER_STAGE_COMPUTE_BIT))
        return 0;
    auto list = reinterpret_cast<PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesNV>(
        vkGetInstanceProcAddr(instance, "vkGetPhysicalDeviceCooperativeMatrixPropertiesNV"));
    if (!list) return 0;
    uint32_t n = 0;
    if (list(dev, &n, nullptr) != VK_SUCCESS || n == 0) return 0;
    std::vector<VkCooperativeMatrixPropertiesNV> props_nv(
        n, {VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_NV});
    if (list(dev, &n, props_nv.data()) < 0) return 0;  // VK_INCOMPLETE still lists n
    std::vector<CoopmatShape> shapes;
    for (uint32_t i = 0; i < n; ++i) {
        const VkCooperativeMatrixPropertiesNV& p = props_nv[i];
        shapes.push_back({p.MSize, p.NSize, p.KSize, p.AType, p.BType, p.CType, p.DType, p.scope});
    }
    return coopmat_columns(shapes);
}

DeviceInfo describe(VkInstance instance, VkPhysicalDevice dev, uint32_t index) {
    VkPhysicalDeviceSubgroupProperties subgroup{
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
    VkPhysicalDeviceProperties2 props{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, &subgroup};
    vkGetPhysicalDeviceProperties2(dev, &props);
    const VkPhysicalDeviceProperties& p = props.properties;

    DeviceInfo info;
    info.index = index;
    info.name = p.deviceName;
    switch (p.deviceType) {
        case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU:
            info.type = "discrete";
            break;
        case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU:
            info.type = "integrated";
            break;
        case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU:
            info.type = "virtual";
            break;
        case VK_PHYSICAL_DEVICE_TYPE_CPU:
            info.type = "cpu";
            break;
        default:
            info.type = "other";
            break;
    }
    info.api_version = version_string(p.apiVersion);
    uint32_t family = 0;
    info.usable = p.apiVersion >= VK_API_VERSION_1_2 && compute_queue_family(dev, &family);
    info.subgroup_size = subgroup.subgroupSize;
    const bool compute_subgroups = subgroup.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT;
    info.subgroup_arithmetic =
        compute_subgroups && (subgroup.supportedOperations & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT);
    info.subgroup_shuffle =
        compute_subgroups && (subgroup.supportedOperations & VK_SUBGROUP_FEATURE_SHUFFLE_BIT);
    info.shared_memory_bytes = p.limits.maxComputeSharedMemorySize;
    info.max_workgroup_invocations = p.limits.maxComputeWorkGroupInvocations;
    info.max_storage_buffer_range = p.limits.maxStorageBufferRange;
    info.max_workgroup_size_x = p.limits.maxComputeWorkGroupSize[0];
    info.vendor_id = p.vendorID;
    info.device_id = p.deviceID;
    info.driver_version = p.driverVersion;
    std::copy(std::begin(p.pipelineCacheUUID), std::end(p.pipelineCacheUUID),
              info.pipeline_cache_uuid.begin());

    VkPhysicalDeviceMaintenance3Properties m3{
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES};
    VkPhysicalDeviceProperties2 props2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, &m3};
    vkGetPhysicalDeviceProperties2(dev, &props2);
    info.max_allocation_bytes = m3.maxMemoryAllocationSize;

    VkPhysicalDeviceMemoryProperties mem;
    vkGetPhysicalDeviceMemoryProperties(dev, &mem);
    for (uint32_t h = 0; h < mem.memoryHeapCount; ++h)
        if (mem.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT)
            info.device_local_bytes += mem.memoryHeaps[h].size;

    if (info.usable) {
        VkPhysicalDeviceVulkan11Features f11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES};
        VkPhysicalDeviceVulkan12Features f12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES,
                                             &f11};
        VkPhysicalDeviceFeatures2 f{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, &f12};
        vkGetPhysicalDeviceFeatures2(dev, &f);
        info.fp16 = f12.shaderFloat16 && f11.storageBuffer16BitAccess;
    }
    uint32_t n = 0;
    vkEnumerateDeviceExtensionProperties(dev, nullptr, &n, nullptr);
    std::vector<VkExtensionProperties> exts(n);
    vkEnumerateDeviceExtensionProperties(dev, nullptr, &n, exts.data());
    bool nv_coopmat = false;
    for (const auto& e : exts) {
        if (std::strcmp(e.extensionName, "VK_KHR_cooperative_matrix") == 0 ||
            std::strcmp(e.extensionName, VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME) == 0)
            info.cooperative_matrix = true;
        if (std::strcmp(e.extensionName, VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME) == 0)
            nv_coopmat = true;
    }
    if (info.usable) info.coopmat_columns = usable_coopmat_columns(instance, dev, nv_coopmat);
    return info;
}

uint32_t choose_device(const std::vector<DeviceInfo>& devices, int requested) {
    if (requested < 0) {
        if (const char* env = std::getenv("TMX_VULKAN_DEVICE"); env && *env) {
            char* end = nullptr;
            long v = std::strtol(env, &end, 10);
            if (*end != '\0' || v < 0)
                throw Error(std::string("TMX_VULKAN_DEVICE must be a device index, got '") + env +
                            "'");
            requested = static_cast<int>(v);
        }
    }
    if (requested < 0) return default_vulkan_device(devices);
    if (static_cast<size_t>(requested) >= devices.size())
        throw Error("Vulkan device " + std::to_string(requested) + " does not exist (" +
                    std::to_string(devices.size()) + " found; see tmx devices)");
    const DeviceInfo& d = devices[static_cast<size_t>(requested)];
    if (!d.usable)
        throw Error("Vulkan device " + std::to_string(requested) + " (" + d.name +
                    ") cannot run tmx: it needs Vulkan 1.2 and a compute queue (it has " +
                    d.api_version + ")");
    return static_cast<uint32_t>(requested);
}

}  // namespace

uint32_t coopmat_columns(const std::vector<CoopmatShape>& shapes) {
    uint32_t best = 0;
    for (const CoopmatShape& s : shapes)
        if (s.m == 16 && s.k == 16 && (s.n == 16 || s.n == 8) &&
            s.a == VK_COMPONENT_TYPE_FLOAT16_NV && s.b == VK_COMPONENT_TYPE_FLOAT16_NV &&
            s.c == VK_COMPONENT_TYPE_FLOAT32_NV && s.d == VK_COMPONENT_TYPE_FLOAT32_NV &&
            s.scope == VK_SCOPE_SUBGROUP_NV)
            best = std::max(best, s.n);
    return best;
}

void fail(VkResult result, const std::string& what) {
    throw Error("Vulkan: " + what + " failed (" + result_name(result) + ")");
}

bool validation_layer_installed() {
    return has_layer(kValidationLayer);
}

std::vector<DeviceInfo> list_vulkan_devices() {
    VkInstance instance = create_instance(nullptr);
    std::vector<DeviceInfo> out;
    try {
        auto devs = physical_devices(instance);
        for (uint32_t i = 0; i < devs.size(); ++i) out.push_back(describe(instance, devs[i], i));
    } catch (...) {
        vkDestroyInstance(instance, nullptr);
        throw;
    }
    vkDestroyInstance(instance, nullptr);
    return out;
}

uint32_t default_vulkan_device(const std::vector<DeviceInfo>& devices) {
    for (const char* type : {"discrete", "integrated"})
        for (const DeviceInfo& d : devices)
            if (d.usable && d.type == type) return d.index;
    for (const DeviceInfo& d : devices)
        if (d.usable) return d.index;
    throw Error(devices.empty() ? "no Vulkan device found"
                                : "no Vulkan device supports Vulkan 1.2 compute (see tmx devices)");
}

bool coopmat_allowed() {
    const char* env = std::getenv("TMX_VULKAN_COOPMAT");
    if (!env || !*env || std::strcmp(env, "1") == 0) return true;
    if (std::strcmp(env, "0") == 0) return false;
    throw Error(std::string("TMX_VULKAN_COOPMAT must be 0 or 1, got '") + env + "'");
}

bool use_fp16_weights(std::optional<bool> requested) {
    if (!requested) {
        if (const char* env = std::getenv("TMX_VULKAN_FP16"); env && *env) {
            if (std::strcmp(env, "0") != 0 && std::strcmp(env, "1") != 0)
                throw Error(std::string("TMX_VULKAN_FP16 must be 0 or 1, got '") + env + "'");
            requested = *env == '1';
        }
    }
    return requested.value_or(true);
}

Context::Context(const VulkanOptions& options) {
    const bool validation = options.validation || env_flag("TMX_VULKAN_VALIDATION");
    instance_ = create_instance(validation ? messages_.get() : nullptr);
    try {
        if (validation) {
            auto create = reinterpret_cast<PFN_vkCreateDebugUtilsMessengerEXT>(
                vkGetInstanceProcAddr(instance_, "vkCreateDebugUtilsMessengerEXT"));
            VkDebugUtilsMessengerCreateInfoEXT info = messenger_info(messages_.get());
            if (!create) throw Error("Vulkan: VK_EXT_debug_utils is missing");
            check(create(instance_, &info, nullptr, &messenger_), "vkCreateDebugUtilsMessengerEXT");
        }
        auto devs = physical_devices(instance_);
        std::vector<DeviceInfo> infos;
        for (uint32_t i = 0; i < devs.size(); ++i) infos.push_back(describe(instance_, devs[i], i));
        const uint32_t chosen = choose_device(infos, options.device);
        physical_ = devs[chosen];
        info_ = infos[chosen];
        fp16_weights_ = use_fp16_weights(options.fp16_weights);
        compute_queue_family(physical_, &queue_family_);
        VkPhysicalDeviceProperties props;
        vkGetPhysicalDeviceProperties(physical_, &props);
        limits_ = props.limits;
        vkGetPhysicalDeviceMemoryProperties(physical_, &memory_);

        const float priority = 1.0f;
        VkDeviceQueueCreateInfo queue{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
        queue.queueFamilyIndex = queue_family_;
        queue.queueCount = 1;
        queue.pQueuePriorities = &priority;
        VkDeviceCreateInfo info{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
        info.queueCreateInfoCount = 1;
        info.pQueueCreateInfos = &queue;
        // The shaders need no optional feature (16- and 8-bit weights are read as 32-bit
        // words) but the ".cm" variants': the NV extension, cooperativeMatrix, shaderFloat16
        // and vulkanMemoryModel. Should the device refuse them, it is created without, and
        // those variants are not offered.
        const char* coopmat_ext = VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME;
        VkPhysicalDeviceCooperativeMatrixFeaturesNV coop{
            VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV};
        coop.cooperativeMatrix = VK_TRUE;
        VkPhysicalDeviceVulkan12Features f12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES,
                                             &coop};
        f12.shaderFloat16 = VK_TRUE;
        f12.vulkanMemoryModel = VK_TRUE;
        VkResult created = VK_ERROR_FEATURE_NOT_PRESENT;
        if (info_.coopmat_columns != 0) {
            VkDeviceCreateInfo with = info;
            with.pNext = &f12;
            with.enabledExtensionCount = 1;
            with.ppEnabledExtensionNames = &coopmat_ext;
            created = vkCreateDevice(physical_, &with, nullptr, &device_);
            if (created != VK_SUCCESS) {
                std::fprintf(stderr,
                             "tmx: Vulkan: %s refused the cooperative-matrix features (%s); the "
                             "matmuls run without them\n",
                             info_.name.c_str(), result_name(created));
                info_.coopmat_columns = 0;
                device_ = VK_NULL_HANDLE;
            }
        }
        if (created != VK_SUCCESS)
            check(vkCreateDevice(physical_, &info, nullptr, &device_), "vkCreateDevice");
        vkGetDeviceQueue(device_, queue_family_, 0, &queue_);
    } catch (...) {
        release();
        throw;
    }
}

Context::~Context() {
    release();
}

void Context::release() {
    if (device_) vkDestroyDevice(device_, nullptr);
    device_ = VK_NULL_HANDLE;
    if (messenger_) {
        auto destroy = reinterpret_cast<PFN_vkDestroyDebugUtilsMessengerEXT>(
            vkGetInstanceProcAddr(instance_, "vkDestroyDebugUtilsMessengerEXT"));
        if (destroy) destroy(instance_, messenger_, nullptr);
        messenger_ = VK_NULL_HANDLE;
    }
    if (instance_) vkDestroyInstance(instance_, nullptr);
    instance_ = VK_NULL_HANDLE;
}

}  // namespace tmx::vk

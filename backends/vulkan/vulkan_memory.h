// Device memory sub-allocated from large blocks: one VkDeviceMemory and one VkBuffer per block,
// tensors are ranges of a block's buffer (no Vulkan allocation per tensor). Requests larger
// than half a block get a block of their own. Block sizes respect the device's
// maxMemoryAllocationSize; descriptor ranges (maxStorageBufferRange) are the binding code's
// concern (vulkan_commands.h), since a tensor view, not its allocation, is what gets bound.
#pragma once

#include <vulkan/vulkan.h>

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "backends/vulkan/vulkan_context.h"
#include "engine/compute/tensor.h"

namespace tmx::vk {

enum class MemoryKind {
    Device,  // device-local storage for tensors
    Host,    // host-visible, coherent and mapped: staging and the status word
};

struct Block;

struct Allocation {
    Block* block = nullptr;
    VkBuffer buffer = VK_NULL_HANDLE;
    VkDeviceSize offset = 0;  // in the block's buffer
    VkDeviceSize size = 0;
    std::byte* mapped = nullptr;  // Host allocations: the host address of offset
};

class Allocator {
  public:
    // block_bytes 0: 256 MiB, or less when the device allows less per allocation.
    explicit Allocator(std::shared_ptr<Context> ctx, VkDeviceSize block_bytes = 0);
    ~Allocator();
    Allocator(const Allocator&) = delete;
    Allocator& operator=(const Allocator&) = delete;

    Allocation allocate(VkDeviceSize bytes, MemoryKind kind);
    // Returns the range. A block of its own is destroyed only at the next collect(), once
    // commands recorded against it have run.
    void release(const Allocation& a);
    // Called after the queue is idle: destroys the blocks released since the last call.
    void collect();

    struct Stats {
        size_t blocks = 0;          // live VkDeviceMemory allocations
        size_t live_ranges = 0;     // allocations handed out and not released
        VkDeviceSize reserved = 0;  // bytes in blocks
        VkDeviceSize used = 0;      // bytes handed out (after alignment)
    };
    Stats stats() const;
    VkDeviceSize block_bytes() const { return block_bytes_; }
    const Context& context() const { return *ctx_; }

  private:
    Block* new_block(VkDeviceSize bytes, MemoryKind kind, bool dedicated);
    void destroy(Block* b);

    std::shared_ptr<Context> ctx_;
    VkDeviceSize block_bytes_;
    VkDeviceSize alignment_;
    std::vector<std::unique_ptr<Block>> blocks_;
    std::vector<Block*> retired_;
    size_t live_ranges_ = 0;
};

// A tensor's storage: a range of a block, returned to the allocator when the last Tensor
// viewing it goes away. Holds the allocator, so tensors may outlive the backend object.
// on_release, when given, is called with the range just before it is returned.
class VulkanBuffer final : public DeviceBuffer {
  public:
    using ReleaseHook = std::function<void(const Allocation&)>;
    VulkanBuffer(std::shared_ptr<Allocator> allocator, size_t bytes, MemoryKind kind,
                 ReleaseHook on_release = {});
    ~VulkanBuffer() override;
    const Allocation& allocation() const { return alloc_; }

  private:
    std::shared_ptr<Allocator> allocator_;
    Allocation alloc_;
    ReleaseHook on_release_;
};

}  // namespace tmx::vk

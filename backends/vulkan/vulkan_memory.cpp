// Block allocator: first fit over each block's free ranges, neighbours merged on release.
#include "backends/vulkan/vulkan_memory.h"

#include <algorithm>
#include <string>

#include "engine/core/errors.h"

namespace tmx::vk {

struct Block {
    VkDeviceMemory memory = VK_NULL_HANDLE;
    VkBuffer buffer = VK_NULL_HANDLE;
    VkDeviceSize size = 0;
    std::byte* mapped = nullptr;
    MemoryKind kind = MemoryKind::Device;
    bool dedicated = false;
    std::map<VkDeviceSize, VkDeviceSize> free;  // offset -> size, non-adjacent
    VkDeviceSize used = 0;
};

namespace {

constexpr VkDeviceSize kDefaultBlock = 256ull << 20;

VkDeviceSize align_up(VkDeviceSize x, VkDeviceSize a) {
    return (x + a - 1) / a * a;
}

std::string mib(VkDeviceSize bytes) {
    return std::to_string((bytes + (1 << 20) - 1) >> 20) + " MiB";
}

uint32_t memory_type(const VkPhysicalDeviceMemoryProperties& props, uint32_t allowed,
                     VkMemoryPropertyFlags required, VkMemoryPropertyFlags preferred) {
    int fallback = -1;
    for (uint32_t i = 0; i < props.memoryTypeCount; ++i) {
        const VkMemoryPropertyFlags f = props.memoryTypes[i].propertyFlags;
        if (!(allowed & (1u << i)) || (f & required) != required) continue;
        if ((f & preferred) == preferred) return i;
        if (fallback < 0) fallback = static_cast<int>(i);
    }
    if (fallback < 0) throw Error("Vulkan: the device has no suitable memory type");
    return static_cast<uint32_t>(fallback);
}

}  // namespace

Allocator::Allocator(std::shared_ptr<Context> ctx, VkDeviceSize block_bytes)
    : ctx_(std::move(ctx)) {
    const VkDeviceSize max_alloc =
        std::max<VkDeviceSize>(ctx_->info().max_allocation_bytes, 1 << 20);
    block_bytes_ = std::min(block_bytes ? block_bytes : kDefaultBlock, max_alloc);
    // Every range starts on an offset a storage-buffer descriptor may use.
    alignment_ = std::max<VkDeviceSize>(ctx_->limits().minStorageBufferOffsetAlignment, 64);
}

Allocator::~Allocator() {
    for (auto& b : blocks_) destroy(b.get());
}

Block* Allocator::new_block(VkDeviceSize bytes, MemoryKind kind, bool dedicated) {
    if (bytes > ctx_->info().max_allocation_bytes && ctx_->info().max_allocation_bytes > 0)
        throw Error("Vulkan: a buffer of " + mib(bytes) +
                    " exceeds the device's largest allocation (" +
                    mib(ctx_->info().max_allocation_bytes) + ")");
    VkDevice dev = ctx_->device();
    auto b = std::make_unique<Block>();
    b->size = bytes;
    b->kind = kind;
    b->dedicated = dedicated;
    VkBufferCreateInfo bi{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
    bi.size = bytes;
    bi.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
               VK_BUFFER_USAGE_TRANSFER_DST_BIT;
    bi.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
    check(vkCreateBuffer(dev, &bi, nullptr, &b->buffer), "vkCreateBuffer");
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(dev, b->buffer, &req);
    VkMemoryAllocateInfo ai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
    ai.allocationSize = req.size;
    ai.memoryTypeIndex = kind == MemoryKind::Device
                             ? memory_type(ctx_->memory_properties(), req.memoryTypeBits, 0,
                                           VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT)
                             : memory_type(ctx_->memory_properties(), req.memoryTypeBits,
                                           VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT |
                                               VK_MEMORY_PROPERTY_HOST_COHERENT_BIT,
                                           VK_MEMORY_PROPERTY_HOST_CACHED_BIT);
    VkResult r = vkAllocateMemory(dev, &ai, nullptr, &b->memory);
    if (r != VK_SUCCESS) {
        vkDestroyBuffer(dev, b->buffer, nullptr);
        if (r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY)
            throw Error("Vulkan: out of " +
                        std::string(kind == MemoryKind::Device ? "device" : "host-visible") +
                        " memory allocating " + mib(bytes));
        fail(r, "vkAllocateMemory");
    }
    check(vkBindBufferMemory(dev, b->buffer, b->memory, 0), "vkBindBufferMemory");
    if (kind == MemoryKind::Host) {
        void* p = nullptr;
        check(vkMapMemory(dev, b->memory, 0, VK_WHOLE_SIZE, 0, &p), "vkMapMemory");
        b->mapped = static_cast<std::byte*>(p);
    }
    b->free.emplace(0, bytes);
    blocks_.push_back(std::move(b));
    return blocks_.back().get();
}

void Allocator::destroy(Block* b) {
    VkDevice dev = ctx_->device();
    if (b->mapped) vkUnmapMemory(dev, b->memory);
    vkDestroyBuffer(dev, b->buffer, nullptr);
    vkFreeMemory(dev, b->memory, nullptr);
    b->buffer = VK_NULL_HANDLE;
    b->memory = VK_NULL_HANDLE;
}

Allocation Allocator::allocate(VkDeviceSize bytes, MemoryKind kind) {
    const VkDeviceSize size = align_up(std::max<VkDeviceSize>(bytes, 4), alignment_);
    Block* chosen = nullptr;
    VkDeviceSize offset = 0;
    if (size > block_bytes_ / 2) {
        chosen = new_block(size, kind, true);
    } else {
        for (auto& b : blocks_) {
            if (b->kind != kind || b->dedicated || !b->buffer) continue;
            for (auto [off, len] : b->free)
                if (len >= size) {
                    chosen = b.get();
                    offset = off;
                    break;
                }
            if (chosen) break;
        }
        if (!chosen) chosen = new_block(block_bytes_, kind, false);
    }
    // Carve [offset, offset + size) out of the free range that starts at offset.
    auto it = chosen->free.find(offset);
    const VkDeviceSize len = it->second;
    chosen->free.erase(it);
    if (len > size) chosen->free.emplace(offset + size, len - size);
    chosen->used += size;
    ++live_ranges_;
    return {chosen, chosen->buffer, offset, size,
            chosen->mapped ? chosen->mapped + offset : nullptr};
}

void Allocator::release(const Allocation& a) {
    Block* b = a.block;
    if (!b) return;
    --live_ranges_;
    b->used -= a.size;
    if (b->dedicated) {
        retired_.push_back(b);
        return;
    }
    auto [it, inserted] = b->free.emplace(a.offset, a.size);
    (void)inserted;
    auto next = std::next(it);
    if (next != b->free.end() && it->first + it->second == next->first) {
        it->second += next->second;
        b->free.erase(next);
    }
    if (it != b->free.begin()) {
        auto prev = std::prev(it);
        if (prev->first + prev->second == it->first) {
            prev->second += it->second;
            b->free.erase(it);
        }
    }
}

void Allocator::collect() {
    for (Block* b : retired_) {
        destroy(b);
        std::erase_if(blocks_, [b](const std::unique_ptr<Block>& p) { return p.get() == b; });
    }
    retired_.clear();
}

Allocator::Stats Allocator::stats() const {
    Stats s;
    for (const auto& b : blocks_) {
        if (!b->buffer) continue;
        ++s.blocks;
        s.reserved += b->size;
        s.used += b->used;
    }
    s.live_ranges = live_ranges_;
    return s;
}

VulkanBuffer::VulkanBuffer(std::shared_ptr<Allocator> allocator, size_t bytes, MemoryKind kind,
                           ReleaseHook on_release)
    : DeviceBuffer(bytes),
      allocator_(std::move(allocator)),
      alloc_(allocator_->allocate(bytes, kind)),
      on_release_(std::move(on_release)) {}

VulkanBuffer::~VulkanBuffer() {
    if (on_release_) on_release_(alloc_);
    allocator_->release(alloc_);
}

}  // namespace tmx::vk

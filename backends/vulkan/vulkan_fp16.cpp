// The fp16 weight copies' bookkeeping; the conversion itself is recorded by the backend.
#include "backends/vulkan/vulkan_fp16.h"

#include <functional>
#include <tuple>

namespace tmx::vk {

bool Fp16Weights::Less::operator()(const Key& a, const Key& b) const {
    if (a.buffer != b.buffer) return std::less<VkBuffer>{}(a.buffer, b.buffer);
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
}

Fp16Weights::Fp16Weights(std::shared_ptr<Allocator> allocator)
    : allocator_(std::move(allocator)) {}

Fp16Weights::~Fp16Weights() {
    for (const auto& [key, copy] : copies_) allocator_->release(copy);
}

Fp16Weights::Copy Fp16Weights::get(const BufferRange& src, size_t elements) {
    const Key key{src.buffer, src.offset, src.offset + src.size};
    const VkDeviceSize bytes = (elements + 1) / 2 * 4;
    auto it = copies_.find(key);
    if (it != copies_.end()) return {{it->second.buffer, it->second.offset, bytes}, false};
    const Allocation a = allocator_->allocate(bytes, MemoryKind::Device);
    copies_.emplace(key, a);
    return {{a.buffer, a.offset, bytes}, true};
}

void Fp16Weights::invalidate(const BufferRange& changed) {
    const VkDeviceSize begin = changed.offset, end = changed.offset + changed.size;
    // Sources in changed.buffer, in order of their start: those starting before `end`.
    for (auto it = copies_.lower_bound({changed.buffer, 0, 0});
         it != copies_.end() && it->first.buffer == changed.buffer && it->first.begin < end;) {
        if (it->first.end > begin) {
            allocator_->release(it->second);
            it = copies_.erase(it);
            ++drops_;
        } else {
            ++it;
        }
    }
}

}  // namespace tmx::vk

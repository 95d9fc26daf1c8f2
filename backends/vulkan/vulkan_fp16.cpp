// The fp16 weight copies' bookkeeping; the conversion itself is recorded by the backend.
#include "backends/vulkan/vulkan_fp16.h"

#include <functional>
#include <tuple>

namespace tmx::vk {

bool Fp16Weights::Less::operator()(const Key& a, const Key& b) const {
    if (a.buffer != b.buffer) return std::less<VkBuffer>{}(a.buffer, b.buffer);
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
}

Fp16Weights::Fp16Weights(std::shared_ptr<Allocator> allocator) : allocator_(std::move(allocator)) {}

Fp16Weights::~Fp16Weights() {
    for (const auto& [key, copy] : copies_) allocator_->release(copy);
}

namespace {

// Where a source starting `skip` bytes into another's range starts in that one's copy: fp32
// sources hold 4 bytes an element, copies 2 in 4-byte words, so a part at an even element is
// a whole number of words into the copy (the shaders address weights from a word).
bool starts_on_a_word(VkDeviceSize skip) {
    return skip % 8 == 0;
}

}  // namespace

Fp16Weights::Copy Fp16Weights::get(const BufferRange& src, size_t elements) {
    const Key key{src.buffer, src.offset, src.offset + src.size};
    const VkDeviceSize bytes = (elements + 1) / 2 * 4;
    if (auto it = copies_.find(key); it != copies_.end())
        return {{it->second.buffer, it->second.offset, bytes}, false};
    // A part of a range already copied (q, k or v of the fused QKV weight after that weight) is
    // read from that copy: one copy of each weight, however the matmuls view it.
    for (auto it = copies_.lower_bound({src.buffer, 0, 0});
         it != copies_.end() && it->first.buffer == src.buffer && it->first.begin <= key.begin;
         ++it) {
        const VkDeviceSize skip = key.begin - it->first.begin;
        if (it->first.end >= key.end && starts_on_a_word(skip))
            return {{it->second.buffer, it->second.offset + skip / 2, bytes}, false};
    }
    // Copies of parts of this range (the other order) give way to its copy: dropped now, their
    // memory reused after the reads already recorded, as invalidate() does.
    for (auto it = copies_.lower_bound({src.buffer, key.begin, 0});
         it != copies_.end() && it->first.buffer == src.buffer && it->first.begin < key.end;) {
        if (it->first.end <= key.end && starts_on_a_word(it->first.begin - key.begin))
            it = drop(it);
        else
            ++it;
    }
    const Allocation a = allocator_->allocate(bytes, MemoryKind::Device);
    copies_.emplace(key, a);
    return {{a.buffer, a.offset, bytes}, true};
}

void Fp16Weights::invalidate(const BufferRange& changed) {
    const VkDeviceSize begin = changed.offset, end = changed.offset + changed.size;
    // Sources in changed.buffer, in order of their start: those starting before `end`.
    for (auto it = copies_.lower_bound({changed.buffer, 0, 0});
         it != copies_.end() && it->first.buffer == changed.buffer && it->first.begin < end;) {
        if (it->first.end > begin)
            it = drop(it);
        else
            ++it;
    }
}

Fp16Weights::Copies::iterator Fp16Weights::drop(Copies::iterator it) {
    allocator_->release(it->second);
    ++drops_;
    return copies_.erase(it);
}

}  // namespace tmx::vk

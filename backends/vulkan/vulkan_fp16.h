// The fp16 copies of matmul weights (shaders/weights.glsl), kept by the backend when fp16
// weights are on (vulkan_context.h says when): the *_f16w shaders read half the bytes.
//
// A copy is keyed by its source's byte range and made on first use; a source inside a copied
// range (at an even element of it) is read from that copy, and a new copy takes over the
// copies of the parts it covers, so the fused QKV weight and its q, k and v views share one.
// The backend records the conversion (shaders/to_fp16.comp) before the matmul that reads it,
// in the same stream, whose barriers order it after the source's last write. Every write the stream
// records to a range overlapping a source (Stream::on_write), and the release of the source's
// buffer, drops the copy, so a matmul never reads a stale one: the next use makes it again. A
// dropped copy's range goes back to the allocator at once, like a freed tensor's: the stream's
// hazard tracking orders its reuse after the reads already recorded.
#pragma once

#include <vulkan/vulkan.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>

#include "backends/vulkan/vulkan_commands.h"
#include "backends/vulkan/vulkan_memory.h"

namespace tmx::vk {

class Fp16Weights {
  public:
    explicit Fp16Weights(std::shared_ptr<Allocator> allocator);
    ~Fp16Weights();
    Fp16Weights(const Fp16Weights&) = delete;
    Fp16Weights& operator=(const Fp16Weights&) = delete;

    // The copy of src (fp32, `elements` of them): 2 bytes per element, in 4-byte words.
    // fresh: it was allocated now and the caller must record the conversion before reading it.
    struct Copy {
        BufferRange range;
        bool fresh = false;
    };
    Copy get(const BufferRange& src, size_t elements);
    // Drops the copies of every source that overlaps `changed` (written or freed).
    void invalidate(const BufferRange& changed);

    size_t size() const { return copies_.size(); }
    // How many copies have been dropped so far: a recorded step that read one must not be
    // replayed after it changes (its memory may be another tensor's by then).
    uint64_t drops() const { return drops_; }

  private:
    struct Key {
        VkBuffer buffer;
        VkDeviceSize begin, end;
    };
    struct Less {
        bool operator()(const Key& a, const Key& b) const;
    };

    std::shared_ptr<Allocator> allocator_;
    using Copies = std::map<Key, Allocation, Less>;
    // Releases a copy and counts the drop; returns the next one.
    Copies::iterator drop(Copies::iterator it);

    Copies copies_;
    uint64_t drops_ = 0;
};

}  // namespace tmx::vk

// The rolling-buffer KV cache of generation (docs/design.md#6-rolling-kv-cache-and-generation):
// per layer, keys (after RoPE) and values of the last `slots` positions of each sequence,
// position p in slot p mod slots. With a sliding window W the cache has W slots, so its memory
// is fixed however long the text grows; with full attention (sliding_window 0) it has
// max_seq_len slots and a sequence ends there.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/compute/backend.h"
#include "engine/model/config.h"

namespace tmx {

// How many positions a cache keeps per sequence for this config.
inline int64_t kv_cache_slots(const ModelConfig& c) {
    return c.sliding_window > 0 ? c.sliding_window : c.max_seq_len;
}

// The longest sequence (prompt + generated tokens) the cache can serve; -1 = unbounded.
inline int64_t kv_cache_max_positions(const ModelConfig& c) {
    return c.sliding_window > 0 ? -1 : c.max_seq_len;
}

class KvCache {
  public:
    KvCache() = default;
    // Cache for `batch` sequences on `backend` (contents undefined until written).
    KvCache(const ModelConfig& config, Backend& backend, int64_t batch);

    int64_t batch() const { return batch_; }
    int64_t slots() const { return slots_; }
    // Layer l's keys and values, [batch, slots, n_kv_heads, head_dim].
    const Tensor& keys(int64_t layer) const { return keys_.at(layer); }
    const Tensor& values(int64_t layer) const { return values_.at(layer); }
    // Device memory the cache holds, in bytes.
    size_t bytes() const;
    // Sequence b's part of the cache, as a cache of batch 1 (views, no copy).
    KvCache sequence(int64_t b) const;

    // What the model keeps between decode steps on this cache (Model::forward_cached): its
    // workspace and the backend's recording of the step, which name this cache's tensors. The
    // cache owns it so that it lives as long as the cache (copies share it).
    std::shared_ptr<void>& decode_state() const { return decode_state_; }

  private:
    int64_t batch_ = 0, slots_ = 0;
    std::vector<Tensor> keys_, values_;
    mutable std::shared_ptr<void> decode_state_;
};

}  // namespace tmx

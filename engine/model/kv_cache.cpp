#include "engine/model/kv_cache.h"

#include <stdexcept>

namespace tmx {

KvCache::KvCache(const ModelConfig& c, Backend& backend, int64_t batch)
    : batch_(batch), slots_(kv_cache_slots(c)) {
    if (batch < 1) throw std::logic_error("KvCache: batch must be positive");
    for (int64_t l = 0; l < c.n_layers; ++l) {
        keys_.push_back(backend.alloc({batch, slots_, c.n_kv_heads, c.head_dim}));
        values_.push_back(backend.alloc({batch, slots_, c.n_kv_heads, c.head_dim}));
    }
}

size_t KvCache::bytes() const {
    size_t total = 0;
    for (const Tensor& t : keys_) total += t.bytes();
    for (const Tensor& t : values_) total += t.bytes();
    return total;
}

KvCache KvCache::sequence(int64_t b) const {
    if (b < 0 || b >= batch_) throw std::logic_error("KvCache::sequence: index out of range");
    KvCache one;
    one.batch_ = 1;
    one.slots_ = slots_;
    auto row = [&](const Tensor& t) {
        Shape s = t.shape();
        s[0] = 1;
        return t.slice(b * shape_numel(s), s);
    };
    for (const Tensor& t : keys_) one.keys_.push_back(row(t));
    for (const Tensor& t : values_) one.values_.push_back(row(t));
    return one;
}

}  // namespace tmx

// The rolling cache write (Backend::kv_cache_write), shared by kv_cache_write.comp and
// attention_combine.comp (which stores the chunk in the dispatch after the split has read the
// cache). Position start[b] + t goes to slot (start[b] + t) mod S; only the chunk's last
// min(T, S) positions are written, so no two invocations write one slot.
//
// Define KV_WRITE_BINDING (the first of five bindings: k, v, k_cache, v_cache, start) before
// including; the push constants `pc` need off_k, off_v, off_kc, off_vc, off_start and
// B, T, S, row (floats per position: Hkv * head_dim).
//
// With KV_WRITE_ROPE defined (attention_combine.comp) two bindings more, the chunk's positions
// and rope.comp's frequency table, and push constants off_pos, off_table, hd and rope: with
// rope != 0 the keys are stored rotated (k holds them as they were before RoPE).

layout(std430, binding = KV_WRITE_BINDING) readonly buffer K { float k[]; };
layout(std430, binding = KV_WRITE_BINDING + 1) readonly buffer V { float v[]; };
layout(std430, binding = KV_WRITE_BINDING + 2) writeonly buffer KC { float kc[]; };
layout(std430, binding = KV_WRITE_BINDING + 3) writeonly buffer VC { float vc[]; };
layout(std430, binding = KV_WRITE_BINDING + 4) readonly buffer Start { int start[]; };
#ifdef KV_WRITE_ROPE
layout(std430, binding = KV_WRITE_BINDING + 5) readonly buffer Pos { int pos[]; };
layout(std430, binding = KV_WRITE_BINDING + 6) readonly buffer Table { uint table[]; };
#include "rope.glsl"

// Key element src (chunk token n, element e of its row), rotated when pc.rope != 0.
float stored_key(uint src, uint n, uint e) {
    const float x = k[pc.off_k + src];
    if (pc.rope == 0) return x;
    const uint c = e % pc.hd;
    return rope_element(x, k[pc.off_k + src - c + rope_partner(c, pc.hd)], n, c, pc.hd);
}
#else
float stored_key(uint src, uint n, uint e) { return k[pc.off_k + src]; }
#endif

// Elements the write stores: one invocation each.
uint kv_write_elements() { return pc.B * min(pc.T, pc.S) * pc.row; }

// Stores element idx < kv_write_elements().
void kv_write(uint idx) {
    const uint written = min(pc.T, pc.S);
    const uint e = idx % pc.row;
    const uint bt = idx / pc.row;
    const uint b = bt / written, t = pc.T - written + bt % written;
    const uint slot = (uint(start[pc.off_start + b]) + t) % pc.S;
    const uint src = (b * pc.T + t) * pc.row + e, dst = (b * pc.S + slot) * pc.row + e;
    kc[pc.off_kc + dst] = stored_key(src, b * pc.T + t, e);
    vc[pc.off_vc + dst] = v[pc.off_v + src];
}

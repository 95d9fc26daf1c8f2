// Shared by the attention shaders (attention.comp, attention_split.comp, attention_tiled.comp):
// their bindings, push constants and the position mapping of the rolling KV cache. Include
// after common.glsl.
//
// Query at chunk index i sits at position p = p0 + i (p0 = start[b] with a cache, else 0) and
// attends to positions j in [first, p]: first = max(0, p0 - S) (the oldest cached position)
// and, with a window, p - window + 1 at the earliest. Position j < p0 lives in cache slot j mod
// S, position j >= p0 in the chunk at index j - p0. Every position in [first, p] is readable;
// other cache slots may hold anything (NaN included) and are never read.
//
// With ATTENTION_ROPE defined (attention_split.comp) two more bindings, the tokens' positions
// and rope.comp's frequency table, and ROTATED(), with which that shader reads q and the
// chunk's keys rotated when pc.rope != 0: q and k as RoPE would leave them.

layout(std430, binding = 0) readonly buffer Q { float q[]; };
layout(std430, binding = 1) readonly buffer K { float k[]; };
layout(std430, binding = 2) readonly buffer V { float v[]; };
layout(std430, binding = 3) readonly buffer KC { float kc[]; };
layout(std430, binding = 4) readonly buffer VC { float vc[]; };
layout(std430, binding = 5) readonly buffer Start { int start[]; };
layout(std430, binding = 6) writeonly buffer Out { float o[]; };  // attention_split: partials
#ifdef ATTENTION_ROPE
layout(std430, binding = 7) readonly buffer Pos { int pos[]; };         // [B * T]
layout(std430, binding = 8) readonly buffer Table { uint table[]; };  // rope.comp's
#endif

layout(push_constant) uniform Push {
    uint off_q, off_k, off_v, off_kc, off_vc, off_start, off_o;
#ifdef ATTENTION_ROPE
    uint off_pos, off_table;
#endif
    uint T, H, Hkv, hd, S;
    uint window;     // 0: unlimited
    uint has_cache;  // 0: plain attention, the kc/vc/start bindings are unused
    float scale;
    uint n_split, slice_len, heads;  // attention_split: slices, keys per slice, heads per group
    uint rope;                       // ATTENTION_ROPE: rotate q and the chunk's keys
} pc;

#ifdef ATTENTION_ROPE
#include "rope.glsl"

// Element c of the head at element `head` of x (q or k, token n), rotated when pc.rope != 0.
#define ROTATED(x, off, head, n, c)                                                        \
    (pc.rope == 0 ? x[off + head + c]                                                      \
                  : rope_element(x[off + head + c], x[off + head + rope_partner(c, pc.hd)], \
                                 n, c, pc.hd))
#endif

// The position of sequence b's first chunk token.
uint chunk_start(uint b) { return pc.has_cache != 0 ? uint(start[pc.off_start + b]) : 0u; }

// The oldest position the query at position p attends to.
uint first_key(uint p0, uint p) {
    uint first = pc.has_cache != 0 && p0 > pc.S ? p0 - pc.S : 0u;
    if (pc.window > 0 && p + 1 > pc.window) first = max(first, p + 1 - pc.window);
    return first;
}

// Element offset of position j's key/value row for kv head kvh, and whether it is cached.
uint kv_row(uint b, uint kvh, uint p0, uint j, out bool cached) {
    cached = pc.has_cache != 0 && j < p0;
    return cached ? ((b * pc.S + j % pc.S) * pc.Hkv + kvh) * pc.hd
                  : ((b * pc.T + (j - p0)) * pc.Hkv + kvh) * pc.hd;
}

float key_at(uint row, bool cached, uint c) {
    return cached ? kc[pc.off_kc + row + c] : k[pc.off_k + row + c];
}

float value_at(uint row, bool cached, uint c) {
    return cached ? vc[pc.off_vc + row + c] : v[pc.off_v + row + c];
}

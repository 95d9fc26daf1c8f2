// The weight operand of the matmul and embedding shaders, in the format the variant is built for
// (cmake/TmxShaders.cmake; the backend picks it from the tensor's dtype, vulkan/matmul.cpp):
//   (default)          fp32;
//   TMX_WEIGHTS_F16    f16: a model's stored f16 weights, or the fp16 copy the backend keeps of
//                      an fp32 weight (backends/vulkan/vulkan_fp16.h);
//   TMX_WEIGHTS_BF16   bf16;
//   TMX_WEIGHTS_Q8_0   GGUF's Q8_0 blocks: 34 bytes per 32 weights, an f16 scale then 32 int8,
//                      weight = scale * q (engine/compute/weight_format.h).
// The 16- and 8-bit formats are read as 32-bit words and unpacked in registers, so no shader
// needs 8- or 16-bit storage (any Vulkan 1.2 device runs them, and every driver decodes alike);
// arithmetic and accumulation stay fp32: only the weights' memory traffic shrinks.
//
// Define WEIGHT_BINDING, then include this before anything but #extension lines. A tensor's
// place in its binding is weight_origin(off, adjust), from its push-constant word offset
// (common.glsl) and the bytes it starts into that word (the host's byte_adjust: a 16- or
// 8-bit tensor may start mid-word). Then weight_at(origin, i) is its element i, and, where
// weight4_ok(origin), weight4_at(origin, i) its elements i .. i+3 for i a multiple of 4.
// Define WEIGHT2_BINDING too for a second weight operand in the same format (the fused SwiGLU's
// w3): weight_of(1u, origin, i) and weight4_of(1u, origin, i) read it, as weight_of(0u, ...)
// and weight4_of(0u, ...) (weight_at, weight4_at) read the first.

#if defined(TMX_WEIGHTS_F16) || defined(TMX_WEIGHTS_BF16) || defined(TMX_WEIGHTS_Q8_0)

layout(std430, binding = WEIGHT_BINDING) readonly buffer WeightWords { uint weight_words[]; };
layout(std430, binding = WEIGHT_BINDING) readonly buffer WeightPairs { uvec2 weight_pairs[]; };
#ifdef WEIGHT2_BINDING
layout(std430, binding = WEIGHT2_BINDING) readonly buffer Weight2Words { uint weight2_words[]; };
layout(std430, binding = WEIGHT2_BINDING) readonly buffer Weight2Pairs { uvec2 weight2_pairs[]; };
#endif

// Word i (pair i) of weight operand `operand` (0, or 1 for WEIGHT2_BINDING's).
uint weight_word_of(uint operand, uint i) {
#ifdef WEIGHT2_BINDING
    if (operand != 0u) return weight2_words[i];
#endif
    return weight_words[i];
}
uvec2 weight_pair_of(uint operand, uint i) {
#ifdef WEIGHT2_BINDING
    if (operand != 0u) return weight2_pairs[i];
#endif
    return weight_pairs[i];
}

// In bytes from the binding's start (always even: every format's units are 2-byte aligned).
uint weight_origin(uint off_words, uint adjust) { return off_words * 4u + adjust; }
bool weight4_ok(uint origin) { return true; }

// The 16 bits at byte b (even) of operand o.
uint weight_half(uint o, uint b) {
    return (weight_word_of(o, b >> 2) >> ((b & 2u) * 8u)) & 0xffffu;
}
// The 32 bits at byte b (even), little-endian.
uint weight_word(uint o, uint b) {
    const uint w = b >> 2;
    if ((b & 2u) == 0u) return weight_word_of(o, w);
    return (weight_word_of(o, w) >> 16) | (weight_word_of(o, w + 1u) << 16);
}
// The 64 bits at byte b (even): one 8-byte load where b allows it.
uvec2 weight_pair(uint o, uint b) {
    if ((b & 7u) == 0u) return weight_pair_of(o, b >> 3);
    return uvec2(weight_word(o, b), weight_word(o, b + 4u));
}

#if defined(TMX_WEIGHTS_F16)
float weight_of(uint o, uint origin, uint i) {
    return unpackHalf2x16(weight_half(o, origin + 2u * i)).x;
}
vec4 weight4_of(uint o, uint origin, uint i) {
    const uvec2 p = weight_pair(o, origin + 2u * i);
    return vec4(unpackHalf2x16(p.x), unpackHalf2x16(p.y));
}
#elif defined(TMX_WEIGHTS_BF16)
// bf16 is the high half of an fp32: widening is a shift.
float weight_of(uint o, uint origin, uint i) {
    return uintBitsToFloat(weight_half(o, origin + 2u * i) << 16);
}
vec4 weight4_of(uint o, uint origin, uint i) {
    const uvec2 p = weight_pair(o, origin + 2u * i);
    return uintBitsToFloat(uvec4(p.x << 16, p.x & 0xffff0000u, p.y << 16, p.y & 0xffff0000u));
}
#else  // TMX_WEIGHTS_Q8_0
const uint Q8_0_VALUES = 32u, Q8_0_BYTES = 34u;
// Byte of the block holding element i; the f16 scale leads it, the int8 values follow.
uint q8_0_block(uint origin, uint i) { return origin + (i / Q8_0_VALUES) * Q8_0_BYTES; }
float q8_0_scale(uint o, uint block) { return unpackHalf2x16(weight_half(o, block)).x; }
float weight_of(uint o, uint origin, uint i) {
    const uint block = q8_0_block(origin, i), b = block + 2u + i % Q8_0_VALUES;
    const int q = bitfieldExtract(int(weight_word_of(o, b >> 2)), int((b & 3u) * 8u), 8);
    return q8_0_scale(o, block) * float(q);
}
// i % 4 == 0: the four values lie in one block.
vec4 weight4_of(uint o, uint origin, uint i) {
    const uint block = q8_0_block(origin, i);
    const int q = int(weight_word(o, block + 2u + i % Q8_0_VALUES));
    return q8_0_scale(o, block) * vec4(bitfieldExtract(q, 0, 8), bitfieldExtract(q, 8, 8),
                                       bitfieldExtract(q, 16, 8), bitfieldExtract(q, 24, 8));
}
#endif

#else  // fp32

layout(std430, binding = WEIGHT_BINDING) readonly buffer Weights { float weights[]; };
layout(std430, binding = WEIGHT_BINDING) readonly buffer Weights4 { vec4 weights4[]; };
#ifdef WEIGHT2_BINDING
layout(std430, binding = WEIGHT2_BINDING) readonly buffer Weights2 { float weights2[]; };
layout(std430, binding = WEIGHT2_BINDING) readonly buffer Weights2x4 { vec4 weights2_4[]; };
#endif

// In elements from the binding's start.
uint weight_origin(uint off_words, uint adjust) { return off_words; }
bool weight4_ok(uint origin) { return origin % 4u == 0u; }
float weight_of(uint o, uint origin, uint i) {
#ifdef WEIGHT2_BINDING
    if (o != 0u) return weights2[origin + i];
#endif
    return weights[origin + i];
}
vec4 weight4_of(uint o, uint origin, uint i) {
#ifdef WEIGHT2_BINDING
    if (o != 0u) return weights2_4[(origin + i) / 4u];
#endif
    return weights4[(origin + i) / 4u];
}

#endif

float weight_at(uint origin, uint i) { return weight_of(0u, origin, i); }
vec4 weight4_at(uint origin, uint i) { return weight4_of(0u, origin, i); }

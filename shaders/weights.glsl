// The weight operand of the matmul shaders: fp32, or, compiled with TMX_FP16_WEIGHTS (the
// *_fp16w variants, cmake/TmxShaders.cmake), the fp16 copy the backend keeps of it
// (backends/vulkan/vulkan_fp16.h). fp16 weights are read through 16-bit storage and widened
// on load: arithmetic and accumulation stay fp32; only the weights' memory traffic halves.
//
// Include before anything but #extension lines (it may add one). Declare the weight buffer as
// `WEIGHT_T name[]` and read it as float(name[i]); WEIGHT_VEC4_T, read as vec4(...), views
// the same binding four weights at a time (a second block declared on its binding). Binding
// offsets in the push constants count 4-byte words (common.glsl): multiply the weight
// binding's by WEIGHTS_PER_WORD.
#ifdef TMX_FP16_WEIGHTS
#extension GL_EXT_shader_16bit_storage : require
#define WEIGHT_T float16_t
#define WEIGHT_VEC4_T f16vec4
const uint WEIGHTS_PER_WORD = 2;
#else
#define WEIGHT_T float
#define WEIGHT_VEC4_T vec4
const uint WEIGHTS_PER_WORD = 1;
#endif

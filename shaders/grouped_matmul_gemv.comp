// grouped_matmul for few slots (decoding, small batches): workgroup (x, j) computes NR outputs
// for up to MS slots of one expert, the j-th run of MS slots when each expert's slots are cut
// into runs of MS (a batch's slots often share experts): dot products of x[s, :] with NR rows
// of the expert's w, read once for the run, reduced across the workgroup (gemv_reduce.glsl).
// Slot s's sum is the same whichever run holds it: every invocation strides over k alike and
// the reduction's order is fixed. Expert ranges are read from offsets on the device. Where K
// and both operands' offsets are multiples of 4, invocations read 4 consecutive k at a time
// (as matmul_gemv.comp does).
// Also built reading w in 16- and 8-bit formats (weights.glsl).
//
// EPILOGUE fuses the first half of the experts' feed-forward (Backend::grouped_ffn_up) into
// the same dispatch: with an activation's op code (activations.glsl) the products go to pre
// and out = act(pre); with OP_SWIGLU, the same pass over x also takes the products with w3
// (+ b3) into up, and out = silu(pre) * up. Each product is summed exactly as without the
// epilogue (w3's after w1's, through the same shared memory: no more of it is needed), so pre
// and up are grouped_matmul's bits, and out is elementwise.comp's from them.
#version 450
#extension GL_GOOGLE_include_directive : require
#ifdef TMX_GEMV_SUBGROUP
#extension GL_KHR_shader_subgroup_shuffle : require
#endif
#define WEIGHT_BINDING 1
#define WEIGHT2_BINDING 5
#include "weights.glsl"
#include "activations.glsl"
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;  // a power of two
layout(constant_id = 1) const uint NR = 4;
// 0: o = the products only (grouped_matmul); else the op of out (activations.glsl).
layout(constant_id = 2) const uint EPILOGUE = 0;
const bool SWIGLU = EPILOGUE == OP_SWIGLU;
const uint MS = 4;  // slots per workgroup
const uint PARTS = MS * NR;
shared float part[PARTS * WG];
#include "gemv_reduce.glsl"

layout(std430, binding = 0) readonly buffer X { float x[]; };  // [S, K]
layout(std430, binding = 0) readonly buffer X4 { vec4 x4[]; };
// binding 1: w [E, Nout, K] (weights.glsl)
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };
layout(std430, binding = 3) readonly buffer Offsets { int offsets[]; };
layout(std430, binding = 4) writeonly buffer Out { float o[]; };  // [S, Nout]: pre
// With an epilogue: binding 5: w3 [E, Nout, K] in w's format (SwiGLU's; weights.glsl).
layout(std430, binding = 6) readonly buffer Bias3 { float bias3[]; };  // [E, Nout]
layout(std430, binding = 7) writeonly buffer Up { float up[]; };       // [S, Nout]
layout(std430, binding = 8) writeonly buffer Act { float act[]; };     // [S, Nout]

layout(push_constant) uniform Push {
    uint off_x, off_w, off_bias, off_offsets, off_o, off_w3, off_bias3, off_up, off_act;
    uint E, Nout, K;
    uint has_bias;
    uint w_adjust;  // weights.glsl
    uint has_bias3, w3_adjust;
} pc;

int offset_of(uint e) {
    return offsets[pc.off_offsets + e];
}

void main() {
    const uint j = gl_WorkGroupID.y, n0 = gl_WorkGroupID.x * NR, t = gl_LocalInvocationID.x;
    // The j-th run of slots: its expert e and first slot s0 (the same for the whole workgroup).
    uint e = 0, s0 = 0, ms = 0;
    for (uint runs = 0; e < pc.E; ++e) {
        const uint first = uint(offset_of(e)), count = uint(offset_of(e + 1)) - first;
        const uint expert_runs = (count + MS - 1) / MS;
        if (j < runs + expert_runs) {
            s0 = first + (j - runs) * MS;
            ms = min(MS, first + count - s0);
            break;
        }
        runs += expert_runs;
    }
    if (e == pc.E) return;  // the grid may have more rows than there are runs
    const uint wo = weight_origin(pc.off_w, pc.w_adjust), w_base = (e * pc.Nout + n0) * pc.K;
    const uint wo3 = SWIGLU ? weight_origin(pc.off_w3, pc.w3_adjust) : 0u;
    const bool by_four = pc.K % 4 == 0 && weight4_ok(wo) && (!SWIGLU || weight4_ok(wo3)) &&
                         pc.off_x % 4 == 0;
    float acc[PARTS], acc3[PARTS];  // w's products, w3's (SwiGLU)
    for (uint q = 0; q < PARTS; ++q) acc[q] = acc3[q] = 0.0;
    if (by_four) {
        for (uint k4 = t; k4 < pc.K / 4; k4 += WG) {
            vec4 wv[NR], wv3[NR];
            for (uint r = 0; r < NR; ++r) {
                const bool real = n0 + r < pc.Nout;
                const uint at = w_base + r * pc.K + 4 * k4;
                wv[r] = real ? weight4_of(0u, wo, at) : vec4(0);
                if (SWIGLU) wv3[r] = real ? weight4_of(1u, wo3, at) : vec4(0);
            }
            for (uint m = 0; m < ms; ++m) {
                const vec4 xv = x4[(pc.off_x + (s0 + m) * pc.K) / 4 + k4];
                for (uint r = 0; r < NR; ++r) {
                    acc[m * NR + r] += dot(xv, wv[r]);
                    if (SWIGLU) acc3[m * NR + r] += dot(xv, wv3[r]);
                }
            }
        }
    } else {
        for (uint k = t; k < pc.K; k += WG) {
            float wv[NR], wv3[NR];
            for (uint r = 0; r < NR; ++r) {
                const bool real = n0 + r < pc.Nout;
                const uint at = w_base + r * pc.K + k;
                wv[r] = real ? weight_of(0u, wo, at) : 0.0;
                if (SWIGLU) wv3[r] = real ? weight_of(1u, wo3, at) : 0.0;
            }
            for (uint m = 0; m < ms; ++m) {
                const float xv = x[pc.off_x + (s0 + m) * pc.K + k];
                for (uint r = 0; r < NR; ++r) {
                    acc[m * NR + r] += xv * wv[r];
                    if (SWIGLU) acc3[m * NR + r] += xv * wv3[r];
                }
            }
        }
    }
    // Invocation t < ms * NR writes output t: slot s0 + t / NR, column n0 + t % NR.
    const uint count = ms * NR;
    reduce_parts(acc, count);
    const float sum = t < count ? reduced(t) : 0.0;
    float sum3 = 0.0;
    if (SWIGLU) {
        barrier();  // every invocation has read w's sums before w3's reuse the shared memory
        reduce_parts(acc3, count);
        if (t < count) sum3 = reduced(t);
    }
    if (t >= count) return;
    const uint s = s0 + t / NR, n = n0 + t % NR;
    if (n >= pc.Nout) return;
    float pre = sum;
    if (pc.has_bias != 0) pre += bias[pc.off_bias + e * pc.Nout + n];
    o[pc.off_o + s * pc.Nout + n] = pre;
    if (EPILOGUE == 0) return;
    float u = 0.0;
    if (SWIGLU) {
        u = sum3;
        if (pc.has_bias3 != 0) u += bias3[pc.off_bias3 + e * pc.Nout + n];
        up[pc.off_up + s * pc.Nout + n] = u;
    }
    act[pc.off_act + s * pc.Nout + n] = activation(EPILOGUE, pre, u);
}

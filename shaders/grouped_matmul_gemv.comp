// grouped_matmul for few slots (decoding, small batches): workgroup (x, j) computes NR outputs
// for up to MS slots of one expert, the j-th run of MS slots when each expert's slots are cut
// into runs of MS (a batch's slots often share experts): dot products of x[s, :] with NR rows
// of the expert's w, read once for the run, reduced across the workgroup (gemv_reduce.glsl).
// Slot s's sum is the same whichever run holds it: every invocation strides over k alike and
// the reduction's order is fixed. Expert ranges are read from offsets on the device. Where K
// and both operands' offsets are multiples of 4, invocations read 4 consecutive k at a time
// (as matmul_gemv.comp does).
// Also built reading w in 16- and 8-bit formats (weights.glsl).
#version 450
#extension GL_GOOGLE_include_directive : require
#ifdef TMX_GEMV_SUBGROUP
#extension GL_KHR_shader_subgroup_shuffle : require
#endif
#define WEIGHT_BINDING 1
#include "weights.glsl"
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;  // a power of two
layout(constant_id = 1) const uint NR = 4;
const uint MS = 4;  // slots per workgroup
const uint PARTS = MS * NR;
shared float part[PARTS * WG];
#include "gemv_reduce.glsl"

layout(std430, binding = 0) readonly buffer X { float x[]; };  // [S, K]
layout(std430, binding = 0) readonly buffer X4 { vec4 x4[]; };
// binding 1: w [E, Nout, K] (weights.glsl)
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };
layout(std430, binding = 3) readonly buffer Offsets { int offsets[]; };
layout(std430, binding = 4) writeonly buffer Out { float o[]; };

layout(push_constant) uniform Push {
    uint off_x, off_w, off_bias, off_offsets, off_o;
    uint E, Nout, K;
    uint has_bias;
    uint w_adjust;  // weights.glsl
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
    const bool by_four = pc.K % 4 == 0 && weight4_ok(wo) && pc.off_x % 4 == 0;
    float acc[PARTS];
    for (uint q = 0; q < PARTS; ++q) acc[q] = 0.0;
    if (by_four) {
        for (uint k4 = t; k4 < pc.K / 4; k4 += WG) {
            vec4 wv[NR];
            for (uint r = 0; r < NR; ++r)
                wv[r] = n0 + r < pc.Nout ? weight4_at(wo, w_base + r * pc.K + 4 * k4) : vec4(0);
            for (uint m = 0; m < ms; ++m) {
                const vec4 xv = x4[(pc.off_x + (s0 + m) * pc.K) / 4 + k4];
                for (uint r = 0; r < NR; ++r) acc[m * NR + r] += dot(xv, wv[r]);
            }
        }
    } else {
        for (uint k = t; k < pc.K; k += WG) {
            float wv[NR];
            for (uint r = 0; r < NR; ++r)
                wv[r] = n0 + r < pc.Nout ? weight_at(wo, w_base + r * pc.K + k) : 0.0;
            for (uint m = 0; m < ms; ++m) {
                const float xv = x[pc.off_x + (s0 + m) * pc.K + k];
                for (uint r = 0; r < NR; ++r) acc[m * NR + r] += xv * wv[r];
            }
        }
    }
    reduce_parts(acc, ms * NR);
    if (t < ms * NR) {
        const uint s = s0 + t / NR, n = n0 + t % NR;
        if (n < pc.Nout) {
            float r = reduced(t);
            if (pc.has_bias != 0) r += bias[pc.off_bias + e * pc.Nout + n];
            o[pc.off_o + s * pc.Nout + n] = r;
        }
    }
}

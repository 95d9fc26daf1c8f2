// grouped_matmul for few slots (decode): workgroup (x, y) computes NR outputs of slot y, a
// dot product of x[y, :] with NR rows of its expert's w, reduced across the workgroup. The
// slot's expert is looked up in offsets on the device. Where K and both operands' offsets are
// multiples of 4, invocations read 4 consecutive k at a time (as matmul_gemv.comp does). Also
// built as grouped_matmul_gemv_fp16w, reading w from its fp16 copy (weights.glsl).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "weights.glsl"
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;  // a power of two
layout(constant_id = 1) const uint NR = 4;
const uint PARTS = NR;
shared float part[PARTS * WG];
#include "gemv_reduce.glsl"

layout(std430, binding = 0) readonly buffer X { float x[]; };  // [S, K]
layout(std430, binding = 0) readonly buffer X4 { vec4 x4[]; };
layout(std430, binding = 1) readonly buffer W { WEIGHT_T w[]; };  // [E, Nout, K]
layout(std430, binding = 1) readonly buffer W4 { WEIGHT_VEC4_T w4[]; };
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };
layout(std430, binding = 3) readonly buffer Offsets { int offsets[]; };
layout(std430, binding = 4) writeonly buffer Out { float o[]; };

layout(push_constant) uniform Push {
    uint off_x, off_w, off_bias, off_offsets, off_o;
    uint E, Nout, K;
    uint has_bias;
} pc;

void main() {
    const uint s = gl_WorkGroupID.y, n0 = gl_WorkGroupID.x * NR, t = gl_LocalInvocationID.x;
    uint e = 0;
    while (e < pc.E && uint(offsets[pc.off_offsets + e + 1]) <= s) ++e;
    if (e == pc.E) return;  // uniform across the workgroup
    float acc[NR];
    for (uint r = 0; r < NR; ++r) acc[r] = 0.0;
    const uint w_base = pc.off_w * WEIGHTS_PER_WORD + (e * pc.Nout + n0) * pc.K;
    const uint x_base = pc.off_x + s * pc.K;
    if (pc.K % 4 == 0 && w_base % 4 == 0 && x_base % 4 == 0) {  // uniform
        for (uint k4 = t; k4 < pc.K / 4; k4 += WG) {
            const vec4 xv = x4[x_base / 4 + k4];
            for (uint r = 0; r < NR; ++r)
                if (n0 + r < pc.Nout) acc[r] += dot(xv, vec4(w4[(w_base + r * pc.K) / 4 + k4]));
        }
    } else {
        for (uint k = t; k < pc.K; k += WG) {
            const float xv = x[x_base + k];
            for (uint r = 0; r < NR; ++r)
                if (n0 + r < pc.Nout) acc[r] += xv * float(w[w_base + r * pc.K + k]);
        }
    }
    for (uint r = 0; r < NR; ++r) part[r * WG + t] = acc[r];
    reduce_parts(NR);
    if (t < NR && n0 + t < pc.Nout) {
        float r = part[t * WG];
        if (pc.has_bias != 0) r += bias[pc.off_bias + e * pc.Nout + n0 + t];
        o[pc.off_o + s * pc.Nout + n0 + t] = r;
    }
}

// out[M, N] (+)= op(a) . op(b) (+ bias) for small M (decode): a matrix-vector product per row
// of a, reading b once for each MMAX rows: workgroup z takes rows z * MMAX onwards (the host
// uses this path for M <= 16, a batch's decode step). A row's sum is the same whichever
// workgroup holds it.
//   dot mode (b's k contiguous, e.g. x . W^T): a workgroup owns NR output columns; its
//     invocations stride over k (coalesced reads of b's rows) and the partial dot products
//     are summed across the workgroup (gemv_reduce.glsl: a shared-memory tree, or, built
//     with TMX_GEMV_SUBGROUP, subgroup shuffles then shared memory). Where every row of a and b starts on a multiple of 4
//     elements (K too), each invocation reads 4 consecutive k at a time: one 16-byte load
//     (8 with 16-bit weights, 4 with Q8_0) instead of four.
//   column mode (b's n contiguous): one invocation per output column, looping over k.
// Also built reading b in 16- and 8-bit formats (weights.glsl).
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
layout(constant_id = 1) const uint NR = 4;   // output columns per workgroup in dot mode
const uint MMAX = 4;                         // rows of a per workgroup
const uint PARTS = MMAX * NR;
shared float part[PARTS * WG];
#include "gemv_reduce.glsl"

layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 0) readonly buffer A4 { vec4 a4[]; };
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };
layout(std430, binding = 3) buffer Out { float o[]; };

layout(push_constant) uniform Push {
    uint off_a, off_b, off_bias, off_o;
    uint M, N, K;
    uint a_sm, a_sk, b_sk, b_sn;
    uint has_bias, accumulate;
    uint b_adjust;  // weights.glsl
    uint dot_mode;
} pc;

void store(uint m, uint n, float r) {
    if (pc.has_bias != 0) r += bias[pc.off_bias + n];
    const uint at = pc.off_o + m * pc.N + n;
    o[at] = pc.accumulate != 0 ? o[at] + r : r;
}

void main() {
    const uint t = gl_LocalInvocationID.x, wb = weight_origin(pc.off_b, pc.b_adjust);
    const uint m0 = gl_WorkGroupID.z * MMAX, mc = min(MMAX, pc.M - m0);  // this workgroup's rows
    if (pc.dot_mode == 0) {
        const uint n = group_index() * WG + t;
        if (n >= pc.N) return;
        float acc[MMAX];
        for (uint m = 0; m < MMAX; ++m) acc[m] = 0.0;
        for (uint k = 0; k < pc.K; ++k) {
            const float bv = weight_at(wb, k * pc.b_sk + n);
            for (uint m = 0; m < mc; ++m)
                acc[m] += a[pc.off_a + (m0 + m) * pc.a_sm + k * pc.a_sk] * bv;
        }
        for (uint m = 0; m < mc; ++m) store(m0 + m, n, acc[m]);
        return;
    }

    const uint n0 = group_index() * NR;
    if (n0 >= pc.N) return;  // uniform: the whole workgroup leaves
    float acc[PARTS];
    for (uint q = 0; q < PARTS; ++q) acc[q] = 0.0;
    // b's rows start at element n * b_sn (b_sn = K); a's at off_a + m * a_sm.
    const bool by_four = pc.K % 4 == 0 && weight4_ok(wb) && pc.a_sk == 1 &&
                         pc.off_a % 4 == 0 && (pc.M == 1 || pc.a_sm % 4 == 0);
    if (by_four) {  // uniform
        for (uint k4 = t; k4 < pc.K / 4; k4 += WG) {
            vec4 bv[NR];
            for (uint r = 0; r < NR; ++r)
                bv[r] = n0 + r < pc.N ? weight4_at(wb, (n0 + r) * pc.b_sn + 4 * k4) : vec4(0);
            for (uint m = 0; m < mc; ++m) {
                const vec4 av = a4[(pc.off_a + (m0 + m) * pc.a_sm) / 4 + k4];
                for (uint r = 0; r < NR; ++r) acc[m * NR + r] += dot(av, bv[r]);
            }
        }
    } else {
        for (uint k = t; k < pc.K; k += WG) {
            float bv[NR];
            for (uint r = 0; r < NR; ++r)
                bv[r] = n0 + r < pc.N ? weight_at(wb, k + (n0 + r) * pc.b_sn) : 0.0;
            for (uint m = 0; m < mc; ++m) {
                const float av = a[pc.off_a + (m0 + m) * pc.a_sm + k * pc.a_sk];
                for (uint r = 0; r < NR; ++r) acc[m * NR + r] += av * bv[r];
            }
        }
    }
    reduce_parts(acc, mc * NR);
    if (t < mc * NR) {
        const uint m = m0 + t / NR, n = n0 + t % NR;
        if (n < pc.N) store(m, n, reduced(t));
    }
}

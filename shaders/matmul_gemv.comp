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
//
// Norm prologue (specialization constant NORM, dot mode only; the host's norm_linear at decoding's few
// rows): a is the norm's input x, and the product reads norm(x) instead. Each workgroup first
// computes its rows' statistics (norm_stats.glsl's formulas, summed in a fixed order, so every
// workgroup gets the same bits), then normalizes each value of a as its main loop reads it;
// the workgroup with group index 0 of each row block also writes the normalized rows to
// `normed` [M, K] (its main loop visits every k of its rows once). One dispatch instead of a
// norm's and a product's, and no wait between them.
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
// NORM_* below: a constant, so that a product without the prologue compiles as if it had none
// (as a push constant its tests in the main loop made every product slower: on lavapipe the
// classifier's 1 x 32000 x 512 took 138 ms instead of 88).
layout(constant_id = 2) const uint NORM = 0;
const uint MMAX = 4;                         // rows of a per workgroup
const uint PARTS = MMAX * NR;
shared float part[PARTS * WG];
#include "gemv_reduce.glsl"
#include "norm_stats.glsl"

layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 0) readonly buffer A4 { vec4 a4[]; };
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };
layout(std430, binding = 3) buffer Out { float o[]; };
// The norm prologue's operands (dummies without it): the norm's weight and bias [K], normed [M, K].
layout(std430, binding = 4) readonly buffer NormWeight { float norm_w[]; };
layout(std430, binding = 4) readonly buffer NormWeight4 { vec4 norm_w4[]; };
layout(std430, binding = 5) readonly buffer NormBias { float norm_b[]; };
layout(std430, binding = 5) readonly buffer NormBias4 { vec4 norm_b4[]; };
layout(std430, binding = 6) writeonly buffer Normed { float normed[]; };
layout(std430, binding = 6) writeonly buffer Normed4 { vec4 normed4[]; };

const uint NORM_NONE = 0, NORM_RMS = 1, NORM_LAYER = 2;

layout(push_constant) uniform Push {
    uint off_a, off_b, off_bias, off_o, off_norm_w, off_norm_b, off_normed;
    uint M, N, K;
    uint a_sm, a_sk, b_sk, b_sn;
    uint has_bias, accumulate;
    uint b_adjust;  // weights.glsl
    uint dot_mode;
    float eps;  // the norm prologue's
} pc;

void store(uint m, uint n, float r) {
    if (pc.has_bias != 0) r += bias[pc.off_bias + n];
    const uint at = pc.off_o + m * pc.N + n;
    o[at] = pc.accumulate != 0 ? o[at] + r : r;
}

// The prologue's statistics of this workgroup's rows m0 + m, m < MMAX (mean 0 for RMSNorm).
float row_mean[MMAX], row_rstd[MMAX];

// Sums v[m], m < mc, over the workgroup in a fixed order with two barriers (a tree would take
// log2(WG), each a cost where barriers are slow, as on lavapipe, and every workgroup pays it):
// the invocations' values in runs of STAT_RUN, each run summed by one invocation into its
// first place, then the runs' sums, which every invocation reads in the same order. part[] is
// free again after the next barrier.
const uint STAT_RUN = WG < 16 ? WG : 16;  // the candidates' WG 32 .. 256: 2 .. 16 runs
void sum_rows(inout float v[MMAX], uint mc) {
    const uint t = gl_LocalInvocationID.x, runs = WG / STAT_RUN;
    for (uint m = 0; m < mc; ++m) part[m * WG + t] = v[m];
    barrier();
    for (uint j = t; j < mc * runs; j += WG) {  // one pass unless WG < 4
        const uint first = (j / runs) * WG + (j % runs) * STAT_RUN;
        float s = 0.0;
        for (uint i = 0; i < STAT_RUN; ++i) s += part[first + i];
        part[first] = s;
    }
    barrier();
    for (uint m = 0; m < mc; ++m) {
        float s = 0.0;
        for (uint r = 0; r < runs; ++r) s += part[m * WG + r * STAT_RUN];
        v[m] = s;
    }
}

// Each invocation sums its strided share of each row, then sum_rows() sums the shares (all rows
// at once): the same order in every workgroup, so each gets the same bits.
void norm_statistics(uint m0, uint mc) {
    const uint t = gl_LocalInvocationID.x;
    float acc[MMAX];
    for (uint m = 0; m < MMAX; ++m) row_mean[m] = 0.0;
    if (NORM == NORM_LAYER) {
        for (uint m = 0; m < mc; ++m) {
            const uint row = pc.off_a + (m0 + m) * pc.a_sm;
            const float shift = a[row];
            float s = 0.0;
            for (uint k = t; k < pc.K; k += WG) s += a[row + k * pc.a_sk] - shift;
            acc[m] = s;
        }
        sum_rows(acc, mc);
        for (uint m = 0; m < mc; ++m)
            row_mean[m] = norm_mean(a[pc.off_a + (m0 + m) * pc.a_sm], acc[m], pc.K);
        barrier();  // part[] is free for the next sums
    }
    for (uint m = 0; m < mc; ++m) {
        const uint row = pc.off_a + (m0 + m) * pc.a_sm;
        float sq = 0.0;
        for (uint k = t; k < pc.K; k += WG) {
            const float c = a[row + k * pc.a_sk] - row_mean[m];
            sq += c * c;
        }
        acc[m] = sq;
    }
    sum_rows(acc, mc);
    for (uint m = 0; m < mc; ++m) row_rstd[m] = norm_rstd(acc[m], pc.K, pc.eps);
    barrier();
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
    const bool norm = NORM != NORM_NONE, bias_norm = NORM == NORM_LAYER;
    const bool writes_normed = norm && group_index() == 0;
    if (norm) norm_statistics(m0, mc);
    float acc[PARTS];
    for (uint q = 0; q < PARTS; ++q) acc[q] = 0.0;
    // b's rows start at element n * b_sn (b_sn = K); a's at off_a + m * a_sm.
    // (normed's rows are K long: with K % 4 == 0 they start on multiples of 4 as it does.)
    const bool by_four = pc.K % 4 == 0 && weight4_ok(wb) && pc.a_sk == 1 &&
                         pc.off_a % 4 == 0 && (pc.M == 1 || pc.a_sm % 4 == 0) &&
                         (!norm || (pc.off_norm_w % 4 == 0 && pc.off_normed % 4 == 0 &&
                                    (!bias_norm || pc.off_norm_b % 4 == 0)));
    if (by_four) {  // uniform
        for (uint k4 = t; k4 < pc.K / 4; k4 += WG) {
            vec4 bv[NR];
            for (uint r = 0; r < NR; ++r)
                bv[r] = n0 + r < pc.N ? weight4_at(wb, (n0 + r) * pc.b_sn + 4 * k4) : vec4(0);
            const vec4 gv = norm ? norm_w4[pc.off_norm_w / 4 + k4] : vec4(0);
            const vec4 betav = bias_norm ? norm_b4[pc.off_norm_b / 4 + k4] : vec4(0);
            for (uint m = 0; m < mc; ++m) {
                vec4 av = a4[(pc.off_a + (m0 + m) * pc.a_sm) / 4 + k4];
                if (norm) {
                    av = norm_scale(av, row_mean[m], row_rstd[m], gv);
                    if (bias_norm) av += betav;
                    if (writes_normed) normed4[(pc.off_normed + (m0 + m) * pc.K) / 4 + k4] = av;
                }
                for (uint r = 0; r < NR; ++r) acc[m * NR + r] += dot(av, bv[r]);
            }
        }
    } else {
        for (uint k = t; k < pc.K; k += WG) {
            float bv[NR];
            for (uint r = 0; r < NR; ++r)
                bv[r] = n0 + r < pc.N ? weight_at(wb, k + (n0 + r) * pc.b_sn) : 0.0;
            const float gv = norm ? norm_w[pc.off_norm_w + k] : 0.0;
            const float betav = bias_norm ? norm_b[pc.off_norm_b + k] : 0.0;
            for (uint m = 0; m < mc; ++m) {
                float av = a[pc.off_a + (m0 + m) * pc.a_sm + k * pc.a_sk];
                if (norm) {
                    av = norm_scale(av, row_mean[m], row_rstd[m], gv);
                    if (bias_norm) av += betav;
                    if (writes_normed) normed[pc.off_normed + (m0 + m) * pc.K + k] = av;
                }
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

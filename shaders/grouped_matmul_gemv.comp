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
//
// EPILOGUE OP_COMBINE fuses the second half (Backend::grouped_ffn_down) for one token a row of
// workgroups (the host's choice for a batch-1 step, where a token's slots are each of another
// expert): workgroup (x, n) takes token n's up to MS slots slot_of[n k + j], each with its own
// expert's rows of w (w2), sums each product as above (the same order, so the slots' outputs
// are grouped_matmul's bits) into ys, and adds sum_j gates[n, j] ys[slot, :] to the token's row
// of the residual h, as moe_combine.comp does, without a dispatch (and a wait) for it. A slot
// id out of range makes the token's row NaN (moe_route wrote them: it cannot happen unless a
// shader is wrong), which the logits' check then reports.
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
const uint OP_COMBINE = 6u;  // vulkan_activations.h's kCombine: past activations.glsl's codes
const bool COMBINE = EPILOGUE == OP_COMBINE;
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
// OP_COMBINE's operands in the bindings it leaves free: the residual h [N, Nout] in binding 4
// (its other writable bindings hold it or ys, which binding 8 takes), gates [N, k] in binding 5,
// slot_of [N k] in binding 6.
layout(std430, binding = 4) buffer Residual { float h[]; };
layout(std430, binding = 5) readonly buffer Gates { float gates[]; };
layout(std430, binding = 6) readonly buffer SlotOf { int slot_of[]; };

layout(push_constant) uniform Push {
    uint off_x, off_w, off_bias, off_offsets, off_o, off_w3, off_bias3, off_up, off_act;
    uint E, Nout, K;
    uint has_bias;
    uint w_adjust;  // weights.glsl
    uint has_bias3, w3_adjust;
    uint choices;  // OP_COMBINE: k, a token's slots (at most MS)
} pc;

int offset_of(uint e) {
    return offsets[pc.off_offsets + e];
}

// OP_COMBINE (see the top): token n = gl_WorkGroupID.y, columns n0 .. n0 + NR - 1.
void combine_main() {
    const uint tok = gl_WorkGroupID.y, n0 = gl_WorkGroupID.x * NR, t = gl_LocalInvocationID.x;
    const uint kc = min(pc.choices, MS), slots = uint(offset_of(pc.E));
    uint slot[MS], expert[MS];
    bool valid[MS];
    for (uint j = 0; j < kc; ++j) {
        const int s = slot_of[pc.off_bias3 + tok * pc.choices + j];
        valid[j] = s >= 0 && uint(s) < slots;
        slot[j] = valid[j] ? uint(s) : 0u;
        uint e = 0;
        while (e + 1 < pc.E && uint(offset_of(e + 1)) <= slot[j]) ++e;
        expert[j] = e;
    }
    const uint wo = weight_origin(pc.off_w, pc.w_adjust);
    const bool by_four = pc.K % 4 == 0 && weight4_ok(wo) && pc.off_x % 4 == 0;
    float acc[PARTS];
    for (uint q = 0; q < PARTS; ++q) acc[q] = 0.0;
    for (uint j = 0; j < kc; ++j) {
        if (!valid[j]) continue;  // uniform
        const uint w_base = (expert[j] * pc.Nout + n0) * pc.K, x_row = pc.off_x + slot[j] * pc.K;
        if (by_four) {
            for (uint k4 = t; k4 < pc.K / 4; k4 += WG) {
                const vec4 xv = x4[x_row / 4 + k4];
                for (uint r = 0; r < NR; ++r)
                    if (n0 + r < pc.Nout)
                        acc[j * NR + r] += dot(xv, weight4_of(0u, wo, w_base + r * pc.K + 4 * k4));
            }
        } else {
            for (uint k = t; k < pc.K; k += WG) {
                const float xv = x[x_row + k];
                for (uint r = 0; r < NR; ++r)
                    if (n0 + r < pc.Nout)
                        acc[j * NR + r] += xv * weight_of(0u, wo, w_base + r * pc.K + k);
            }
        }
    }
    reduce_parts(acc, kc * NR);
    const uint n = n0 + t;
    if (t >= NR || n >= pc.Nout) return;
    const uint at = pc.off_o + tok * pc.Nout + n;
    float r = h[at];
    for (uint j = 0; j < kc; ++j) {
        if (!valid[j]) {
            r = uintBitsToFloat(0x7fc00000u);  // NaN
            continue;
        }
        float y = reduced(j * NR + t);
        if (pc.has_bias != 0) y += bias[pc.off_bias + expert[j] * pc.Nout + n];
        act[pc.off_act + slot[j] * pc.Nout + n] = y;
        r += gates[pc.off_w3 + tok * pc.choices + j] * y;
    }
    h[at] = r;
}

void main() {
    if (COMBINE) {
        combine_main();
        return;
    }
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

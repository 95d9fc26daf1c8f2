// The bias gradients: out[r, n] += sum over the rows of range r of x[row, n], one range per
// bias. Dense (bias_backward): one range, rows 0 .. rows. Grouped (grouped_matmul's backward):
// range e is expert e's slots, read from offsets on the device.
// Each range is cut into chunks of pc.chunk_rows rows; chunk c of range e is chunk number
// chunk_base(e) + c overall, chunk_base(e) counting the chunks of the ranges before e (the grid's
// y runs over those numbers; a number past the last range's chunks does nothing).
//   PASS 0, an invocation per (column, chunk): the chunk's rows summed in order, added to out
//     when pc.direct (the host knows every range fits one chunk), else written to the chunk's
//     partials [chunk, N];
//   PASS 1, an invocation per (column, range): the range's partials added to out in chunk order.
// A fixed order throughout, so the same bits on every run; a training step's 32,768 slots spread
// over chunks x columns / WG workgroups where one invocation per column would walk them all in
// series. A range without rows leaves its out untouched.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(constant_id = 1) const uint PASS = 0;

layout(std430, binding = 0) readonly buffer X { float x[]; };  // [rows, N]
layout(std430, binding = 1) readonly buffer Offsets { int offsets[]; };  // grouped: [ranges + 1]
layout(std430, binding = 2) buffer Partials { float partials[]; };  // [chunks, N]
layout(std430, binding = 3) buffer Out { float o[]; };  // [ranges, N], accumulated

layout(push_constant) uniform Push {
    uint off_x, off_offsets, off_partials, off_o;
    uint N, rows, ranges, grouped, chunk_rows, direct;
} pc;

uint range_begin(uint r) { return pc.grouped != 0 ? uint(offsets[pc.off_offsets + r]) : 0u; }
uint range_end(uint r) { return pc.grouped != 0 ? uint(offsets[pc.off_offsets + r + 1]) : pc.rows; }
uint range_chunks(uint r) {
    const uint b = range_begin(r), e = range_end(r);
    return e > b ? (e - b + pc.chunk_rows - 1) / pc.chunk_rows : 0u;
}

void main() {
    const uint n = gl_WorkGroupID.x * WG + gl_LocalInvocationID.x;
    if (n >= pc.N) return;
    if (PASS == 0) {
        // Which range and which of its chunks this workgroup's y is (uniform across it).
        uint chunk = gl_WorkGroupID.y, r = 0;
        for (; r < pc.ranges; ++r) {
            const uint c = range_chunks(r);
            if (chunk < c) break;
            chunk -= c;
        }
        if (r == pc.ranges) return;
        const uint first = range_begin(r) + chunk * pc.chunk_rows;
        const uint end = min(range_end(r), first + pc.chunk_rows);
        float s = 0.0;
        for (uint row = first; row < end; ++row) s += x[pc.off_x + row * pc.N + n];
        if (pc.direct != 0) {
            const uint at = pc.off_o + r * pc.N + n;
            o[at] = o[at] + s;
        } else {
            partials[pc.off_partials + gl_WorkGroupID.y * pc.N + n] = s;
        }
        return;
    }
    const uint r = gl_WorkGroupID.y;
    uint base = 0;
    for (uint q = 0; q < r; ++q) base += range_chunks(q);
    const uint chunks = range_chunks(r);
    if (chunks == 0) return;
    float s = 0.0;
    for (uint c = 0; c < chunks; ++c) s += partials[pc.off_partials + (base + c) * pc.N + n];
    const uint at = pc.off_o + r * pc.N + n;
    o[at] = o[at] + s;
}

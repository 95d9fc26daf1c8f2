// Backward of gather_rows: d_x[rows[s], :] += d_out[s, :]. One invocation per
// column, walking the slots in order: rows repeat (a token seen twice, a row gathered for two
// experts), and this way each element of d_x is summed by one invocation in slot order, with
// no atomics, so the result is the same on every run. A row outside [0, n_rows) is reported
// and skipped.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;

layout(std430, binding = 0) readonly buffer Rows { int rows[]; };
layout(std430, binding = 1) readonly buffer DOut { float d_out[]; };
layout(std430, binding = 2) buffer DX { float d_x[]; };
layout(std430, binding = 3) buffer Status { uint status[]; };

layout(push_constant) uniform Push {
    uint off_rows, off_dout, off_dx, off_status;
    uint S, d, n_rows;
} pc;

void main() {
    const uint c = group_index() * WG + gl_LocalInvocationID.x;
    if (c >= pc.d) return;
    for (uint s = 0; s < pc.S; ++s) {
        const int r = rows[pc.off_rows + s];
        if (r < 0 || uint(r) >= pc.n_rows) {
            if (c == 0) REPORT_ERROR(ERR_GATHER_ROW, r, pc.n_rows);
            continue;
        }
        d_x[pc.off_dx + uint(r) * pc.d + c] += d_out[pc.off_dout + s * pc.d + c];
    }
}

// Backward of gather_rows: d_x[rows[s], :] += d_out[s, :]. Rows repeat (a token seen twice, a
// row gathered for two experts), so each element of d_x is summed by one invocation walking the
// slots in order, with no atomics: the same result on every run. Invocation (column c, range g)
// owns d_x's rows [g * pc.range_rows, (g + 1) * pc.range_rows) in column c: it walks every slot
// and adds those whose row is its own. The ranges give a GPU columns x ranges invocations where
// one per column would run d of them (a training step's 16,384 tokens walked in series by 512),
// and each element's sum keeps slot order. A row outside [0, n_rows) is reported and skipped.
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
    uint range_rows;
} pc;

void main() {
    const uint c = gl_WorkGroupID.x * WG + gl_LocalInvocationID.x, g = gl_WorkGroupID.y;
    if (c >= pc.d) return;
    const uint lo = g * pc.range_rows, hi = min(pc.n_rows, lo + pc.range_rows);
    for (uint s = 0; s < pc.S; ++s) {
        const int r = rows[pc.off_rows + s];
        if (r < 0 || uint(r) >= pc.n_rows) {
            if (c == 0 && g == 0) REPORT_ERROR(ERR_GATHER_ROW, r, pc.n_rows);
            continue;
        }
        if (uint(r) < lo || uint(r) >= hi) continue;
        d_x[pc.off_dx + uint(r) * pc.d + c] += d_out[pc.off_dout + s * pc.d + c];
    }
}

// out[s, :] = x[rows[s], :] (gather_rows; the token embedding reads its table as x). A row
// outside [0, n_rows) is reported and its output row zeroed. Also built reading an embedding
// table in 16- and 8-bit formats (weights.glsl).
#version 450
#extension GL_GOOGLE_include_directive : require
#define WEIGHT_BINDING 0
#include "weights.glsl"
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;

// binding 0: x [n_rows, d] (weights.glsl)
layout(std430, binding = 1) readonly buffer Rows { int rows[]; };
layout(std430, binding = 2) writeonly buffer Out { float o[]; };
layout(std430, binding = 3) buffer Status { uint status[]; };

layout(push_constant) uniform Push {
    uint off_x, off_rows, off_o, off_status;
    uint S, d, n_rows;
    uint x_adjust;  // weights.glsl
} pc;

void main() {
    const uint idx = group_index() * WG + gl_LocalInvocationID.x;
    if (idx >= pc.S * pc.d) return;
    const uint s = idx / pc.d, c = idx % pc.d;
    const int r = rows[pc.off_rows + s];
    if (r < 0 || uint(r) >= pc.n_rows) {
        if (c == 0) REPORT_ERROR(ERR_GATHER_ROW, r, pc.n_rows);
        o[pc.off_o + idx] = 0.0;
        return;
    }
    o[pc.off_o + idx] = weight_at(weight_origin(pc.off_x, pc.x_adjust), uint(r) * pc.d + c);
}

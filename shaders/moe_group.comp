// Groups the S = N*k (token, choice) slots by expert, stably, in one workgroup:
// count (shared atomics), prefix sum (offsets), then a scatter in slot order, a chunk of WG
// slots at a time: a slot's place within its expert is the number of earlier slots of the
// chunk with the same expert, after the experts' running cursors.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;
const uint MAX_EXPERTS = 1024;

layout(std430, binding = 0) readonly buffer Indices { int indices[]; };
layout(std430, binding = 1) writeonly buffer Offsets { int offsets[]; };
layout(std430, binding = 2) writeonly buffer SlotRows { int slot_rows[]; };
layout(std430, binding = 3) writeonly buffer SlotOf { int slot_of[]; };
layout(std430, binding = 4) buffer Status { uint status[]; };

layout(push_constant) uniform Push {
    uint off_i, off_off, off_rows, off_of, off_status;
    uint S, k, E;
} pc;

shared uint counts[MAX_EXPERTS];
shared uint cursor[MAX_EXPERTS];
shared int chunk[WG];

void main() {
    const uint t = gl_LocalInvocationID.x;
    for (uint e = t; e < pc.E; e += WG) counts[e] = 0;
    barrier();
    for (uint s = t; s < pc.S; s += WG) {
        const int e = indices[pc.off_i + s];
        if (e < 0 || uint(e) >= pc.E) {
            REPORT_ERROR(ERR_EXPERT_INDEX, e, pc.E);
        } else {
            atomicAdd(counts[e], 1u);
        }
    }
    barrier();
    if (t == 0) {
        uint running = 0;
        for (uint e = 0; e < pc.E; ++e) {
            cursor[e] = running;
            offsets[pc.off_off + e] = int(running);
            running += counts[e];
        }
        offsets[pc.off_off + pc.E] = int(running);
    }
    barrier();
    for (uint base = 0; base < pc.S; base += WG) {
        const uint s = base + t;
        int e = s < pc.S ? indices[pc.off_i + s] : -1;
        if (e >= int(pc.E)) e = -1;
        chunk[t] = e;
        barrier();
        if (e >= 0) {
            uint rank = 0;
            for (uint j = 0; j < t; ++j) rank += chunk[j] == e ? 1u : 0u;
            const uint place = cursor[e] + rank;
            slot_rows[pc.off_rows + place] = int(s / pc.k);
            slot_of[pc.off_of + s] = int(place);
        } else if (s < pc.S) {
            slot_of[pc.off_of + s] = -1;
        }
        barrier();
        if (e >= 0) atomicAdd(cursor[e], 1u);
        barrier();
    }
}

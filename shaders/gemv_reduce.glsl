// Workgroup sum of several partial values at once, for the matrix-vector shaders. Include
// after declaring the specialization constant WG (a power of two), PARTS and
// `shared float part[PARTS * WG]`. reduce_parts(acc, count) sums acc[q], q < count, over the
// workgroup's invocations; then reduced(q) is the sum of value q. Uniform control flow only.
//   (default) a shared-memory tree: log2(WG) barriers.
//   TMX_GEMV_SUBGROUP (the modules *_sg, variants ".sg1"; the shader enables
//     GL_KHR_shader_subgroup_shuffle): first within each subgroup, then the subgroups' totals
//     through shared memory: one barrier. Any subgroup size (a power of two, at most WG: the
//     host refuses the variant otherwise) and any number of subgroups.
#ifdef TMX_GEMV_SUBGROUP

void reduce_parts(inout float acc[PARTS], uint count) {
    // A butterfly of subgroupShuffleXor rather than subgroupAdd: its summation order is fixed
    // by this code, not left to the driver, so results are the same run to run (as the
    // project keeps them) and from one driver to the next on a subgroup size. Partners add
    // the same two values (a + b, b + a), so every invocation ends with the same bits.
    for (uint lanes = 1; lanes < gl_SubgroupSize; lanes <<= 1)
        for (uint q = 0; q < count; ++q) acc[q] += subgroupShuffleXor(acc[q], lanes);
    if (gl_SubgroupInvocationID == 0)
        for (uint q = 0; q < count; ++q) part[q * gl_NumSubgroups + gl_SubgroupID] = acc[q];
    barrier();
}

// The subgroups' totals in subgroup order.
float reduced(uint q) {
    float s = 0.0;
    for (uint g = 0; g < gl_NumSubgroups; ++g) s += part[q * gl_NumSubgroups + g];
    return s;
}

#else

void reduce_parts(inout float acc[PARTS], uint count) {
    const uint t = gl_LocalInvocationID.x;
    for (uint q = 0; q < count; ++q) part[q * WG + t] = acc[q];
    barrier();
    for (uint s = WG / 2; s > 0; s >>= 1) {
        if (t < s)
            for (uint q = 0; q < count; ++q) part[q * WG + t] += part[q * WG + t + s];
        barrier();
    }
}

float reduced(uint q) {
    return part[q * WG];
}

#endif

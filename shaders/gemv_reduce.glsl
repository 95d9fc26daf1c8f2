// Workgroup sum of several partial values at once, for the matrix-vector shaders. Include
// after declaring the specialization constant WG (a power of two) and
// `shared float part[PARTS * WG]`: value q of invocation t sits at part[q * WG + t]; after
// reduce_parts(count), part[q * WG] holds the sum of value q. Uniform control flow only.
void reduce_parts(uint count) {
    const uint t = gl_LocalInvocationID.x;
    barrier();
    for (uint s = WG / 2; s > 0; s >>= 1) {
        if (t < s)
            for (uint q = 0; q < count; ++q) part[q * WG + t] += part[q * WG + t + s];
        barrier();
    }
}

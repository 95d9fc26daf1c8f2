// Workgroup-wide sum and max through shared memory. Include after declaring the specialization
// constant WG (the workgroup size, a power of two) and `shared float red[WG];`. Every
// invocation of the workgroup must call these, in uniform control flow.

float reduce_sum(float v) {
    const uint t = gl_LocalInvocationID.x;
    red[t] = v;
    barrier();
    for (uint s = WG / 2; s > 0; s >>= 1) {
        if (t < s) red[t] += red[t + s];
        barrier();
    }
    const float r = red[0];
    barrier();  // red is free for the next reduction
    return r;
}

float reduce_max(float v) {
    const uint t = gl_LocalInvocationID.x;
    red[t] = v;
    barrier();
    for (uint s = WG / 2; s > 0; s >>= 1) {
        if (t < s) red[t] = max(red[t], red[t + s]);
        barrier();
    }
    const float r = red[0];
    barrier();
    return r;
}

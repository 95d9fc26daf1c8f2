// The forward activations, one definition for elementwise.comp and for the fused epilogue of
// grouped_matmul_gemv.comp, so a fused op's out is bit for bit what elementwise.comp computes
// from its pre (the backward recomputes an activation from pre with elementwise.comp). The
// operation codes are elementwise.comp's (backends/vulkan/vulkan_activations.h).
const uint OP_ADD = 0u, OP_SWIGLU = 1u, OP_GELU = 2u, OP_SILU = 3u, OP_RELU = 4u, OP_RELU2 = 5u;

// x * sigmoid(x), written so exp never overflows into inf/inf.
float silu(float v) { return v / (1.0 + exp(-v)); }

// 0.5 x (1 + tanh(u)) == x * sigmoid(2u): no cancellation for x << 0, no overflow.
float gelu_tanh(float v) {
    const float u = 0.7978845608028654 * (v + 0.044715 * v * v * v);
    return v / (1.0 + exp(-2.0 * u));
}

// Operation op other than OP_ADD on a: op(a), or for OP_SWIGLU silu(a) * up (up unused else).
float activation(uint op, float a, float up) {
    if (op == OP_SWIGLU) return silu(a) * up;
    if (op == OP_GELU) return gelu_tanh(a);
    if (op == OP_SILU) return silu(a);
    if (op == OP_RELU) return a > 0.0 ? a : 0.0;
    return a > 0.0 ? a * a : 0.0;  // OP_RELU2
}

// x * sigmoid(x), written so exp never overflows into inf/inf.
float silu(float v) { return v / (1.0 + exp(-v)); }

// 0.5 x (1 + tanh(u)) == x * sigmoid(2u): no cancellation for x << 0, no overflow.
float gelu_tanh(float v) {
    const float u = 0.7978845608028654 * (v + 0.044715 * v * v * v);
    return v / (1.0 + exp(-2.0 * u));
}

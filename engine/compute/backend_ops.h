// The lists of Backend's *_impl functions, written once (X-macros): Backend declares them from
// these lists and each backend declares its overrides from the same lists, so a signature lives
// in one place. Each op's contract (shapes, layout, semantics) is in engine/compute/backend.h,
// at the public method that calls its *_impl.
//
// A list is a macro taking X, which it applies to each op as X(return type, name, (parameters)):
// name##_impl is the function. The ops are split as the backends divide them:
//  - TMX_BACKEND_MEMORY_OPS: allocation and transfers, pure virtual; every backend has them.
//  - TMX_BACKEND_FORWARD_OPS: the forward ops, pure virtual; every backend has them.
//  - TMX_BACKEND_TRAINING_OPS: the backward and optimizer ops; by default each throws
//    tmx::Error (the backend does not train), and a training backend overrides all of them.
//  - TMX_BACKEND_FUSED_OPS: sequences of forward ops the model runs back to back, as one op so
//    that a backend may run each as fewer commands (a decode step is bound by their number);
//    by default each runs its sequence, and a backend overrides those it fuses, declaring each
//    override explicitly.
// The other *_impl functions have a default that only some backends override (convert_impl,
// linear_impl, linear_backward_impl): Backend declares them explicitly, and so does a backend
// that overrides one (but see TMX_BACKEND_TRAINING_BACKEND_OVERRIDES below).
//
// Inside a class derived from Backend, TMX_BACKEND_MEMORY_OP_OVERRIDES,
// TMX_BACKEND_FORWARD_OP_OVERRIDES and TMX_BACKEND_TRAINING_OP_OVERRIDES declare the overrides
// of a whole list (`void norm_impl(...) override;` and so on); the backend defines them.
// TMX_BACKEND_TRAINING_BACKEND_OVERRIDES is all three and convert_impl: what a backend that
// trains and has BF16 tensors overrides (cpu, cuda).
#pragma once

// clang-format off
#define TMX_BACKEND_MEMORY_OPS(X)                                                                  \
    X(std::shared_ptr<DeviceBuffer>, alloc, (size_t bytes))                                        \
    X(void, upload, (const Tensor& dst, const void* host))                                         \
    X(void, download, (const Tensor& src, void* host))                                             \
    X(void, fill, (const Tensor& dst, float value))                                                \
    X(void, copy, (const Tensor& src, const Tensor& dst))

#define TMX_BACKEND_FORWARD_OPS(X)                                                                 \
    X(void, norm, (NormType type, const Tensor& x, const Tensor& weight, const Tensor& bias,       \
                   float eps, const Tensor& out))                                                  \
    X(void, matmul, (const Tensor& a, const Tensor& b, const Tensor& out, MatmulOptions opts,      \
                     const Tensor& bias))                                                          \
    X(void, rope, (const Tensor& x, const Tensor& positions, double theta, bool inverse))          \
    X(void, attention, (const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,      \
                        int64_t window))                                                           \
    X(void, attention_cached, (const Tensor& q, const Tensor& k, const Tensor& v,                  \
                               const Tensor& k_cache, const Tensor& v_cache, const Tensor& start,  \
                               const Tensor& out, int64_t window))                                 \
    X(void, kv_cache_write, (const Tensor& k, const Tensor& v, const Tensor& k_cache,              \
                             const Tensor& v_cache, const Tensor& start))                          \
    X(void, router_topk, (const Tensor& logits, const Tensor& indices, const Tensor& gates))       \
    X(void, moe_group, (const Tensor& indices, int64_t n_experts, const Tensor& offsets,           \
                        const Tensor& slot_rows, const Tensor& slot_of))                           \
    X(void, gather_rows, (const Tensor& x, const Tensor& rows, const Tensor& out))                 \
    X(void, grouped_matmul, (const Tensor& x, const Tensor& w, const Tensor& bias,                 \
                             const Tensor& offsets, const Tensor& out))                            \
    X(void, moe_combine, (const Tensor& expert_out, const Tensor& slot_of, const Tensor& gates,    \
                          const Tensor& out))                                                      \
    X(void, activation, (Activation act, const Tensor& x, const Tensor& out))                      \
    X(void, swiglu, (const Tensor& gate, const Tensor& up, const Tensor& out))                     \
    X(void, add, (const Tensor& a, const Tensor& b, const Tensor& out))                            \
    X(void, cross_entropy, (const Tensor& logits, const Tensor& targets, const Tensor& losses))    \
    X(void, router_aux_loss, (const Tensor& logits, const Tensor& indices, const Tensor& out))

#define TMX_BACKEND_FUSED_OPS(X)                                                                   \
    X(void, norm_linear, (NormType type, const Tensor& x, const Tensor& norm_weight,               \
                          const Tensor& norm_bias, float eps, const Tensor& normed,                \
                          const Tensor& w, const Tensor& b, const Tensor& y))                      \
    X(void, rope_attention_cached_store, (const Tensor& q, const Tensor& k, const Tensor& v,       \
                                          const Tensor& positions, double theta,                   \
                                          const Tensor& k_cache, const Tensor& v_cache,            \
                                          const Tensor& start, const Tensor& out, int64_t window)) \
    X(void, moe_route, (const Tensor& logits, const Tensor& x, const Tensor& indices,              \
                        const Tensor& gates, const Tensor& offsets, const Tensor& slot_rows,       \
                        const Tensor& slot_of, const Tensor& xs))                                  \
    X(void, grouped_ffn_up, (const Tensor& x, const Tensor& w1, const Tensor& b1,                  \
                             const Tensor& w3, const Tensor& b3, const Tensor& offsets,            \
                             Activation act, const Tensor& pre, const Tensor& up,                  \
                             const Tensor& out))                                                   \
    X(void, grouped_ffn_down, (const Tensor& x, const Tensor& w2, const Tensor& b2,                \
                               const Tensor& offsets, const Tensor& slot_of, const Tensor& gates,  \
                               const Tensor& ys, const Tensor& out))

#define TMX_BACKEND_TRAINING_OPS(X)                                                                \
    X(void, norm_backward, (NormType type, const Tensor& x, const Tensor& weight,                  \
                            const Tensor& d_out, float eps, const Tensor& d_x,                     \
                            const Tensor& d_weight, const Tensor& d_bias))                         \
    X(void, bias_backward, (const Tensor& d_out, const Tensor& d_bias))                            \
    X(void, attention_backward, (const Tensor& q, const Tensor& k, const Tensor& v,                \
                                 const Tensor& d_out, const Tensor& d_q, const Tensor& d_k,        \
                                 const Tensor& d_v, int64_t window))                               \
    X(void, router_backward, (const Tensor& logits, const Tensor& indices, const Tensor& gates,    \
                              const Tensor& d_gates, float aux_weight, const Tensor& d_logits))    \
    X(void, gather_rows_backward, (const Tensor& rows, const Tensor& d_out, const Tensor& d_x))    \
    X(void, grouped_matmul_backward, (const Tensor& x, const Tensor& w, const Tensor& offsets,     \
                                      const Tensor& d_out, const Tensor& d_x, const Tensor& d_w,   \
                                      const Tensor& d_bias))                                       \
    X(void, moe_combine_backward, (const Tensor& expert_out, const Tensor& slot_of,                \
                                   const Tensor& gates, const Tensor& d_out,                       \
                                   const Tensor& d_expert_out, const Tensor& d_gates))             \
    X(void, activation_backward, (Activation act, const Tensor& x, const Tensor& d_out,            \
                                  const Tensor& d_x))                                              \
    X(void, swiglu_backward, (const Tensor& gate, const Tensor& up, const Tensor& d_out,           \
                              const Tensor& d_gate, const Tensor& d_up))                           \
    X(void, cross_entropy_backward, (const Tensor& logits, const Tensor& targets, float scale,     \
                                     const Tensor& d_logits))                                      \
    X(void, sum_squares, (const Tensor& x, const Tensor& out))                                     \
    X(void, scale, (const Tensor& x, float s))                                                     \
    X(void, adamw, (const Tensor& params, const Tensor& grads, const Tensor& m, const Tensor& v,   \
                    const AdamWParams& hp))
// clang-format on

// What Backend declares from the lists: pure virtual, or virtual with a default in backend.cpp.
#define TMX_BACKEND_DECLARE_PURE_IMPL(ret, name, params) virtual ret name##_impl params = 0;
#define TMX_BACKEND_DECLARE_DEFAULT_IMPL(ret, name, params) virtual ret name##_impl params;
// What a backend declares: its override.
#define TMX_BACKEND_DECLARE_OVERRIDE_IMPL(ret, name, params) ret name##_impl params override;

#define TMX_BACKEND_MEMORY_OP_OVERRIDES TMX_BACKEND_MEMORY_OPS(TMX_BACKEND_DECLARE_OVERRIDE_IMPL)
#define TMX_BACKEND_FORWARD_OP_OVERRIDES TMX_BACKEND_FORWARD_OPS(TMX_BACKEND_DECLARE_OVERRIDE_IMPL)
#define TMX_BACKEND_TRAINING_OP_OVERRIDES \
    TMX_BACKEND_TRAINING_OPS(TMX_BACKEND_DECLARE_OVERRIDE_IMPL)

#define TMX_BACKEND_TRAINING_BACKEND_OVERRIDES                        \
    TMX_BACKEND_MEMORY_OP_OVERRIDES                                   \
    void convert_impl(const Tensor& src, const Tensor& dst) override; \
    TMX_BACKEND_FORWARD_OP_OVERRIDES                                  \
    TMX_BACKEND_TRAINING_OP_OVERRIDES

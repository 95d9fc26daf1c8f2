// Reference implementations of the Backend interface's forward ops, for the op tests: plain
// double-precision loops on host vectors, written straight from the contracts in
// engine/compute/backend.h (and docs/design.md#3-forward-pass), not from any backend's code.
// They favour being obviously right over being fast: every backend (the CPU one included) is
// compared to these.
//
// Layouts are those of engine/compute/backend.h: row-major, dimensions passed explicitly.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/compute/precision.h"
#include "engine/model/config.h"

namespace tmx::ref {

using Vec = std::vector<double>;
using Ids = std::vector<int32_t>;

Vec to_double(const std::vector<float>& v);

// Layernorm (mean, biased variance) and rmsnorm over the last dimension of x [N, d].
Vec layernorm(const Vec& x, int64_t N, int64_t d, const Vec& weight, const Vec& bias, double eps);
Vec rmsnorm(const Vec& x, int64_t N, int64_t d, const Vec& weight, double eps);

// out[M, N] = init + op(a) [M, K] . op(b) [K, N] + bias[N]. a is stored [K, M] when trans_a,
// b is stored [N, K] when trans_b. init (accumulate) and bias may be null.
Vec matmul(const Vec& a, const Vec& b, int64_t M, int64_t N, int64_t K, bool trans_a, bool trans_b,
           const Vec* bias = nullptr, const Vec* init = nullptr);

// x [N, H, hd] rotated by positions [N]: pairs (i, i + hd/2), angle = pos * theta^(-2i/hd).
Vec rope(const Vec& x, int64_t N, int64_t H, int64_t hd, const Ids& positions, double theta);

// Causal sliding-window GQA attention. q [B, T, H, hd], k and v [B, T, Hkv, hd]; returns
// [B, T, H, hd]. window 0 = unlimited. Under BF16 precision where attention_in_bf16, the
// contract's roundings (engine/compute/backend.h: q, k, v and the softmax weights before their
// products); elsewhere none.
Vec attention(const Vec& q, const Vec& k, const Vec& v, int64_t B, int64_t T, int64_t H,
              int64_t Hkv, int64_t hd, int64_t window, Precision precision = Precision::F32);

// attention_backward()'s contributions to d_q, d_k, d_v (what the op adds to them), with the
// roundings of BF16 precision as attention() above.
struct AttentionGrads {
    Vec d_q, d_k, d_v;
};
AttentionGrads attention_backward(const Vec& q, const Vec& k, const Vec& v, const Vec& d_out,
                                  int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t hd,
                                  int64_t window, Precision precision = Precision::F32);

struct TopK {
    Ids indices;  // [N, k]
    Vec gates;    // [N, k]
};
// Per row of logits [N, E]: the k largest, descending, ties to the lower index; gates are the
// softmax of those k logits.
TopK router_topk(const Vec& logits, int64_t N, int64_t E, int64_t k);

struct Grouping {
    Ids offsets;    // [E + 1]
    Ids slot_rows;  // [N * k]
    Ids slot_of;    // [N * k]
};
// Stable grouping of the N*k slots of indices [N, k] by expert.
Grouping moe_group(const Ids& indices, int64_t N, int64_t k, int64_t n_experts);

// out[s, :] = x[rows[s], :].  x [N, d]; rows must be in [0, N).
Vec gather_rows(const Vec& x, int64_t N, int64_t d, const Ids& rows);

// out[s, :] = x[s, :] . w[e]^T (+ bias[e]) for s in [offsets[e], offsets[e+1]).
// x [S, K], w [E, Nout, K], bias [E, Nout] or null; returns [S, Nout] (rows outside every
// expert's range stay 0).
Vec grouped_matmul(const Vec& x, int64_t S, int64_t K, const Vec& w, int64_t E, int64_t Nout,
                   const Vec* bias, const Ids& offsets);

// init[n, :] + sum_j gates[n, j] * expert_out[slot_of[n*k + j], :].  init [N, d].
Vec moe_combine(const Vec& expert_out, const Ids& slot_of, const Vec& gates, int64_t N, int64_t k,
                int64_t d, const Vec& init);

double gelu_tanh(double x);
double silu(double x);
double relu(double x);
double relu2(double x);
Vec activation(Activation act, const Vec& x);
Vec swiglu(const Vec& gate, const Vec& up);
Vec add(const Vec& a, const Vec& b);

// losses[n] = logsumexp(logits[n, :]) - logits[n, targets[n]]; target -1 gives 0.
Vec cross_entropy(const Vec& logits, int64_t N, int64_t V, const Ids& targets);

// E * sum_e f_e * P_e over logits [N, E] and indices [N, k].
double router_aux_loss(const Vec& logits, int64_t N, int64_t E, const Ids& indices, int64_t k);

}  // namespace tmx::ref

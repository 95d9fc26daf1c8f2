// CPU causal sliding-window GQA attention, over a sequence or a chunk plus its rolling KV cache:
// for each query, scores over the keys in its window, a max-subtracted softmax, then the
// weighted sum of values. In bf16 (attention_in_bf16) attention() and its backward multiply
// copies of their operands rounded to bf16, and round the softmax weights (and the backward's
// dS) before their products, as engine/compute/backend.h states.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/cpu_math.h"

namespace tmx {

namespace {

// One query's attention output: softmax over its keys of q . k * scale, max-subtracted, then
// the weighted sum of values. key(j) and value(j) give the j-th of n_keys rows; scores has
// room for n_keys. With bf16_weights, the weights exp(s - max) are rounded to bf16 and the sum
// divided by their unrounded total afterwards, as a tensor core's P V product does.
template <class KeyAt, class ValueAt>
void attend(const float* q, int64_t hd, float scale, int64_t n_keys, KeyAt key, ValueAt value,
            bool bf16_weights, float* scores, float* out) {
    float max_score = -INFINITY;
    for (int64_t j = 0; j < n_keys; ++j) {
        const float* kj = key(j);
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int64_t c = 0; c < hd; ++c) s += q[c] * kj[c];
        s *= scale;
        scores[j] = s;
        max_score = std::max(max_score, s);
    }
    float denom = 0.0f;
    for (int64_t j = 0; j < n_keys; ++j) {
        const float e = std::exp(scores[j] - max_score);
        scores[j] = e;
        denom += e;
    }
    for (int64_t c = 0; c < hd; ++c) out[c] = 0.0f;
    if (bf16_weights) {
        for (int64_t j = 0; j < n_keys; ++j) {
            const float w = round_to_bf16(scores[j]);
            const float* vj = value(j);
#pragma omp simd
            for (int64_t c = 0; c < hd; ++c) out[c] += w * vj[c];
        }
        for (int64_t c = 0; c < hd; ++c) out[c] /= denom;
        return;
    }
    for (int64_t j = 0; j < n_keys; ++j) {
        const float p = scores[j] / denom;
        const float* vj = value(j);
#pragma omp simd
        for (int64_t c = 0; c < hd; ++c) out[c] += p * vj[c];
    }
}

// Threads pay off above ~1e5 multiply-adds; a decode step's attention is often below, and
// waking threads for it costs more than it saves.
bool worth_threads(int64_t multiply_adds) {
    return multiply_adds >= (1 << 17);
}

}  // namespace

void CpuBackend::attention_impl(const Tensor& q, const Tensor& k, const Tensor& v,
                                const Tensor& out, int64_t window) {
    const int64_t B = q.dim(0), T = q.dim(1), H = q.dim(2), hd = q.dim(3), Hkv = k.dim(2);
    const int64_t group = H / Hkv;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    const bool bf16 = attention_in_bf16(matmul_precision(), hd);
    const Precision products = bf16 ? Precision::BF16 : Precision::F32;
    std::vector<float> q_rounded, k_rounded, v_rounded;
    const float* qp = cpu_operand(products, q, q_rounded);
    const float* kp = cpu_operand(products, k, k_rounded);
    const float* vp = cpu_operand(products, v, v_rounded);
    CpuOutput result(out);
    float* op = result.data();
    const int64_t span = window > 0 ? std::min(window, T) : T;

#pragma omp parallel if (worth_threads(B * H * T * span * hd))
    {
        std::vector<float> scores(static_cast<size_t>(span));
#pragma omp for collapse(2) schedule(dynamic, 16)
        for (int64_t bh = 0; bh < B * H; ++bh) {
            for (int64_t i = 0; i < T; ++i) {
                const int64_t b = bh / H, h = bh % H, kvh = h / group;
                const int64_t j0 = window > 0 ? std::max<int64_t>(0, i - window + 1) : 0;
                auto row = [&](const float* base, int64_t j) {
                    return base + ((b * T + j0 + j) * Hkv + kvh) * hd;
                };
                attend(
                    qp + ((b * T + i) * H + h) * hd, hd, scale, i - j0 + 1,
                    [&](int64_t j) { return row(kp, j); }, [&](int64_t j) { return row(vp, j); },
                    bf16, scores.data(), op + ((b * T + i) * H + h) * hd);
            }
        }
    }
    result.store();
}

void CpuBackend::attention_cached_impl(const Tensor& q, const Tensor& k, const Tensor& v,
                                       const Tensor& k_cache, const Tensor& v_cache,
                                       const Tensor& start, const Tensor& out, int64_t window) {
    const int64_t B = q.dim(0), T = q.dim(1), H = q.dim(2), hd = q.dim(3), Hkv = k.dim(2);
    const int64_t S = k_cache.dim(1), group = H / Hkv;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    const float* qp = data<float>(q);
    const float* kp = data<float>(k);
    const float* vp = data<float>(v);
    const float* kcp = data<float>(k_cache);
    const float* vcp = data<float>(v_cache);
    const int32_t* startp = data<int32_t>(start);
    float* op = data<float>(out);
    const int64_t span = std::min(window > 0 ? window : S + T, S + T);

#pragma omp parallel if (worth_threads(B * H * T * span * hd))
    {
        std::vector<float> scores(static_cast<size_t>(S + T));
#pragma omp for collapse(2) schedule(dynamic, 4)
        for (int64_t bh = 0; bh < B * H; ++bh) {
            for (int64_t i = 0; i < T; ++i) {
                const int64_t b = bh / H, h = bh % H, kvh = h / group;
                const int64_t p0 = startp[b], p = p0 + i;
                // Keys in the window, oldest first: cached positions [first, p0), then the
                // chunk's positions [max(first, p0), p].
                int64_t first = std::max<int64_t>(0, p0 - S);
                if (window > 0) first = std::max(first, p - window + 1);
                const int64_t n_cached = std::max<int64_t>(0, p0 - first);
                const int64_t chunk_first = std::max(first, p0) - p0;
                auto row = [&](const float* chunk, const float* cache, int64_t j) {
                    if (j < n_cached) return cache + ((b * S + (first + j) % S) * Hkv + kvh) * hd;
                    return chunk + ((b * T + chunk_first + j - n_cached) * Hkv + kvh) * hd;
                };
                attend(
                    qp + ((b * T + i) * H + h) * hd, hd, scale, n_cached + i - chunk_first + 1,
                    [&](int64_t j) { return row(kp, kcp, j); },
                    [&](int64_t j) { return row(vp, vcp, j); }, false, scores.data(),
                    op + ((b * T + i) * H + h) * hd);
            }
        }
    }
}

void CpuBackend::kv_cache_write_impl(const Tensor& k, const Tensor& v, const Tensor& k_cache,
                                     const Tensor& v_cache, const Tensor& start) {
    const int64_t B = k.dim(0), T = k.dim(1), S = k_cache.dim(1);
    const int64_t row = k.dim(2) * k.dim(3);  // floats per position
    const int32_t* startp = data<int32_t>(start);
    for (int64_t b = 0; b < B; ++b)
        for (int64_t t = std::max<int64_t>(0, T - S); t < T; ++t) {
            const int64_t slot = (startp[b] + t) % S;
            const size_t bytes = static_cast<size_t>(row) * sizeof(float);
            std::memcpy(data<float>(k_cache) + (b * S + slot) * row,
                        data<float>(k) + (b * T + t) * row, bytes);
            std::memcpy(data<float>(v_cache) + (b * S + slot) * row,
                        data<float>(v) + (b * T + t) * row, bytes);
        }
}

namespace {

// Queries per block of the backward pass. Each block's keys span the block plus the window
// before its first query, so the masked share of a block's score tile grows with the block;
// smaller blocks make smaller, less efficient GEMMs (16 and 64 timed the same as 32 on the demo
// config: head_dim 32, window 128).
constexpr int64_t kBackwardQueryBlock = 32;

// Row-major C[M, N] = alpha op(A) op(B) + beta C with explicit leading dimensions, for blocks
// of rows inside a [B, T, heads, hd] tensor. Called from inside the backward's parallel region,
// where OpenBLAS's OpenMP build runs single-threaded.
void gemm_ld(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
             const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
             int64_t ldc) {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(M), static_cast<int>(N),
                static_cast<int>(K), alpha, A, static_cast<int>(lda), B, static_cast<int>(ldb),
                beta, C, static_cast<int>(ldc));
}

}  // namespace

// Per (sequence, kv head), per query head of its group, per block of kBackwardQueryBlock
// queries: the block's scores against every key any of its queries sees are one small GEMM, and
// so are the four products of the backward pass:
//   P = softmax(Q K^T * scale) (masked), dP = dO V^T, dS = P * (dP - rowsum(P * dP)) * scale,
//   dQ += dS K,  dK += dS^T Q,  dV += P^T dO.
// Masked entries of P are exactly 0, so they add nothing to dS, dK or dV. One task per
// (sequence, kv head) keeps every write to d_k / d_v of that head in one thread: no atomics.
// In bf16, Q, K, V and dO are rounded copies, P and dS (without the scale) are rounded after
// rowsum(P * dP) is taken, and the scale goes into the dQ and dK GEMMs' alpha.
void CpuBackend::attention_backward_impl(const Tensor& q, const Tensor& k, const Tensor& v,
                                         const Tensor& d_out, const Tensor& d_q, const Tensor& d_k,
                                         const Tensor& d_v, int64_t window) {
    const int64_t B = q.dim(0), T = q.dim(1), H = q.dim(2), hd = q.dim(3), Hkv = k.dim(2);
    const int64_t group = H / Hkv;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    const bool bf16 = attention_in_bf16(matmul_precision(), hd);
    const Precision products = bf16 ? Precision::BF16 : Precision::F32;
    // The scale of dS: inside it in fp32, in the GEMMs' alpha in bf16 (the contract rounds dS
    // unscaled).
    const float ds_scale = bf16 ? 1.0f : scale, grad_alpha = bf16 ? scale : 1.0f;
    std::vector<float> q_rounded, k_rounded, v_rounded, dout_rounded;
    const float* qp = cpu_operand(products, q, q_rounded);
    const float* kp = cpu_operand(products, k, k_rounded);
    const float* vp = cpu_operand(products, v, v_rounded);
    const float* dop = cpu_operand(products, d_out, dout_rounded);
    float* dqp = data<float>(d_q);
    float* dkp = data<float>(d_k);
    float* dvp = data<float>(d_v);
    const int64_t BQ = std::min(kBackwardQueryBlock, T);
    // Most keys a block sees: its own queries plus the window before the first.
    const int64_t max_keys = window > 0 ? std::min(T, window + BQ - 1) : T;
    const int64_t ldq = H * hd, ldk = Hkv * hd;  // row strides of q / d_out and of k / v
#pragma omp parallel
    {
        // P and dP (then dS) of one block, rows of n_keys.
        std::vector<float> probs(static_cast<size_t>(BQ * max_keys));
        std::vector<float> dprobs(static_cast<size_t>(BQ * max_keys));
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < B * Hkv; ++task) {
            const int64_t b = task / Hkv, kvh = task % Hkv;
            for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
                for (int64_t i0 = 0; i0 < T; i0 += BQ) {
                    const int64_t rows = std::min(BQ, T - i0);
                    const int64_t key0 = window > 0 ? std::max<int64_t>(0, i0 - window + 1) : 0;
                    const int64_t n_keys = i0 + rows - key0;
                    const float* qb = qp + ((b * T + i0) * H + h) * hd;
                    const float* dob = dop + ((b * T + i0) * H + h) * hd;
                    float* dqb = dqp + ((b * T + i0) * H + h) * hd;
                    const float* kb = kp + ((b * T + key0) * Hkv + kvh) * hd;
                    const float* vb = vp + ((b * T + key0) * Hkv + kvh) * hd;
                    float* dkb = dkp + ((b * T + key0) * Hkv + kvh) * hd;
                    float* dvb = dvp + ((b * T + key0) * Hkv + kvh) * hd;
                    float* P = probs.data();
                    float* dS = dprobs.data();

                    gemm_ld(false, true, rows, n_keys, hd, 1.0f, qb, ldq, kb, ldk, 0.0f, P, n_keys);
                    gemm_ld(false, true, rows, n_keys, hd, 1.0f, dob, ldq, vb, ldk, 0.0f, dS,
                            n_keys);
                    for (int64_t r = 0; r < rows; ++r) {
                        const int64_t i = i0 + r;
                        // This query's keys, as columns of the block: [lo, hi].
                        const int64_t lo =
                            (window > 0 ? std::max<int64_t>(0, i - window + 1) : 0) - key0;
                        const int64_t hi = i - key0;
                        float* p = P + r * n_keys;
                        float* ds = dS + r * n_keys;
                        float max_score = -INFINITY;
#pragma omp simd reduction(max : max_score)
                        for (int64_t j = lo; j <= hi; ++j) max_score = std::max(max_score, p[j]);
                        max_score *= scale;
                        float denom = 0.0f;
#pragma omp simd reduction(+ : denom)
                        for (int64_t j = lo; j <= hi; ++j) {
                            p[j] = cpu::exp_fast(p[j] * scale - max_score);
                            denom += p[j];
                        }
                        const float inv = 1.0f / denom;
                        float dot_pdp = 0.0f;
#pragma omp simd reduction(+ : dot_pdp)
                        for (int64_t j = lo; j <= hi; ++j) {
                            p[j] *= inv;
                            dot_pdp += p[j] * ds[j];
                        }
                        for (int64_t j = 0; j < lo; ++j) p[j] = ds[j] = 0.0f;
#pragma omp simd
                        for (int64_t j = lo; j <= hi; ++j)
                            ds[j] = p[j] * (ds[j] - dot_pdp) * ds_scale;
                        if (bf16)
                            for (int64_t j = lo; j <= hi; ++j) {
                                p[j] = round_to_bf16(p[j]);
                                ds[j] = round_to_bf16(ds[j]);
                            }
                        for (int64_t j = hi + 1; j < n_keys; ++j) p[j] = ds[j] = 0.0f;
                    }
                    gemm_ld(false, false, rows, hd, n_keys, grad_alpha, dS, n_keys, kb, ldk, 1.0f,
                            dqb, ldq);
                    gemm_ld(true, false, n_keys, hd, rows, grad_alpha, dS, n_keys, qb, ldq, 1.0f,
                            dkb, ldk);
                    gemm_ld(true, false, n_keys, hd, rows, 1.0f, P, n_keys, dob, ldq, 1.0f, dvb,
                            ldk);
                }
            }
        }
    }
}

}  // namespace tmx

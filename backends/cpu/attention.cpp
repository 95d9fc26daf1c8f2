// CPU causal sliding-window GQA attention: for each query, scores over the keys in its window,
// a max-subtracted softmax, then the weighted sum of values.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backends/cpu/cpu_backend.h"

namespace tmx {

void CpuBackend::attention_impl(const Tensor& q, const Tensor& k, const Tensor& v,
                                const Tensor& out, int64_t window) {
    const int64_t B = q.dim(0), T = q.dim(1), H = q.dim(2), hd = q.dim(3), Hkv = k.dim(2);
    const int64_t group = H / Hkv;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    const float* qp = data<float>(q);
    const float* kp = data<float>(k);
    const float* vp = data<float>(v);
    float* op = data<float>(out);
    const int64_t span = window > 0 ? std::min(window, T) : T;

#pragma omp parallel
    {
        std::vector<float> scores(static_cast<size_t>(span));
#pragma omp for collapse(2) schedule(dynamic, 16)
        for (int64_t bh = 0; bh < B * H; ++bh) {
            for (int64_t i = 0; i < T; ++i) {
                const int64_t b = bh / H, h = bh % H, kvh = h / group;
                const float* qi = qp + ((b * T + i) * H + h) * hd;
                const int64_t j0 = window > 0 ? std::max<int64_t>(0, i - window + 1) : 0;
                float max_score = -INFINITY;
                for (int64_t j = j0; j <= i; ++j) {
                    const float* kj = kp + ((b * T + j) * Hkv + kvh) * hd;
                    float s = 0.0f;
#pragma omp simd reduction(+ : s)
                    for (int64_t c = 0; c < hd; ++c) s += qi[c] * kj[c];
                    s *= scale;
                    scores[j - j0] = s;
                    max_score = std::max(max_score, s);
                }
                float denom = 0.0f;
                for (int64_t j = j0; j <= i; ++j) {
                    float e = std::exp(scores[j - j0] - max_score);
                    scores[j - j0] = e;
                    denom += e;
                }
                float* oi = op + ((b * T + i) * H + h) * hd;
                for (int64_t c = 0; c < hd; ++c) oi[c] = 0.0f;
                for (int64_t j = j0; j <= i; ++j) {
                    const float p = scores[j - j0] / denom;
                    const float* vj = vp + ((b * T + j) * Hkv + kvh) * hd;
#pragma omp simd
                    for (int64_t c = 0; c < hd; ++c) oi[c] += p * vj[c];
                }
            }
        }
    }
}

void CpuBackend::attention_backward_impl(const Tensor& q, const Tensor& k, const Tensor& v,
                                         const Tensor& d_out, const Tensor& d_q,
                                         const Tensor& d_k, const Tensor& d_v, int64_t window) {
    const int64_t B = q.dim(0), T = q.dim(1), H = q.dim(2), hd = q.dim(3), Hkv = k.dim(2);
    const int64_t group = H / Hkv;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    const float* qp = data<float>(q);
    const float* kp = data<float>(k);
    const float* vp = data<float>(v);
    const float* dop = data<float>(d_out);
    float* dqp = data<float>(d_q);
    float* dkp = data<float>(d_k);
    float* dvp = data<float>(d_v);
    const int64_t span = window > 0 ? std::min(window, T) : T;
    // One task per (sequence, kv head): every write to d_k / d_v of that head stays in it.
#pragma omp parallel
    {
        std::vector<float> probs(static_cast<size_t>(span)), dprobs(static_cast<size_t>(span));
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < B * Hkv; ++task) {
            const int64_t b = task / Hkv, kvh = task % Hkv;
            for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
                for (int64_t i = 0; i < T; ++i) {
                    const float* qi = qp + ((b * T + i) * H + h) * hd;
                    const float* doi = dop + ((b * T + i) * H + h) * hd;
                    const int64_t j0 = window > 0 ? std::max<int64_t>(0, i - window + 1) : 0;
                    float max_score = -INFINITY;
                    for (int64_t j = j0; j <= i; ++j) {
                        const float* kj = kp + ((b * T + j) * Hkv + kvh) * hd;
                        float s = 0.0f;
#pragma omp simd reduction(+ : s)
                        for (int64_t c = 0; c < hd; ++c) s += qi[c] * kj[c];
                        probs[j - j0] = s * scale;
                        max_score = std::max(max_score, s * scale);
                    }
                    float denom = 0.0f;
                    for (int64_t j = j0; j <= i; ++j) {
                        probs[j - j0] = std::exp(probs[j - j0] - max_score);
                        denom += probs[j - j0];
                    }
                    float dot_pdp = 0.0f;
                    for (int64_t j = j0; j <= i; ++j) {
                        probs[j - j0] /= denom;
                        const float* vj = vp + ((b * T + j) * Hkv + kvh) * hd;
                        float dp = 0.0f;
#pragma omp simd reduction(+ : dp)
                        for (int64_t c = 0; c < hd; ++c) dp += doi[c] * vj[c];
                        dprobs[j - j0] = dp;
                        dot_pdp += probs[j - j0] * dp;
                    }
                    float* dqi = dqp + ((b * T + i) * H + h) * hd;
                    for (int64_t j = j0; j <= i; ++j) {
                        const float p = probs[j - j0];
                        const float ds = p * (dprobs[j - j0] - dot_pdp) * scale;
                        const float* kj = kp + ((b * T + j) * Hkv + kvh) * hd;
                        float* dkj = dkp + ((b * T + j) * Hkv + kvh) * hd;
                        float* dvj = dvp + ((b * T + j) * Hkv + kvh) * hd;
#pragma omp simd
                        for (int64_t c = 0; c < hd; ++c) {
                            dqi[c] += ds * kj[c];
                            dkj[c] += ds * qi[c];
                            dvj[c] += p * doi[c];
                        }
                    }
                }
            }
        }
    }
}

}  // namespace tmx

// CPU mixture-of-experts ops: router top-k with softmax gates, grouping slots by expert
// (count, prefix sum, stable scatter), gathering rows (which is also the token embedding),
// combining expert outputs, and the load-balancing loss.
#include <cmath>
#include <cstring>
#include <vector>

#include "backends/cpu/cpu_backend.h"

namespace tmx {

void CpuBackend::router_topk_impl(const Tensor& logits, const Tensor& indices,
                                  const Tensor& gates) {
    const int64_t N = logits.dim(0), E = logits.dim(1), k = indices.dim(1);
    const float* r = data<float>(logits);
    int32_t* idx = data<int32_t>(indices);
    float* g = data<float>(gates);
#pragma omp parallel for schedule(static) if (N > 256)
    for (int64_t n = 0; n < N; ++n) {
        const float* row = r + n * E;
        int32_t* top = idx + n * k;
        // Selection: the j-th pick is the largest logit not yet taken; scanning in ascending
        // index with a strict comparison makes ties go to the lower index.
        for (int64_t j = 0; j < k; ++j) {
            int32_t best = -1;
            for (int64_t e = 0; e < E; ++e) {
                bool taken = false;
                for (int64_t t = 0; t < j; ++t) taken |= top[t] == e;
                if (taken) continue;
                if (best < 0 || row[e] > row[best]) best = static_cast<int32_t>(e);
            }
            top[j] = best;
        }
        const float max_logit = row[top[0]];
        float sum = 0.0f;
        for (int64_t j = 0; j < k; ++j) {
            g[n * k + j] = std::exp(row[top[j]] - max_logit);
            sum += g[n * k + j];
        }
        for (int64_t j = 0; j < k; ++j) g[n * k + j] /= sum;
    }
}

void CpuBackend::moe_group_impl(const Tensor& indices, int64_t n_experts, const Tensor& offsets,
                                const Tensor& slot_rows, const Tensor& slot_of) {
    const int64_t S = indices.numel(), k = indices.dim(1);
    const int32_t* idx = data<int32_t>(indices);
    int32_t* off = data<int32_t>(offsets);
    int32_t* rows = data<int32_t>(slot_rows);
    int32_t* of = data<int32_t>(slot_of);
    std::vector<int32_t> cursor(static_cast<size_t>(n_experts) + 1, 0);
    for (int64_t s = 0; s < S; ++s) {
        if (idx[s] < 0 || idx[s] >= n_experts)
            throw std::out_of_range("moe_group: expert index " + std::to_string(idx[s]) +
                                    " outside [0, " + std::to_string(n_experts) + ")");
        ++cursor[idx[s] + 1];
    }
    for (int64_t e = 0; e < n_experts; ++e) cursor[e + 1] += cursor[e];
    std::memcpy(off, cursor.data(), cursor.size() * sizeof(int32_t));
    for (int64_t s = 0; s < S; ++s) {  // in slot order, so each expert's rows stay sorted
        int32_t pos = cursor[idx[s]]++;
        rows[pos] = static_cast<int32_t>(s / k);
        of[s] = pos;
    }
}

void CpuBackend::gather_rows_impl(const Tensor& x, const Tensor& rows, const Tensor& out) {
    const int64_t S = rows.dim(0), N = x.dim(0), d = x.dim(1);
    const int64_t row_bytes = dtype_bytes(x.dtype(), d);
    // F32 or BF16 rows into rows of their own dtype move as they are; a weight stored in another
    // format (an embedding table) is decoded into F32.
    const bool same_dtype = out.dtype() == x.dtype();
    const std::byte* in = data<std::byte>(x);
    const int32_t* r = data<int32_t>(rows);
    for (int64_t s = 0; s < S; ++s) {
        if (r[s] < 0 || r[s] >= N)
            throw std::out_of_range("gather_rows: row " + std::to_string(r[s]) + " outside [0, " +
                                    std::to_string(N) + ")");
        const std::byte* row = in + r[s] * row_bytes;
        if (same_dtype)
            std::memcpy(data<std::byte>(out) + s * row_bytes, row, static_cast<size_t>(row_bytes));
        else
            decode_weights(x.dtype(), row, d, data<float>(out) + s * d);
    }
}

void CpuBackend::moe_combine_impl(const Tensor& expert_out, const Tensor& slot_of,
                                  const Tensor& gates, const Tensor& out) {
    const int64_t N = gates.dim(0), k = gates.dim(1), d = out.dim(1);
    const float* y = data<float>(expert_out);
    const int32_t* of = data<int32_t>(slot_of);
    const float* g = data<float>(gates);
    float* o = data<float>(out);
#pragma omp parallel for schedule(static) if (N * d > (1 << 15))
    for (int64_t n = 0; n < N; ++n) {
        float* dst = o + n * d;
        for (int64_t j = 0; j < k; ++j) {
            const float gate = g[n * k + j];
            const float* src = y + static_cast<int64_t>(of[n * k + j]) * d;
#pragma omp simd
            for (int64_t c = 0; c < d; ++c) dst[c] += gate * src[c];
        }
    }
}

void CpuBackend::router_aux_loss_impl(const Tensor& logits, const Tensor& indices,
                                      const Tensor& out) {
    const int64_t N = logits.dim(0), E = logits.dim(1), k = indices.dim(1);
    const float* r = data<float>(logits);
    const int32_t* idx = data<int32_t>(indices);
    std::vector<double> prob_sum(static_cast<size_t>(E), 0.0), count(static_cast<size_t>(E), 0.0);
    for (int64_t n = 0; n < N; ++n) {
        const float* row = r + n * E;
        float m = row[0];
        for (int64_t e = 1; e < E; ++e) m = std::max(m, row[e]);
        double z = 0.0;
        for (int64_t e = 0; e < E; ++e) z += std::exp(static_cast<double>(row[e] - m));
        for (int64_t e = 0; e < E; ++e)
            prob_sum[e] += std::exp(static_cast<double>(row[e] - m)) / z;
        for (int64_t j = 0; j < k; ++j) count[idx[n * k + j]] += 1.0;
    }
    double aux = 0.0;
    for (int64_t e = 0; e < E; ++e) aux += (count[e] / N) * (prob_sum[e] / N);
    *data<float>(out) = static_cast<float>(static_cast<double>(E) * aux);
}

void CpuBackend::router_backward_impl(const Tensor& logits, const Tensor& indices,
                                      const Tensor& gates, const Tensor& d_gates, float aux_weight,
                                      const Tensor& d_logits) {
    const int64_t N = logits.dim(0), E = logits.dim(1), k = indices.dim(1);
    const float* r = data<float>(logits);
    const int32_t* idx = data<int32_t>(indices);
    const float* g = data<float>(gates);
    const float* dg = data<float>(d_gates);
    float* dr = data<float>(d_logits);
    // The aux loss is aux_weight * E * sum_e f_e * P_e; f is a constant, so
    // d aux / d p[n, e] = aux_weight * E * f_e / N for every token n.
    std::vector<double> dprob(static_cast<size_t>(E), 0.0);
    if (aux_weight != 0.0f) {
        for (int64_t s = 0; s < N * k; ++s) dprob[idx[s]] += 1.0;
        for (auto& x : dprob) x = aux_weight * static_cast<double>(E) * (x / N) / N;
    }
#pragma omp parallel for schedule(static) if (N * E > (1 << 14))
    for (int64_t n = 0; n < N; ++n) {
        float* drow = dr + n * E;
        // Gate softmax over the selected logits: d r_j = g_j (dg_j - sum_l g_l dg_l).
        double s = 0.0;
        for (int64_t j = 0; j < k; ++j) s += static_cast<double>(g[n * k + j]) * dg[n * k + j];
        for (int64_t j = 0; j < k; ++j)
            drow[idx[n * k + j]] += static_cast<float>(g[n * k + j] * (dg[n * k + j] - s));
        if (aux_weight == 0.0f) continue;
        // Full softmax p of the row: d r = p * (dprob - <p, dprob>).
        const float* row = r + n * E;
        float m = row[0];
        for (int64_t e = 1; e < E; ++e) m = std::max(m, row[e]);
        double z = 0.0;
        for (int64_t e = 0; e < E; ++e) z += std::exp(static_cast<double>(row[e] - m));
        double dot = 0.0;
        for (int64_t e = 0; e < E; ++e)
            dot += std::exp(static_cast<double>(row[e] - m)) / z * dprob[e];
        for (int64_t e = 0; e < E; ++e) {
            const double p = std::exp(static_cast<double>(row[e] - m)) / z;
            drow[e] += static_cast<float>(p * (dprob[e] - dot));
        }
    }
}

void CpuBackend::gather_rows_backward_impl(const Tensor& rows, const Tensor& d_out,
                                           const Tensor& d_x) {
    const int64_t S = rows.dim(0), d = d_x.dim(1);
    const int32_t* r = data<int32_t>(rows);
    const float* src = data<float>(d_out);
    float* dst = data<float>(d_x);
    for (int64_t s = 0; s < S; ++s) {  // serial: several slots (tokens) may add into one row
        float* row = dst + static_cast<int64_t>(r[s]) * d;
#pragma omp simd
        for (int64_t c = 0; c < d; ++c) row[c] += src[s * d + c];
    }
}

void CpuBackend::moe_combine_backward_impl(const Tensor& expert_out, const Tensor& slot_of,
                                           const Tensor& gates, const Tensor& d_out,
                                           const Tensor& d_expert_out, const Tensor& d_gates) {
    const int64_t N = gates.dim(0), k = gates.dim(1), d = d_out.dim(1);
    const float* y = data<float>(expert_out);
    const int32_t* of = data<int32_t>(slot_of);
    const float* g = data<float>(gates);
    const float* dy = data<float>(d_out);
    float* dye = data<float>(d_expert_out);
    float* dg = data<float>(d_gates);
    // Each slot belongs to exactly one (token, choice), so rows never collide.
#pragma omp parallel for schedule(static) if (N * d > (1 << 15))
    for (int64_t n = 0; n < N; ++n) {
        const float* grad = dy + n * d;
        for (int64_t j = 0; j < k; ++j) {
            const int64_t slot = of[n * k + j];
            const float* ys = y + slot * d;
            float* dys = dye + slot * d;
            const float gate = g[n * k + j];
            float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int64_t c = 0; c < d; ++c) {
                dys[c] += gate * grad[c];
                dot += grad[c] * ys[c];
            }
            dg[n * k + j] += dot;
        }
    }
}

}  // namespace tmx

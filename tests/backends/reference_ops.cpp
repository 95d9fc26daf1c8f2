// Reference ops in double precision: one plain loop nest per formula of engine/compute/backend.h.
#include "tests/backends/reference_ops.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

namespace tmx::ref {
namespace {

// log(sum_i exp(v_i)), shifted by the maximum so that no exp overflows.
double logsumexp(const Vec& v) {
    double m = *std::max_element(v.begin(), v.end());
    double s = 0.0;
    for (double x : v) s += std::exp(x - m);
    return m + std::log(s);
}

Vec softmax(const Vec& v) {
    double lse = logsumexp(v);
    Vec p(v.size());
    for (size_t i = 0; i < v.size(); ++i) p[i] = std::exp(v[i] - lse);
    return p;
}

}  // namespace

Vec to_double(const std::vector<float>& v) {
    return Vec(v.begin(), v.end());
}

Vec layernorm(const Vec& x, int64_t N, int64_t d, const Vec& weight, const Vec& bias, double eps) {
    Vec out(N * d);
    for (int64_t n = 0; n < N; ++n) {
        const double* row = &x[n * d];
        double mean = 0.0;
        for (int64_t i = 0; i < d; ++i) mean += row[i];
        mean /= d;
        double var = 0.0;
        for (int64_t i = 0; i < d; ++i) var += (row[i] - mean) * (row[i] - mean);
        var /= d;
        for (int64_t i = 0; i < d; ++i)
            out[n * d + i] = (row[i] - mean) / std::sqrt(var + eps) * weight[i] + bias[i];
    }
    return out;
}

Vec rmsnorm(const Vec& x, int64_t N, int64_t d, const Vec& weight, double eps) {
    Vec out(N * d);
    for (int64_t n = 0; n < N; ++n) {
        const double* row = &x[n * d];
        double ms = 0.0;
        for (int64_t i = 0; i < d; ++i) ms += row[i] * row[i];
        ms /= d;
        for (int64_t i = 0; i < d; ++i) out[n * d + i] = row[i] / std::sqrt(ms + eps) * weight[i];
    }
    return out;
}

Vec matmul(const Vec& a, const Vec& b, int64_t M, int64_t N, int64_t K, bool trans_a, bool trans_b,
           const Vec* bias, const Vec* init) {
    // Element accessors for op(a) [M, K] and op(b) [K, N].
    auto A = [&](int64_t m, int64_t kk) { return trans_a ? a[kk * M + m] : a[m * K + kk]; };
    auto Bm = [&](int64_t kk, int64_t n) { return trans_b ? b[n * K + kk] : b[kk * N + n]; };
    Vec out(M * N);
    for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
            double s = 0.0;
            for (int64_t kk = 0; kk < K; ++kk) s += A(m, kk) * Bm(kk, n);
            if (bias) s += (*bias)[n];
            if (init) s += (*init)[m * N + n];
            out[m * N + n] = s;
        }
    return out;
}

Vec rope(const Vec& x, int64_t N, int64_t H, int64_t hd, const Ids& positions, double theta) {
    Vec out = x;
    const int64_t half = hd / 2;
    for (int64_t n = 0; n < N; ++n)
        for (int64_t h = 0; h < H; ++h)
            for (int64_t i = 0; i < half; ++i) {
                double angle = positions[n] * std::pow(theta, -2.0 * i / hd);
                double c = std::cos(angle), s = std::sin(angle);
                int64_t lo = (n * H + h) * hd + i, hi = lo + half;
                // (x_lo, x_hi) -> (x_lo cos - x_hi sin, x_hi cos + x_lo sin)
                out[lo] = x[lo] * c - x[hi] * s;
                out[hi] = x[hi] * c + x[lo] * s;
            }
    return out;
}

namespace {

// Causal sliding-window GQA attention's queries, one at a time, as engine/compute/backend.h defines
// them: f(row) for each query with its keys and their softmax weights before normalisation.
struct AttentionRow {
    int64_t q = 0;            // offset of the query's row in q, out [B, T, H, hd]
    std::vector<int64_t> kv;  // offsets of its keys' rows in k, v [B, T, Hkv, hd]
    Vec e;                    // exp(s_j - max s) for s_j = q . k_j / sqrt(hd)
    double l = 0.0;           // sum of e
};

template <class F>
void for_each_attention_row(const Vec& q, const Vec& k, int64_t B, int64_t T, int64_t H,
                            int64_t Hkv, int64_t hd, int64_t window, F f) {
    const int64_t group = H / Hkv;
    AttentionRow row;
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h)
            for (int64_t i = 0; i < T; ++i) {
                row.q = ((b * T + i) * H + h) * hd;
                row.kv.clear();
                // Keys j with j <= i and (window == 0 or i - window < j).
                for (int64_t j = 0; j <= i; ++j)
                    if (window == 0 || i - window < j)
                        row.kv.push_back(((b * T + j) * Hkv + h / group) * hd);
                Vec scores;
                for (int64_t kv : row.kv) {
                    double s = 0.0;
                    for (int64_t c = 0; c < hd; ++c) s += q[row.q + c] * k[kv + c];
                    scores.push_back(s / std::sqrt(static_cast<double>(hd)));
                }
                const double m = *std::max_element(scores.begin(), scores.end());
                row.e.clear();
                row.l = 0.0;
                for (double s : scores) {
                    row.e.push_back(std::exp(s - m));
                    row.l += row.e.back();
                }
                f(row);
            }
}

// A product's operand as the precision has it: rounded to bf16 (through fp32, the backends'
// type) where attention runs in bf16.
double rounded_if(bool bf16, double x) {
    return bf16 ? round_to_bf16(static_cast<float>(x)) : x;
}

Vec rounded_if(bool bf16, const Vec& v) {
    Vec r(v.size());
    for (size_t i = 0; i < v.size(); ++i) r[i] = rounded_if(bf16, v[i]);
    return r;
}

}  // namespace

Vec attention(const Vec& q_in, const Vec& k_in, const Vec& v_in, int64_t B, int64_t T, int64_t H,
              int64_t Hkv, int64_t hd, int64_t window, Precision precision) {
    const bool bf16 = attention_in_bf16(precision, hd);
    const Vec q = rounded_if(bf16, q_in), k = rounded_if(bf16, k_in), v = rounded_if(bf16, v_in);
    Vec out(B * T * H * hd, 0.0);
    for_each_attention_row(q, k, B, T, H, Hkv, hd, window, [&](const AttentionRow& r) {
        for (size_t t = 0; t < r.kv.size(); ++t)
            for (int64_t c = 0; c < hd; ++c)
                out[r.q + c] += rounded_if(bf16, r.e[t]) * v[r.kv[t] + c];
        for (int64_t c = 0; c < hd; ++c) out[r.q + c] /= r.l;
    });
    return out;
}

AttentionGrads attention_backward(const Vec& q_in, const Vec& k_in, const Vec& v_in,
                                  const Vec& d_out_in, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                                  int64_t hd, int64_t window, Precision precision) {
    const bool bf16 = attention_in_bf16(precision, hd);
    const Vec q = rounded_if(bf16, q_in), k = rounded_if(bf16, k_in), v = rounded_if(bf16, v_in),
              d_out = rounded_if(bf16, d_out_in);
    const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
    AttentionGrads g{Vec(q.size(), 0.0), Vec(k.size(), 0.0), Vec(v.size(), 0.0)};
    for_each_attention_row(q, k, B, T, H, Hkv, hd, window, [&](const AttentionRow& r) {
        const size_t n = r.kv.size();
        Vec p(n), dp(n);
        double D = 0.0;  // sum_j P_j dP_j
        for (size_t t = 0; t < n; ++t) {
            p[t] = r.e[t] / r.l;
            dp[t] = 0.0;
            for (int64_t c = 0; c < hd; ++c) dp[t] += d_out[r.q + c] * v[r.kv[t] + c];
            D += p[t] * dp[t];
        }
        for (size_t t = 0; t < n; ++t) {
            const double ds = rounded_if(bf16, p[t] * (dp[t] - D)), pr = rounded_if(bf16, p[t]);
            for (int64_t c = 0; c < hd; ++c) {
                g.d_q[r.q + c] += scale * ds * k[r.kv[t] + c];
                g.d_k[r.kv[t] + c] += scale * ds * q[r.q + c];
                g.d_v[r.kv[t] + c] += pr * d_out[r.q + c];
            }
        }
    });
    return g;
}

TopK router_topk(const Vec& logits, int64_t N, int64_t E, int64_t k) {
    TopK r{Ids(N * k), Vec(N * k)};
    for (int64_t n = 0; n < N; ++n) {
        std::vector<int32_t> order(E);
        std::iota(order.begin(), order.end(), 0);
        // A stable sort by descending logit keeps equal logits in ascending index order.
        std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t y) {
            return logits[n * E + x] > logits[n * E + y];
        });
        Vec chosen;
        for (int64_t j = 0; j < k; ++j) {
            r.indices[n * k + j] = order[j];
            chosen.push_back(logits[n * E + order[j]]);
        }
        Vec g = softmax(chosen);
        for (int64_t j = 0; j < k; ++j) r.gates[n * k + j] = g[j];
    }
    return r;
}

Grouping moe_group(const Ids& indices, int64_t N, int64_t k, int64_t n_experts) {
    const int64_t S = N * k;
    Grouping g{Ids(n_experts + 1, 0), Ids(), Ids(S, -1)};
    for (int64_t e = 0; e < n_experts; ++e) {
        g.offsets[e] = static_cast<int32_t>(g.slot_rows.size());
        for (int64_t s = 0; s < S; ++s)  // slots in their original order: a stable grouping
            if (indices[s] == e) {
                g.slot_of[s] = static_cast<int32_t>(g.slot_rows.size());
                g.slot_rows.push_back(static_cast<int32_t>(s / k));
            }
    }
    g.offsets[n_experts] = static_cast<int32_t>(g.slot_rows.size());
    return g;
}

Vec gather_rows(const Vec& x, int64_t N, int64_t d, const Ids& rows) {
    Vec out(rows.size() * d);
    for (size_t s = 0; s < rows.size(); ++s) {
        if (rows[s] < 0 || rows[s] >= N) throw std::out_of_range("ref::gather_rows: bad row");
        for (int64_t c = 0; c < d; ++c) out[s * d + c] = x[rows[s] * d + c];
    }
    return out;
}

Vec grouped_matmul(const Vec& x, int64_t S, int64_t K, const Vec& w, int64_t E, int64_t Nout,
                   const Vec* bias, const Ids& offsets) {
    Vec out(S * Nout, 0.0);
    for (int64_t e = 0; e < E; ++e)
        for (int64_t s = offsets[e]; s < offsets[e + 1]; ++s)
            for (int64_t o = 0; o < Nout; ++o) {
                double acc = bias ? (*bias)[e * Nout + o] : 0.0;
                for (int64_t c = 0; c < K; ++c) acc += x[s * K + c] * w[(e * Nout + o) * K + c];
                out[s * Nout + o] = acc;
            }
    return out;
}

Vec moe_combine(const Vec& expert_out, const Ids& slot_of, const Vec& gates, int64_t N, int64_t k,
                int64_t d, const Vec& init) {
    Vec out = init;
    for (int64_t n = 0; n < N; ++n)
        for (int64_t j = 0; j < k; ++j)
            for (int64_t c = 0; c < d; ++c)
                out[n * d + c] += gates[n * k + j] * expert_out[slot_of[n * k + j] * d + c];
    return out;
}

double gelu_tanh(double x) {
    const double pi = std::acos(-1.0);
    return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / pi) * (x + 0.044715 * x * x * x)));
}
double silu(double x) {
    return x / (1.0 + std::exp(-x));
}
double relu(double x) {
    return x > 0.0 ? x : 0.0;
}
double relu2(double x) {
    return relu(x) * relu(x);
}

Vec activation(Activation act, const Vec& x) {
    Vec out(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
        switch (act) {
            case Activation::Gelu:
                out[i] = gelu_tanh(x[i]);
                break;
            case Activation::Silu:
                out[i] = silu(x[i]);
                break;
            case Activation::Relu:
                out[i] = relu(x[i]);
                break;
            case Activation::Relu2:
                out[i] = relu2(x[i]);
                break;
        }
    }
    return out;
}

Vec swiglu(const Vec& gate, const Vec& up) {
    Vec out(gate.size());
    for (size_t i = 0; i < gate.size(); ++i) out[i] = silu(gate[i]) * up[i];
    return out;
}

Vec add(const Vec& a, const Vec& b) {
    Vec out(a.size());
    for (size_t i = 0; i < a.size(); ++i) out[i] = a[i] + b[i];
    return out;
}

Vec cross_entropy(const Vec& logits, int64_t N, int64_t V, const Ids& targets) {
    Vec out(N, 0.0);
    for (int64_t n = 0; n < N; ++n) {
        if (targets[n] == -1) continue;
        Vec row(logits.begin() + n * V, logits.begin() + (n + 1) * V);
        out[n] = logsumexp(row) - row[targets[n]];
    }
    return out;
}

double router_aux_loss(const Vec& logits, int64_t N, int64_t E, const Ids& indices, int64_t k) {
    double total = 0.0;
    for (int64_t e = 0; e < E; ++e) {
        double holds = 0.0, prob = 0.0;
        for (int64_t n = 0; n < N; ++n) {
            bool in_topk = false;
            for (int64_t j = 0; j < k; ++j) in_topk = in_topk || indices[n * k + j] == e;
            holds += in_topk ? 1.0 : 0.0;
            Vec row(logits.begin() + n * E, logits.begin() + (n + 1) * E);
            prob += softmax(row)[e];
        }
        total += (holds / N) * (prob / N);
    }
    return static_cast<double>(E) * total;
}

}  // namespace tmx::ref

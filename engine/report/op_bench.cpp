#include "engine/report/op_bench.h"

#include <algorithm>

#include "engine/core/errors.h"
#include "engine/core/rng.h"
#include "engine/model/kv_cache.h"
#include "engine/report/bench_util.h"

namespace tmx::bench_detail {
namespace {

// out = a b^T (a linear layer), M rows.
OpCase linear_case(const std::string& name, int64_t M, int64_t N, int64_t K, InputMaker& in) {
    OpCase c{name,
             dims({M, N, K}),
             2.0 * M * N * K,
             4.0 * (M * K + N * K + M * N),
             double(M * K + N * K),
             {}};
    auto a = in.normal(M * K), b = in.normal(N * K, 0.05);
    c.prepare = [=](Backend& be) {
        Tensor at = upload_operand(be, a, {M, K}), bt = upload_operand(be, b, {N, K});
        Tensor out = be.alloc({M, N});
        return OpCase::Prepared{[&be, at, bt, out] { be.linear(at, bt, Tensor{}, out); }, out};
    };
    return c;
}

// The expert FFN's first matmul over `tokens` tokens routed to random experts (a dense FFN's
// w1 for dense configs).
OpCase experts_case(const std::string& name, const ModelConfig& c, int64_t tokens, InputMaker& in) {
    if (!c.is_moe()) return linear_case(name, tokens, c.d_ff, c.d_model, in);
    const int64_t S = tokens * c.top_k, K = c.d_model, N = c.d_ff, E = c.n_experts;
    std::vector<int32_t> per_expert = in.ints(S, E);
    std::sort(per_expert.begin(), per_expert.end());
    std::vector<int32_t> offsets(static_cast<size_t>(E + 1), 0);
    for (int32_t e : per_expert) ++offsets[e + 1];
    for (int64_t e = 0; e < E; ++e) offsets[e + 1] += offsets[e];
    int64_t used = 0;
    for (int64_t e = 0; e < E; ++e) used += offsets[e + 1] > offsets[e];
    OpCase op{name,
              dims({S, N, K}) + " (" + std::to_string(E) + " experts)",
              2.0 * S * N * K,
              4.0 * (S * K + used * N * K + S * N),
              double(S * K + used * N * K),
              {}};
    auto x = in.normal(S * K), w = in.normal(E * N * K, 0.05), bias = in.normal(E * N, 0.1);
    op.prepare = [=, has_bias = c.ffn_bias](Backend& be) {
        Tensor xt = upload_operand(be, x, {S, K}), wt = upload_operand(be, w, {E, N, K});
        Tensor bt = has_bias ? upload(be, bias, {E, N}) : Tensor{};
        Tensor off = upload_ids(be, offsets, {E + 1}), out = be.alloc({S, N});
        return OpCase::Prepared{
            [&be, xt, wt, bt, off, out] { be.grouped_matmul(xt, wt, bt, off, out); }, out};
    };
    return op;
}

// out = a b, square and fp32 on every backend, whatever the other ops' precision: the GEMM
// peak that GPU fp32 figures quote.
OpCase square_gemm_case(int64_t n, InputMaker& in) {
    OpCase c{"gemm (fp32)", dims({n, n, n}), 2.0 * n * n * n, 4.0 * 3 * n * n, 0, {}};
    auto a = in.normal(n * n), b = in.normal(n * n);
    c.prepare = [=](Backend& be) {
        Tensor at = upload(be, a, {n, n}), bt = upload(be, b, {n, n}), out = be.alloc({n, n});
        return OpCase::Prepared{[&be, at, bt, out] {
                                    Backend::ModeScope fp32(be, {.precision = Precision::F32});
                                    be.matmul(at, bt, out);
                                },
                                out};
    };
    return c;
}

}  // namespace

std::vector<OpCase> op_cases(const ModelConfig& c, int64_t P, uint64_t seed, int64_t gemm) {
    InputMaker in(seed);
    const int64_t d = c.d_model, H = c.n_heads, Hkv = c.n_kv_heads, hd = c.head_dim;
    const int64_t W = kv_cache_slots(c);
    std::vector<OpCase> ops;

    {  // the residual stream's norm
        OpCase op{"norm (prefill)", dims({P, d}), 0, 8.0 * P * d, {}};
        auto x = in.normal(P * d), w = in.normal(d), b = in.normal(d);
        op.prepare = [=, type = c.norm_type, eps = float(c.norm_eps)](Backend& be) {
            Tensor xt = upload(be, x, {P, d}), wt = upload(be, w, {d}), out = be.alloc({P, d});
            Tensor bt = type == NormType::LayerNorm ? upload(be, b, {d}) : Tensor{};
            return OpCase::Prepared{
                [&be, type, eps, xt, wt, bt, out] { be.norm(type, xt, wt, bt, eps, out); }, out};
        };
        ops.push_back(op);
    }
    ops.push_back(linear_case("q_proj (prefill)", P, c.q_dim(), d, in));
    ops.push_back(linear_case("o_proj (decode)", 1, d, c.q_dim(), in));
    {  // RoPE on the queries
        OpCase op{"rope (prefill)", dims({P, H, hd}), 0, 8.0 * P * H * hd, {}};
        auto x = in.normal(P * H * hd);
        std::vector<int32_t> pos(static_cast<size_t>(P));
        for (int64_t i = 0; i < P; ++i) pos[i] = static_cast<int32_t>(i);
        op.prepare = [=, theta = c.rope_theta](Backend& be) {
            Tensor xt = upload(be, x, {P, H, hd}), pt = upload_ids(be, pos, {P});
            return OpCase::Prepared{[&be, xt, pt, theta] { be.rope(xt, pt, theta); }, xt};
        };
        ops.push_back(op);
    }
    {  // attention over the prompt, with the sliding-window mask
        double pairs = 0;
        for (int64_t i = 0; i < P; ++i) pairs += c.sliding_window > 0 ? std::min(i + 1, W) : i + 1;
        OpCase op{"attention (prefill)",
                  dims({P, H, hd}) + " window " + std::to_string(c.sliding_window),
                  4.0 * pairs * H * hd,
                  4.0 * (2 * P * H * hd + 2 * P * Hkv * hd),
                  {}};
        auto q = in.normal(P * H * hd), k = in.normal(P * Hkv * hd), v = in.normal(P * Hkv * hd);
        op.prepare = [=, window = c.sliding_window](Backend& be) {
            Tensor qt = upload(be, q, {1, P, H, hd}), kt = upload(be, k, {1, P, Hkv, hd});
            Tensor vt = upload(be, v, {1, P, Hkv, hd}), out = be.alloc({1, P, H, hd});
            return OpCase::Prepared{
                [&be, qt, kt, vt, out, window] { be.attention(qt, kt, vt, out, window); }, out};
        };
        ops.push_back(op);
    }
    {  // one decode step's attention over a full (wrapped) cache
        const int32_t start = static_cast<int32_t>(c.sliding_window > 0 ? 3 * W + 5 : W - 1);
        OpCase op{"attention (decode)",
                  dims({1, H, hd}) + " cache " + std::to_string(W),
                  4.0 * W * H * hd,
                  4.0 * 2 * W * Hkv * hd,
                  {}};
        auto q = in.normal(H * hd), k = in.normal(Hkv * hd), v = in.normal(Hkv * hd);
        auto kc = in.normal(W * Hkv * hd), vc = in.normal(W * Hkv * hd);
        op.prepare = [=, window = c.sliding_window](Backend& be) {
            Tensor qt = upload(be, q, {1, 1, H, hd}), kt = upload(be, k, {1, 1, Hkv, hd});
            Tensor vt = upload(be, v, {1, 1, Hkv, hd}), out = be.alloc({1, 1, H, hd});
            Tensor kct = upload(be, kc, {1, W, Hkv, hd}), vct = upload(be, vc, {1, W, Hkv, hd});
            Tensor st = upload_ids(be, {start}, {1});
            return OpCase::Prepared{[&be, qt, kt, vt, kct, vct, st, out, window] {
                                        be.attention_cached(qt, kt, vt, kct, vct, st, out, window);
                                    },
                                    out};
        };
        ops.push_back(op);
    }
    if (c.is_moe()) {  // routing: top-k with gate softmax
        const int64_t E = c.n_experts, k = c.top_k;
        OpCase op{"router top-k (prefill)",
                  dims({P, E}) + " top " + std::to_string(k),
                  0,
                  4.0 * P * (E + 2 * k),
                  {}};
        auto logits = in.normal(P * E);
        op.prepare = [=](Backend& be) {
            Tensor lt = upload(be, logits, {P, E}), idx = be.alloc({P, k}, DType::I32);
            Tensor gates = be.alloc({P, k});
            return OpCase::Prepared{[&be, lt, idx, gates] { be.router_topk(lt, idx, gates); },
                                    gates};
        };
        ops.push_back(op);
    }
    ops.push_back(experts_case(c.is_moe() ? "experts w1 (prefill)" : "ffn w1 (prefill)", c, P, in));
    ops.push_back(experts_case(c.is_moe() ? "experts w1 (decode)" : "ffn w1 (decode)", c, 1, in));
    ops.push_back(linear_case("lm_head (decode)", 1, c.vocab_size, d, in));
    ops.push_back(linear_case("lm_head (prefill GEMM)", P, c.vocab_size, d, in));
    if (gemm > 0) ops.push_back(square_gemm_case(gemm, in));
    return ops;
}

// An op's timed batch lasts about this long (ops shorter than it launch back to back).
constexpr double kOpBatchMs = 2.0;

std::vector<float> run_op(const OpCase& op, Backend& be) {
    OpCase::Prepared prepared = op.prepare(be);
    prepared.launch();
    return download(be, prepared.out);
}

OpBench measure_op(const OpCase& op, Backend& be, const std::vector<float>& reference,
                   const BenchOptions& o, Precision precision) {
    OpBench ob{op.name, op.shape};
    try {
        ob.max_error = max_error(run_op(op, be), reference);
        OpCase::Prepared p = op.prepare(be);
        for (int i = 0; i < o.warmup; ++i) {
            p.launch();
            be.synchronize();
        }
        const LaunchTime t = median_launch_seconds(be, p.launch, kOpBatchMs, o.repeats);
        const double s = t.seconds;
        ob.ms = s * 1e3;
        ob.launches = t.launches;
        ob.gflops = op.flops / s * 1e-9;
        ob.gbytes_per_s = op.bytes_in(precision) / s * 1e-9;
    } catch (const Error& e) {  // this op, at this shape, on this backend: say why
        ob = OpBench{op.name, op.shape};
        ob.skipped = e.what();
        if (o.progress) o.progress(be.name() + ": " + op.name + " skipped: " + e.what());
    }
    return ob;
}

}  // namespace tmx::bench_detail

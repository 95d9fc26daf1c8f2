#include "engine/report/bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "engine/compute/backend.h"
#include "engine/core/errors.h"
#include "engine/model/kv_cache.h"
#include "engine/model/model.h"
#include "engine/report/param_report.h"
#include "engine/core/rng.h"
#include "engine/model/adamw.h"
#include "engine/model/training_memory.h"

namespace tmx {
namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Median wall time in seconds of `work` after warm-up; each run ends when the device is done.
double median_seconds(Backend& be, const std::function<void()>& work, int warmup, int repeats,
                      const std::function<void()>& before_each = {}) {
    for (int i = 0; i < warmup; ++i) {
        if (before_each) before_each();
        work();
        be.synchronize();
    }
    std::vector<double> times;
    for (int i = 0; i < std::max(1, repeats); ++i) {
        if (before_each) before_each();
        be.synchronize();
        const auto t0 = Clock::now();
        work();
        be.synchronize();
        times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    return median(times);
}

double max_error(const std::vector<float>& got, const std::vector<float>& want) {
    double scale = 1.0, worst = 0.0;
    for (float w : want) scale = std::max(scale, std::abs(double(w)));
    for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
        const double d = std::abs(double(got[i]) - double(want[i]));
        worst = std::max(worst, std::isnan(d) ? INFINITY : d);
    }
    return worst / scale;
}

std::vector<float> download(Backend& be, const Tensor& t) {
    std::vector<float> host(static_cast<size_t>(t.numel()));
    be.download(t, host.data());
    return host;
}

Tensor upload(Backend& be, const std::vector<float>& host, Shape shape) {
    Tensor t = be.alloc(std::move(shape));
    be.upload(t, host.data());
    return t;
}

// A matmul operand as the model holds it in the backend's precision: BF16 in bf16 (the model's
// bf16 weight copy and the activations only matmuls read), F32 otherwise.
Tensor upload_operand(Backend& be, const std::vector<float>& host, Shape shape) {
    Tensor t = upload(be, host, std::move(shape));
    if (be.matmul_precision() != Precision::BF16) return t;
    Tensor bf16 = be.alloc(t.shape(), DType::BF16);
    be.convert(t, bf16);
    return bf16;
}

// Sets a backend's matmul precision for a scope and restores the one before, however it ends.
class PrecisionScope {
public:
    PrecisionScope(Backend& be, Precision p) : be_(be), before_(be.matmul_precision()) {
        be.set_matmul_precision(p);
    }
    ~PrecisionScope() { be_.set_matmul_precision(before_); }
    PrecisionScope(const PrecisionScope&) = delete;
    PrecisionScope& operator=(const PrecisionScope&) = delete;

private:
    Backend& be_;
    Precision before_;
};

Tensor upload_ids(Backend& be, const std::vector<int32_t>& host, Shape shape) {
    Tensor t = be.alloc(std::move(shape), DType::I32);
    be.upload(t, host.data());
    return t;
}

std::string dims(std::initializer_list<int64_t> d) {
    std::string s;
    for (int64_t x : d) {
        if (!s.empty()) s += 'x';
        s += std::to_string(x);
    }
    return s;
}

// One op at one shape: what it costs, and how to set it up on a backend (inputs uploaded,
// output allocated) and launch it in the backend's precision. Inputs are host data fixed at
// construction, so every backend sees the same ones.
struct OpCase {
    std::string name, shape;
    double flops = 0, bytes = 0;  // bytes: with fp32 operands
    double operand_elements = 0;  // of matmul operands, which bf16 precision holds in 2 bytes
    double bytes_in(Precision p) const {
        return p == Precision::BF16 ? bytes - 2.0 * operand_elements : bytes;
    }
    struct Prepared {
        std::function<void()> launch;
        Tensor out;
    };
    std::function<Prepared(Backend&)> prepare;
};

class InputMaker {
public:
    explicit InputMaker(uint64_t seed) : rng_(seed) {}
    std::vector<float> normal(int64_t n, double scale = 1.0) {
        std::vector<float> v(static_cast<size_t>(n));
        for (float& x : v) x = static_cast<float>(rng_.normal() * scale);
        return v;
    }
    std::vector<int32_t> ints(int64_t n, int64_t hi) {
        std::vector<int32_t> v(static_cast<size_t>(n));
        for (int32_t& x : v) x = static_cast<int32_t>(rng_.below(static_cast<uint64_t>(hi)));
        return v;
    }

private:
    Rng rng_;
};

// out = a b^T (a linear layer), M rows.
OpCase linear_case(const std::string& name, int64_t M, int64_t N, int64_t K, InputMaker& in) {
    OpCase c{name, dims({M, N, K}), 2.0 * M * N * K, 4.0 * (M * K + N * K + M * N),
             double(M * K + N * K), {}};
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
OpCase experts_case(const std::string& name, const ModelConfig& c, int64_t tokens,
                    InputMaker& in) {
    if (!c.is_moe()) return linear_case(name, tokens, c.d_ff, c.d_model, in);
    const int64_t S = tokens * c.top_k, K = c.d_model, N = c.d_ff, E = c.n_experts;
    std::vector<int32_t> per_expert = in.ints(S, E);
    std::sort(per_expert.begin(), per_expert.end());
    std::vector<int32_t> offsets(static_cast<size_t>(E + 1), 0);
    for (int32_t e : per_expert) ++offsets[e + 1];
    for (int64_t e = 0; e < E; ++e) offsets[e + 1] += offsets[e];
    int64_t used = 0;
    for (int64_t e = 0; e < E; ++e) used += offsets[e + 1] > offsets[e];
    OpCase op{name, dims({S, N, K}) + " (" + std::to_string(E) + " experts)", 2.0 * S * N * K,
              4.0 * (S * K + used * N * K + S * N), double(S * K + used * N * K), {}};
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
                                    PrecisionScope fp32(be, Precision::F32);
                                    be.matmul(at, bt, out);
                                },
                                out};
    };
    return c;
}

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
            return OpCase::Prepared{[&be, type, eps, xt, wt, bt, out] {
                                        be.norm(type, xt, wt, bt, eps, out);
                                    },
                                    out};
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
        OpCase op{"attention (prefill)", dims({P, H, hd}) + " window " + std::to_string(c.sliding_window),
                  4.0 * pairs * H * hd, 4.0 * (2 * P * H * hd + 2 * P * Hkv * hd), {}};
        auto q = in.normal(P * H * hd), k = in.normal(P * Hkv * hd), v = in.normal(P * Hkv * hd);
        op.prepare = [=, window = c.sliding_window](Backend& be) {
            Tensor qt = upload(be, q, {1, P, H, hd}), kt = upload(be, k, {1, P, Hkv, hd});
            Tensor vt = upload(be, v, {1, P, Hkv, hd}), out = be.alloc({1, P, H, hd});
            return OpCase::Prepared{[&be, qt, kt, vt, out, window] {
                                        be.attention(qt, kt, vt, out, window);
                                    },
                                    out};
        };
        ops.push_back(op);
    }
    {  // one decode step's attention over a full (wrapped) cache
        const int32_t start = static_cast<int32_t>(c.sliding_window > 0 ? 3 * W + 5 : W - 1);
        OpCase op{"attention (decode)", dims({1, H, hd}) + " cache " + std::to_string(W),
                  4.0 * W * H * hd, 4.0 * 2 * W * Hkv * hd, {}};
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
        OpCase op{"router top-k (prefill)", dims({P, E}) + " top " + std::to_string(k), 0,
                  4.0 * P * (E + 2 * k), {}};
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

// What a model-level run produces, to time it and to check it against the CPU's.
struct ModelRun {
    std::vector<float> prefill_logits;
    std::vector<std::vector<float>> step_logits;  // batch-1 decode
    std::vector<int32_t> greedy;                  // tokens chosen in batch-1 decode
};

int32_t argmax(const float* x, int64_t n) {
    return static_cast<int32_t>(std::max_element(x, x + n) - x);
}

class ModelRunner {
public:
    ModelRunner(Model& model, const BenchOptions& o, int64_t prompt_tokens)
        : m_(model), be_(model.backend()), o_(o), c_(model.config()), P_(prompt_tokens) {
        Rng rng(o.seed ^ 0xbe7c4);
        prompt_.resize(static_cast<size_t>(P_));
        for (int32_t& t : prompt_) t = static_cast<int32_t>(rng.below(c_.vocab_size));
        for (int64_t b = 0; b < o.batch; ++b) {
            std::vector<int32_t> p(static_cast<size_t>(std::min<int64_t>(P_, 16)));
            for (int32_t& t : p) t = static_cast<int32_t>(rng.below(c_.vocab_size));
            batch_prompts_.push_back(p);
        }
    }

    // Prefill of the prompt into `cache`; returns the last token's logits.
    std::vector<float> prefill(const KvCache& cache, const std::vector<int32_t>& prompt) {
        const int64_t chunk = kv_cache_slots(c_);
        Tensor last;
        for (size_t s = 0; s < prompt.size(); s += static_cast<size_t>(chunk)) {
            const size_t n = std::min(prompt.size() - s, static_cast<size_t>(chunk));
            std::vector<int32_t> piece(prompt.begin() + static_cast<std::ptrdiff_t>(s),
                                       prompt.begin() + static_cast<std::ptrdiff_t>(s + n));
            last = m_.forward_cached(piece, 1, static_cast<int64_t>(n), {static_cast<int32_t>(s)},
                                     cache);
        }
        return download(be_, last);
    }

    // Greedy decode of `steps` tokens for every sequence of `cache` after prompts of the given
    // lengths, starting from `first` tokens; records batch-1 logits into `run` when given.
    void decode(const KvCache& cache, std::vector<int32_t> tokens, std::vector<int32_t> start,
                int64_t steps, ModelRun* run) {
        const int64_t B = cache.batch(), V = c_.vocab_size;
        for (int64_t s = 0; s < steps; ++s) {
            const std::vector<float> logits =
                download(be_, m_.forward_cached(tokens, B, 1, start, cache));
            for (int64_t b = 0; b < B; ++b) {
                tokens[b] = argmax(logits.data() + b * V, V);
                ++start[b];
            }
            if (run) {
                run->step_logits.push_back(logits);
                run->greedy.push_back(tokens[0]);
            }
        }
    }

    ModelBench measure(ModelRun& run) {
        ModelBench r;
        KvCache cache(c_, be_, 1);
        const int64_t D = decode_steps();
        if (o_.progress) o_.progress(be_.name() + ": prefill of " + std::to_string(P_) + " tokens");
        const double t_prefill = median_seconds(
            be_, [&] { run.prefill_logits = prefill(cache, prompt_); }, o_.warmup, o_.repeats);
        r.prefill_tokens_per_s = static_cast<double>(P_) / t_prefill;

        if (o_.progress) o_.progress(be_.name() + ": batch-1 decode of " + std::to_string(D) + " tokens");
        const int32_t first = argmax(run.prefill_logits.data(), c_.vocab_size);
        auto reset = [&] { prefill(cache, prompt_); };
        const double t_decode = median_seconds(
            be_,
            [&] {
                run.step_logits.clear();
                run.greedy.clear();
                decode(cache, {first}, {static_cast<int32_t>(P_)}, D, &run);
            },
            o_.warmup, o_.repeats, reset);
        r.decode_tokens_per_s = static_cast<double>(D) / t_decode;

        if (o_.progress)
            o_.progress(be_.name() + ": batch-" + std::to_string(o_.batch) + " decode");
        const int64_t B = o_.batch;
        KvCache batch_cache(c_, be_, B);
        std::vector<int32_t> firsts, starts;
        auto reset_batch = [&] {
            firsts.clear();
            starts.clear();
            for (int64_t b = 0; b < B; ++b) {
                const std::vector<float> l = prefill(batch_cache.sequence(b), batch_prompts_[b]);
                firsts.push_back(argmax(l.data(), c_.vocab_size));
                starts.push_back(static_cast<int32_t>(batch_prompts_[b].size()));
            }
        };
        const double t_batch = median_seconds(
            be_, [&] { decode(batch_cache, firsts, starts, D, nullptr); }, o_.warmup, o_.repeats,
            reset_batch);
        r.batch_decode_tokens_per_s = static_cast<double>(B * D) / t_batch;

        if (o_.profile && be_.can_profile()) {
            if (o_.progress)
                o_.progress(be_.name() + ": profiled decode, batch 1 and " + std::to_string(B));
            reset();
            r.profiles.push_back(profile_decode(cache, {first}, {static_cast<int32_t>(P_)}));
            reset_batch();
            r.profiles.push_back(profile_decode(batch_cache, firsts, starts));
        }
        return r;
    }

private:
    DecodeProfile profile_decode(const KvCache& cache, const std::vector<int32_t>& firsts,
                                 const std::vector<int32_t>& starts) {
        DecodeProfile p;
        p.batch = cache.batch();
        p.steps = decode_steps();
        be_.synchronize();
        be_.begin_profile();
        const auto t0 = std::chrono::steady_clock::now();
        decode(cache, firsts, starts, p.steps, nullptr);
        p.commands = be_.end_profile();
        p.wall_seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        return p;
    }

    int64_t decode_steps() const {
        const int64_t limit = kv_cache_max_positions(c_);
        return limit < 0 ? o_.decode_tokens : std::min(o_.decode_tokens, limit - P_);
    }

    Model& m_;
    Backend& be_;
    const BenchOptions& o_;
    const ModelConfig& c_;
    int64_t P_;
    std::vector<int32_t> prompt_;
    std::vector<std::vector<int32_t>> batch_prompts_;
};

// Training steps on random tokens: the median step time after warm-up, and the first step's
// loss (the same weights and batch on every backend, so comparable with the CPU's).
TrainBench measure_training(const ModelConfig& c, const std::vector<float>& weights, Backend& be,
                            const BenchOptions& o, Precision precision) {
    TrainBench r;
    r.precision = precision;
    PrecisionScope scope(be, precision);
    const int64_t B = o.train_batch, T = o.train_seq, N = B * T;
    Rng rng(o.seed ^ 0x7a1d);
    std::vector<int32_t> tokens(static_cast<size_t>(N)), targets(static_cast<size_t>(N));
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng.below(c.vocab_size));
    for (int32_t& t : targets) t = static_cast<int32_t>(rng.below(c.vocab_size));
    Model model(c, be);
    model.params_from_host(weights);
    const int64_t P = model.num_params();
    Tensor m = be.alloc({P}), v = be.alloc({P}), norm = be.alloc({1});
    for (const Tensor* t : {&m, &v}) be.fill(*t, 0.0f);
    int64_t step = 0;
    auto train_step = [&] {
        model.zero_grads();
        const ForwardResult f = model.forward(tokens, B, T, &targets, /*keep_activations=*/true);
        if (step == 0) r.loss = f.loss;
        model.backward();
        be.sum_squares(model.grads(), norm);
        adamw_step(model, m, v,
                   {.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                    .step = ++step});
        model.params_changed();
    };
    if (o.progress)
        o.progress(be.name() + ": training step, batch " + std::to_string(B) + " x " +
                   std::to_string(T));
    be.reset_peak_memory();
    const double seconds = median_seconds(be, train_step, o.warmup, o.repeats);
    r.peak_bytes = be.memory_stats().peak_bytes;
    r.engine_bytes = training_memory(c, B, T, r.precision, /*with_validation=*/false).total();
    r.measured = true;
    r.tokens_per_s = static_cast<double>(N) / seconds;
    const ParamReport report =
        build_param_report(config_to_json(c), "bench", ReportOptions{.batch = B, .seq = T});
    r.model_tflops = report.training_flops * r.tokens_per_s * 1e-12;
    r.peak_tflops = o.peak_tflops > 0 ? o.peak_tflops : be.spec_peak_tflops(precision);
    r.peak_from_spec = o.peak_tflops <= 0 && r.peak_tflops > 0;
    if (r.peak_tflops > 0) r.mfu = r.model_tflops / r.peak_tflops;
    return r;
}

}  // namespace

std::vector<BackendBench> run_bench(const ModelConfig& config, std::vector<float> weights,
                                    const BenchOptions& o) {
    if (o.backends.empty()) throw UsageError("--backends: no backend to run");
    if (!o.open_backend) throw std::logic_error("run_bench: BenchOptions::open_backend is not set");
    if (o.prompt_tokens < 1 || o.decode_tokens < 1 || o.batch < 1 || o.repeats < 1 || o.warmup < 0)
        throw UsageError("tmx bench: --prompt, --decode, --batch and --repeats must be positive");
    if ((o.train_batch > 0) != (o.train_seq > 0) || o.train_batch < 0 || o.train_seq < 0)
        throw UsageError("tmx bench: --train-batch and --train-seq go together, both positive");
    if (o.train_seq > config.max_seq_len)
        throw UsageError("tmx bench: --train-seq " + std::to_string(o.train_seq) +
                         " exceeds the model's max_seq_len " + std::to_string(config.max_seq_len));
    const int64_t limit = kv_cache_max_positions(config);
    const int64_t P = limit < 0 ? o.prompt_tokens : std::min(o.prompt_tokens, limit - 1);

    // Every backend first, so that a bad name fails before any measuring.
    std::vector<std::unique_ptr<Backend>> others;
    for (const std::string& name : o.backends)
        others.push_back(name == "cpu" ? nullptr : o.open_backend(name));

    // The CPU results everything is checked against.
    auto cpu = o.open_backend("cpu");
    // Each backend measures in options.precision, else in its default; a backend without the
    // precision asked for is refused before anything is measured.
    auto precision_of = [&](const Backend& be) { return o.precision.value_or(be.default_precision()); };
    for (const std::unique_ptr<Backend>& other : others) {
        const Backend& be = other ? *other : *cpu;
        if (!be.supports_precision(precision_of(be)))
            throw UsageError("--precision " + std::string(to_string(precision_of(be))) + ": the " +
                             be.name() + " backend has none; leave --precision out to run each "
                             "backend in its default");
    }
    // A training batch that cannot fit (on a backend that trains, or on the CPU, which takes the
    // reference step) is refused before anything is measured.
    if (o.train_batch > 0) {
        const TrainingMemoryFlags flags{"--train-batch", "--train-seq", ""};
        auto check = [&](const Backend& be, Precision p) {
            check_training_memory(config, o.train_batch, o.train_seq, p, be, flags);
        };
        for (const std::unique_ptr<Backend>& other : others) {
            const Backend& be = other ? *other : *cpu;
            if (!be.supports_training()) continue;
            check(be, precision_of(be));
            check(*cpu, precision_of(be));  // the reference step
        }
    }
    Model cpu_model(config, *cpu);
    if (weights.empty()) {
        cpu_model.init_random(o.seed);
        weights = cpu_model.params_to_host();
    } else {
        cpu_model.params_from_host(weights);
    }
    const std::vector<OpCase> ops = op_cases(config, P, o.seed, o.gemm);
    // The CPU's results in each precision a backend measures in, made when first needed.
    struct Reference {
        std::vector<std::vector<float>> op_outputs;
        ModelRun run;
        bool model_run = false;
    };
    std::map<Precision, Reference> references;
    auto reference = [&](Precision p) -> Reference& {
        Reference& ref = references[p];
        if (ref.op_outputs.empty()) {
            PrecisionScope scope(*cpu, p);
            for (const OpCase& op : ops) {
                OpCase::Prepared prepared = op.prepare(*cpu);
                prepared.launch();
                ref.op_outputs.push_back(download(*cpu, prepared.out));
            }
        }
        return ref;
    };

    std::vector<BackendBench> results;
    for (const std::unique_ptr<Backend>& other : others) {
        Backend& be = other ? *other : *cpu;
        const Precision precision = precision_of(be);
        Reference& ref = reference(precision);
        PrecisionScope scope(be, precision);
        BackendBench r;
        r.backend = be.name();
        r.description = be.description();
        r.precision = precision;
        for (size_t i = 0; i < ops.size(); ++i) {
            const OpCase& op = ops[i];
            if (o.progress) o.progress(r.backend + ": " + op.name + " " + op.shape);
            OpBench ob{op.name, op.shape};
            try {
                {
                    OpCase::Prepared check = op.prepare(be);
                    check.launch();
                    ob.max_error = max_error(download(be, check.out), ref.op_outputs[i]);
                }
                OpCase::Prepared p = op.prepare(be);
                const double s = median_seconds(be, p.launch, o.warmup, o.repeats);
                ob.ms = s * 1e3;
                ob.gflops = op.flops / s * 1e-9;
                ob.gbytes_per_s = op.bytes_in(precision) / s * 1e-9;
            } catch (const Error& e) {  // this op, at this shape, on this backend: say why
                ob = OpBench{op.name, op.shape};
                ob.skipped = e.what();
                if (o.progress) o.progress(r.backend + ": " + op.name + " skipped: " + e.what());
            }
            r.ops.push_back(ob);
        }

        ModelRun run;
        if (&be == cpu.get()) {
            r.model = ModelRunner(cpu_model, o, P).measure(ref.run);
            ref.model_run = true;
            run = ref.run;
        } else {
            if (!ref.model_run) {  // the reference run, untimed repeats kept small
                BenchOptions once = o;
                once.warmup = 0;
                once.repeats = 1;
                once.profile = false;
                once.progress = {};
                PrecisionScope cpu_scope(*cpu, precision);
                ModelRunner(cpu_model, once, P).measure(ref.run);
                ref.model_run = true;
            }
            Model model(config, be);
            model.params_from_host(weights);
            r.model = ModelRunner(model, o, P).measure(run);
        }
        const ModelRun& cpu_run = ref.run;
        ModelBench& mb = r.model;
        mb.logits_error = max_error(run.prefill_logits, cpu_run.prefill_logits);
        for (size_t s = 0; s < run.greedy.size() && s < cpu_run.greedy.size(); ++s) {
            mb.logits_error = std::max(mb.logits_error,
                                       max_error(run.step_logits[s], cpu_run.step_logits[s]));
            ++mb.greedy_steps;
            if (run.greedy[s] != cpu_run.greedy[s]) break;  // inputs differ from here on
            ++mb.greedy_matching;
        }
        if (o.train_batch > 0 && be.supports_training()) {
            r.train = measure_training(config, weights, be, o, precision);
            r.train.cpu_loss = r.train.loss;
            if (&be != cpu.get()) {  // the CPU's loss on the same batch, one untimed step
                BenchOptions once = o;
                once.warmup = 0;
                once.repeats = 1;
                once.progress = {};
                r.train.cpu_loss = measure_training(config, weights, *cpu, once, precision).loss;
            }
        }
        results.push_back(std::move(r));
    }
    return results;
}

}  // namespace tmx

// tmx tune (tune.h): collect the model's tunable calls, then time every variant of each shape.
#include "engine/report/tune.h"

#include <algorithm>
#include <set>

#include "engine/core/errors.h"
#include "engine/model/model.h"
#include "engine/report/bench.h"
#include "engine/report/bench_util.h"
#include "engine/report/model_bench.h"

namespace tmx {
namespace {

using bench_detail::download;
using bench_detail::InputMaker;
using bench_detail::max_error;
using bench_detail::upload;

// Output error allowed against the CPU (max |out - cpu| / max(1, max |cpu|)): fp32 summation in
// another order, or weights read as fp16 (a relative rounding of 2^-11 per weight).
constexpr double kFp32Tolerance = 1e-4;
constexpr double kReducedTolerance = 3e-3;

// The tunable calls of the model's inference (prefill, batch-1 and batch-N decode) and, when
// asked, of a training step, in the order they were made, one per key and kernel.
std::vector<TunableCall> collect_calls(const ModelConfig& config, Backend& be,
                                       const TuneOptions& o) {
    KernelTuning& kt = *kernel_tuning_of(be);
    std::vector<TunableCall> log;
    BenchOptions bo;
    bo.warmup = 0;
    bo.repeats = 1;
    bo.prompt_tokens = o.prompt_tokens;
    bo.decode_tokens = 2;
    bo.batch = o.batch;
    bo.train_batch = o.train_batch;
    bo.train_seq = o.train_seq;
    bo.train_check = false;
    bo.seed = o.seed;
    bo.progress = o.progress;
    Model model(config, be);
    model.init_random(o.seed);
    const std::vector<float> weights = model.params_to_host();
    {
        kt.log_calls(&log);
        try {
            bench_detail::ModelRun run;
            bench_detail::measure_model(model, bo, o.prompt_tokens, run);
            if (o.train_batch > 0) {
                bench_detail::measure_training(config, weights, be, bo,
                                               {.precision = Precision::F32});
            }
            if (o.gemm > 0) {
                // As op_bench.cpp's square GEMM runs it: fp32, b not a weight.
                const int64_t n = o.gemm;
                const Tensor a = be.alloc({n, n}), b = be.alloc({n, n}), out = be.alloc({n, n});
                be.fill(a, 1.0f);
                be.fill(b, 1.0f);
                Backend::ModeScope fp32(be, {.precision = Precision::F32});
                be.matmul(a, b, out);
            }
        } catch (...) {
            kt.log_calls(nullptr);
            throw;
        }
        kt.log_calls(nullptr);
    }
    std::vector<TunableCall> unique;
    std::set<std::pair<std::string, std::string>> seen;
    for (const TunableCall& c : log)
        if (seen.insert({c.kernel, c.key}).second) unique.push_back(c);
    return unique;
}

// A call's outputs on one backend, and how to launch it (its inputs live in the closure).
struct Launch {
    std::vector<Tensor> outputs;
    std::function<void()> run;
};

// Fresh random inputs for `call`, the same on every backend (drawn from `seed`).
Launch prepare(const TunableCall& c, Backend& be, uint64_t seed) {
    InputMaker in(seed);
    Launch l;
    const int64_t M = c.rows, N = c.n, K = c.k, E = std::max<int64_t>(c.experts, 1);
    auto up = [&](int64_t n, Shape shape) { return upload(be, in.normal(n), std::move(shape)); };
    // Expert offsets for M slots routed at random over E experts.
    auto offsets = [&] {
        std::vector<int32_t> off(static_cast<size_t>(E + 1), 0);
        for (int32_t e : in.ints(M, E)) ++off[e + 1];
        for (int64_t e = 0; e < E; ++e) off[e + 1] += off[e];
        return bench_detail::upload_ids(be, off, {E + 1});
    };
    switch (c.op) {
        case TunableCall::Op::Matmul: {
            const Tensor a = up(M * K, c.trans_a ? Shape{K, M} : Shape{M, K});
            const Tensor b = up(K * N, c.trans_b ? Shape{N, K} : Shape{K, N});
            const Tensor out = be.alloc({M, N});
            l.outputs = {out};
            const MatmulOptions opts{.trans_a = c.trans_a, .trans_b = c.trans_b};
            l.run = [&be, a, b, out, opts] { be.matmul(a, b, out, opts); };
            break;
        }
        case TunableCall::Op::Linear: {
            const Tensor x = up(M * K, {M, K});
            const Tensor w = up(N * K, {N, K});
            const Tensor y = be.alloc({M, N});
            l.outputs = {y};
            l.run = [&be, x, w, y] { be.linear(x, w, Tensor{}, y); };
            break;
        }
        case TunableCall::Op::GroupedMatmul: {
            const Tensor x = up(M * K, {M, K});
            const Tensor w = up(E * N * K, {E, N, K});
            const Tensor off = offsets();
            const Tensor out = be.alloc({M, N});
            l.outputs = {out};
            l.run = [&be, x, w, off, out] { be.grouped_matmul(x, w, Tensor{}, off, out); };
            break;
        }
        case TunableCall::Op::Attention: {
            // One sequence of `rows` queries with no cache: the prefill's shader at its shape.
            const int64_t T = M, hd = N, H = c.heads, Hkv = c.kv_heads;
            const Tensor q = up(T * H * hd, {1, T, H, hd});
            const Tensor k = up(T * Hkv * hd, {1, T, Hkv, hd});
            const Tensor v = up(T * Hkv * hd, {1, T, Hkv, hd});
            const Tensor out = be.alloc({1, T, H, hd});
            l.outputs = {out};
            const int64_t window = K;
            l.run = [&be, q, k, v, out, window] { be.attention(q, k, v, out, window); };
            break;
        }
        case TunableCall::Op::AttentionCached: {
            // `rows` sequences of one query each, their caches of k - 1 slots full (random
            // keys and values): each query sees k keys, the last its own, as a decode step's.
            const int64_t B = M, hd = N, H = c.heads, Hkv = c.kv_heads,
                          S = std::max<int64_t>(K - 1, 1);
            const Tensor q = up(B * H * hd, {B, 1, H, hd});
            const Tensor k = up(B * Hkv * hd, {B, 1, Hkv, hd});
            const Tensor v = up(B * Hkv * hd, {B, 1, Hkv, hd});
            const Tensor k_cache = up(B * S * Hkv * hd, {B, S, Hkv, hd});
            const Tensor v_cache = up(B * S * Hkv * hd, {B, S, Hkv, hd});
            const Tensor start = bench_detail::upload_ids(
                be, std::vector<int32_t>(static_cast<size_t>(B), static_cast<int32_t>(S)), {B});
            const Tensor out = be.alloc({B, 1, H, hd});
            l.outputs = {out};
            const int64_t window = K;
            l.run = [&be, q, k, v, k_cache, v_cache, start, out, window] {
                be.attention_cached(q, k, v, k_cache, v_cache, start, out, window);
            };
            break;
        }
        case TunableCall::Op::GroupedMatmulBackward: {
            const Tensor x = up(M * K, {M, K});
            const Tensor w = up(E * N * K, {E, N, K});
            const Tensor off = offsets();
            const Tensor d_out = up(M * N, {M, N});
            const Tensor d_x = be.alloc({M, K}), d_w = be.alloc({E, N, K});
            l.outputs = {d_x, d_w};
            // The gradients accumulate: zero them first, so one launch gives the product.
            l.run = [&be, x, w, off, d_out, d_x, d_w] {
                be.grouped_matmul_backward(x, w, off, d_out, d_x, d_w, Tensor{});
            };
            for (const Tensor& t : l.outputs) be.fill(t, 0.0f);
            break;
        }
    }
    return l;
}

std::vector<std::vector<float>> outputs_of(Backend& be, const Launch& l) {
    std::vector<std::vector<float>> out;
    for (const Tensor& t : l.outputs) out.push_back(download(be, t));
    return out;
}

}  // namespace

TuneReport tune_kernels(const ModelConfig& config, Backend& be, Backend& cpu,
                        const TuneOptions& o) {
    KernelTuning* kt = kernel_tuning_of(be);
    if (!kt) throw Error("backend '" + be.name() + "' has no kernel shapes to tune");
    const std::vector<TunableCall> calls = collect_calls(config, be, o);
    TuneReport report;
    std::vector<TunedChoice> choices;
    for (size_t i = 0; i < calls.size(); ++i) {
        const TunableCall& call = calls[i];
        const std::vector<std::string> variants = kt->variants(call);
        if (o.progress)
            o.progress("[" + std::to_string(i + 1) + "/" + std::to_string(calls.size()) + "] " +
                       call.key + ": " + std::to_string(variants.size()) + " variants");
        const uint64_t seed = o.seed ^ (0x7e5e + i * 0x9e3779b9ull);
        const Launch ref = prepare(call, cpu, seed);
        ref.run();
        const std::vector<std::vector<float>> want = outputs_of(cpu, ref);

        // Repeated the way it was logged: training mode reads f32 weights as they are, outside
        // it a backend may read fp16 copies. The tuned kernels are fp32 (Vulkan's precision).
        Backend::ModeScope mode(be,
                                {.precision = Precision::F32, .training = !call.reduced_weights});
        const Launch launch = prepare(call, be, seed);
        TunedShapeReport shape;
        shape.call = call;
        shape.default_variant = kt->default_variant(call);
        shape.tolerance = call.reduced_weights ? kReducedTolerance : kFp32Tolerance;
        for (const std::string& v : variants) {
            kt->force_variant(call.kernel, v);
            TunedShapeReport::Tried t{v};
            // The backward accumulates into its gradients: from zero for the check.
            if (call.op == TunableCall::Op::GroupedMatmulBackward)
                for (const Tensor& g : launch.outputs) be.fill(g, 0.0f);
            launch.run();
            const std::vector<std::vector<float>> got = outputs_of(be, launch);
            for (size_t k = 0; k < got.size(); ++k)
                t.error = std::max(t.error, max_error(got[k], want[k]));
            t.rejected = !(t.error <= shape.tolerance);
            if (!t.rejected)
                t.ms = bench_detail::median_launch_seconds(be, launch.run, o.min_ms, o.repeats)
                           .seconds *
                       1e3;
            shape.tried.push_back(t);
        }
        kt->force_variant(call.kernel, "");
        const TunedShapeReport::Tried* best = nullptr;
        for (const auto& t : shape.tried) {
            if (!t.rejected && (!best || t.ms < best->ms)) best = &t;
            if (t.variant == shape.default_variant) shape.default_ms = t.ms;
        }
        if (!best)
            throw Error("tune: no variant of " + call.key + " matches the CPU (the smallest " +
                        "error was over the tolerance of " + std::to_string(shape.tolerance) + ")");
        shape.best = best->variant;
        shape.best_ms = best->ms;
        choices.push_back({call, shape.best, shape.best_ms, shape.default_ms,
                           static_cast<int>(shape.tried.size())});
        report.shapes.push_back(std::move(shape));
    }
    if (o.save) report.saved_to = kt->save_tuning(choices);
    return report;
}

}  // namespace tmx

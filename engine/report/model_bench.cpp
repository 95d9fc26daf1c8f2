#include "engine/report/model_bench.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>

#include "engine/core/errors.h"
#include "engine/core/rng.h"
#include "engine/model/adamw.h"
#include "engine/model/kv_cache.h"
#include "engine/model/training_memory.h"
#include "engine/report/bench_util.h"
#include "engine/report/param_report.h"

namespace tmx::bench_detail {
namespace {

// `steps` steps of `batch` sequences that `work` runs, profiled on `be` (which can_profile()).
StepProfile profile_steps(Backend& be, int64_t batch, int64_t steps,
                          const std::function<void()>& work) {
    StepProfile p{.batch = batch, .steps = steps};
    be.synchronize();
    be.begin_profile();
    const auto t0 = std::chrono::steady_clock::now();
    work();
    p.commands = be.end_profile();
    p.barriers = be.profiled_barriers();
    p.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return p;
}

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
    // lengths, starting from `first` tokens. Without `run`, as greedy generation takes its
    // tokens (Backend::argmax_rows: on the device where the backend can); with it, from the
    // downloaded logits, recording the batch-1 logits and tokens into `run`.
    void decode(const KvCache& cache, std::vector<int32_t> tokens, std::vector<int32_t> start,
                int64_t steps, ModelRun* run) {
        const int64_t B = cache.batch(), V = c_.vocab_size;
        for (int64_t s = 0; s < steps; ++s) {
            const Tensor out = m_.forward_cached(tokens, B, 1, start, cache);
            if (run) {
                const std::vector<float> logits = download(be_, out);
                for (int64_t b = 0; b < B; ++b) tokens[b] = argmax(logits.data() + b * V, V);
                run->step_logits.push_back(logits);
                run->greedy.push_back(tokens[0]);
            } else {
                tokens = be_.argmax_rows(out);
                for (int64_t b = 0; b < B; ++b)
                    if (tokens[b] < 0)
                        throw Error(be_.name() + ": the logits of decode step " +
                                    std::to_string(s + 1) + " are not finite (sequence " +
                                    std::to_string(b + 1) + ")");
            }
            for (int64_t b = 0; b < B; ++b) ++start[b];
        }
    }

    // Prefill and the batch-1 greedy decode once, recorded in `run`.
    void record(ModelRun& run) {
        KvCache cache(c_, be_, 1);
        run.prefill_logits = prefill(cache, prompt_);
        run.step_logits.clear();
        run.greedy.clear();
        decode(cache, {argmax(run.prefill_logits.data(), c_.vocab_size)},
               {static_cast<int32_t>(P_)}, decode_steps(), &run);
    }

    ModelBench measure(ModelRun& run) {
        ModelBench r;
        KvCache cache(c_, be_, 1);
        const int64_t D = decode_steps();
        if (o_.progress) o_.progress(be_.name() + ": prefill of " + std::to_string(P_) + " tokens");
        const double t_prefill = median_seconds(
            be_, [&] { run.prefill_logits = prefill(cache, prompt_); }, o_.warmup, o_.repeats);
        r.prefill_tokens_per_s = static_cast<double>(P_) / t_prefill;

        if (o_.progress)
            o_.progress(be_.name() + ": batch-1 decode of " + std::to_string(D) + " tokens");
        const int32_t first = argmax(run.prefill_logits.data(), c_.vocab_size);
        auto reset = [&] { prefill(cache, prompt_); };
        const double t_decode = median_seconds(
            be_, [&] { decode(cache, {first}, {static_cast<int32_t>(P_)}, D, nullptr); }, o_.warmup,
            o_.repeats, reset);
        r.decode_tokens_per_s = static_cast<double>(D) / t_decode;
        // The logits the comparison with the CPU reads, untimed.
        reset();
        run.step_logits.clear();
        run.greedy.clear();
        decode(cache, {first}, {static_cast<int32_t>(P_)}, D, &run);

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
                o_.progress(be_.name() + ": profiled prefill, and decode at batch 1 and " +
                            std::to_string(B));
            r.prefill_profile = profile_steps(be_, 1, 1, [&] { prefill(cache, prompt_); });
            r.prefill_profile->tokens = P_;
            reset();
            r.profiles.push_back(profile_decode(cache, {first}, {static_cast<int32_t>(P_)}));
            reset_batch();
            r.profiles.push_back(profile_decode(batch_cache, firsts, starts));
        }
        return r;
    }

  private:
    StepProfile profile_decode(const KvCache& cache, const std::vector<int32_t>& firsts,
                               const std::vector<int32_t>& starts) {
        const int64_t steps = decode_steps();
        return profile_steps(be_, cache.batch(), steps,
                             [&] { decode(cache, firsts, starts, steps, nullptr); });
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

}  // namespace

TrainBench measure_training(const ModelConfig& c, const std::vector<float>& weights, Backend& be,
                            const BenchOptions& o, Backend::Mode mode) {
    TrainBench r;
    r.precision = mode.precision;
    Backend::ModeScope mode_scope(be, mode);
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
                   {.lr = 1e-4f,
                    .beta1 = 0.9f,
                    .beta2 = 0.95f,
                    .eps = 1e-8f,
                    .weight_decay = 0.1f,
                    .step = ++step});
        model.params_changed();
    };
    if (o.progress)
        o.progress(be.name() + ": training step, batch " + std::to_string(B) + " x " +
                   std::to_string(T));
    be.reset_peak_memory();
    const double seconds = median_seconds(be, train_step, o.warmup, o.repeats);
    r.peak_bytes = be.memory_stats().peak_bytes;
    if (o.profile && be.can_profile()) {
        if (o.progress) o.progress(be.name() + ": profiled training step");
        r.profile = profile_steps(be, B, 1, train_step);
    }
    r.engine_bytes = training_memory(c, B, T, r.precision, /*with_validation=*/false).total();
    r.measured = true;
    r.tokens_per_s = static_cast<double>(N) / seconds;
    const ParamReport report =
        build_param_report(config_to_json(c), "bench", ReportOptions{.batch = B, .seq = T});
    r.model_tflops = report.training_flops * r.tokens_per_s * 1e-12;
    r.peak_tflops = o.peak_tflops > 0 ? o.peak_tflops : be.spec_peak_tflops(mode.precision);
    r.peak_from_spec = o.peak_tflops <= 0 && r.peak_tflops > 0;
    if (r.peak_tflops > 0) r.mfu = r.model_tflops / r.peak_tflops;
    return r;
}

ModelBench measure_model(Model& model, const BenchOptions& o, int64_t prompt_tokens,
                         ModelRun& run) {
    return ModelRunner(model, o, prompt_tokens).measure(run);
}

ModelRun reference_run(Model& model, const BenchOptions& o, int64_t prompt_tokens) {
    ModelRun run;
    ModelRunner(model, o, prompt_tokens).record(run);
    return run;
}

void compare_with_cpu(ModelBench& mb, const ModelRun& run, const ModelRun& cpu_run) {
    mb.logits_error = max_error(run.prefill_logits, cpu_run.prefill_logits);
    for (size_t s = 0; s < run.greedy.size() && s < cpu_run.greedy.size(); ++s) {
        mb.logits_error =
            std::max(mb.logits_error, max_error(run.step_logits[s], cpu_run.step_logits[s]));
        ++mb.greedy_steps;
        if (run.greedy[s] != cpu_run.greedy[s]) break;  // inputs differ from here on
        ++mb.greedy_matching;
    }
}

}  // namespace tmx::bench_detail

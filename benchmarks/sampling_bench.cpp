// Google Benchmark timings of drawing one token from a row of logits (engine/infer/sampling.h):
// the host work a server does per sequence per decode step, beside the model's step. Vocabulary
// sizes of the demo model (2048) and tiny-mixtral (32000); plain temperature sampling (every
// token kept: the OpenAI API's defaults), tmx generate's defaults (top-k 40, top-p 0.95, min-p
// 0.05) and greedy. Run: build/benchmarks/tmx_benchmarks --benchmark_filter=Sample
#include <benchmark/benchmark.h>

#include <vector>

#include "engine/core/rng.h"
#include "engine/infer/sampling.h"

namespace {

void sample(benchmark::State& state, const tmx::SamplingOptions& options) {
    const int64_t V = state.range(0);
    tmx::Rng rng(1);
    std::vector<float> logits(static_cast<size_t>(V));
    for (float& x : logits) x = static_cast<float>(3.0 * rng.normal());
    const std::vector<int32_t> history = {1, 2, 3};
    for (auto _ : state)
        benchmark::DoNotOptimize(tmx::sample_token(logits.data(), V, options, history, 0, rng));
    state.counters["tokens/s"] =
        benchmark::Counter(1.0, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_SampleTemperature(benchmark::State& state) {
    sample(state, {.temperature = 1.0, .top_k = 0, .top_p = 1.0, .min_p = 0.0});
}
void BM_SampleGenerateDefaults(benchmark::State& state) {
    sample(state, tmx::SamplingOptions{});
}
void BM_SampleGreedy(benchmark::State& state) {
    sample(state, {.temperature = 0.0});
}

BENCHMARK(BM_SampleTemperature)->Arg(2048)->Arg(32000);
BENCHMARK(BM_SampleGenerateDefaults)->Arg(2048)->Arg(32000);
BENCHMARK(BM_SampleGreedy)->Arg(2048)->Arg(32000);

}  // namespace

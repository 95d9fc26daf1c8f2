// Google Benchmark timings of the CPU backend: the whole forward pass at the shapes
// and the dense matmul that dominates it. Run: build/benchmarks/tmx_benchmarks
// (TMX_BENCH_CONFIG=path picks another model config; --benchmark_filter selects).
#include <benchmark/benchmark.h>

#include <cstdlib>

#include "backends/registry.h"
#include "engine/core/rng.h"
#include "engine/model/model.h"

namespace {

std::string bench_config() {
    const char* p = std::getenv("TMX_BENCH_CONFIG");
    return p ? p : std::string(TMX_SOURCE_DIR) + "/assets/configs/tiny-mixtral.json";
}

void BM_Forward(benchmark::State& state) {
    const int64_t B = state.range(0), T = state.range(1);
    auto be = tmx::make_backend("cpu");
    tmx::Model model(tmx::load_config(bench_config()), *be);
    model.init_random(0);
    tmx::Rng rng(1);
    std::vector<int32_t> tokens(static_cast<size_t>(B * T));
    for (auto& t : tokens) t = static_cast<int32_t>(rng.below(model.config().vocab_size));
    model.forward(tokens, B, T);  // warm-up
    for (auto _ : state) {
        tmx::ForwardResult r = model.forward(tokens, B, T);
        be->synchronize();
        benchmark::DoNotOptimize(r.logits);
    }
    state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(B * T),
                                                    benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Forward)->Args({1, 512})->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(5.0);

void BM_Matmul(benchmark::State& state) {
    const int64_t M = state.range(0), N = state.range(1), K = state.range(2);
    auto be = tmx::make_backend("cpu");
    tmx::Rng rng(2);
    auto a = be->alloc({M, K}), b = be->alloc({N, K}), c = be->alloc({M, N});
    std::vector<float> ha(static_cast<size_t>(M * K)), hb(static_cast<size_t>(N * K));
    for (auto& x : ha) x = static_cast<float>(rng.normal());
    for (auto& x : hb) x = static_cast<float>(rng.normal());
    be->upload(a, ha.data());
    be->upload(b, hb.data());
    for (auto _ : state) be->matmul(a, b, c, {.trans_b = true});
    state.counters["GFLOP/s"] =
        benchmark::Counter(2.0 * M * N * K * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Matmul)
    ->Args({512, 2048, 512})
    ->Args({512, 32000, 512})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

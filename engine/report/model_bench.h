// tmx bench's model timings: prefill, batch-1 and batch-N decoding, and a training step, each
// checked against the CPU. Internal to engine/report/ (bench.cpp runs them).
#pragma once

#include <cstdint>
#include <vector>

#include "engine/compute/backend.h"
#include "engine/model/model.h"
#include "engine/report/bench.h"

namespace tmx::bench_detail {

// What a model-level run produces, to time it and to check it against the CPU's.
struct ModelRun {
    std::vector<float> prefill_logits;
    std::vector<std::vector<float>> step_logits;  // batch-1 decode
    std::vector<int32_t> greedy;                  // tokens chosen in batch-1 decode
};

// Times prefill of `prompt_tokens` and decoding on `model`, recording what `run` compares.
ModelBench measure_model(Model& model, const BenchOptions& o, int64_t prompt_tokens, ModelRun& run);

// What measure_model records in `run`, computed once and untimed: the reference run that
// every backend is compared with (no batch-N decoding, which nothing compares).
ModelRun reference_run(Model& model, const BenchOptions& o, int64_t prompt_tokens);

// How far `run` is from the CPU's `cpu_run`: the logits' error and the greedy tokens that agree.
void compare_with_cpu(ModelBench& mb, const ModelRun& run, const ModelRun& cpu_run);

// Training steps on random tokens, in `mode`: the median step time after warm-up, and the
// first step's loss (the same weights and batch on every backend, so comparable with the
// CPU's).
TrainBench measure_training(const ModelConfig& c, const std::vector<float>& weights, Backend& be,
                            const BenchOptions& o, Backend::Mode mode);

}  // namespace tmx::bench_detail

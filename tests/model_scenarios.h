// Model-level scenarios that the CPU's tests and each GPU backend's tests run alike, so that
// every backend is held to the same checks: configs and models for tests, cached decoding
// against recomputing, greedy text from the demo model against the CPU's, and a learnable
// dataset for training runs. Each scenario asserts through GoogleTest.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/compute/backend.h"
#include "engine/model/model.h"

namespace tmx::test {

// assets/configs/<name>.json of the source tree.
ModelConfig test_config(const std::string& name);

// A random model whose logits are spread out (weights 10x the usual init), so that greedy
// choices are rarely near-ties.
std::unique_ptr<Model> spread_model(const ModelConfig& c, Backend& be, uint64_t seed);

// max |got - want| / max(1, max |want|); infinity when a value is not finite.
double relative_error(const std::vector<float>& got, const std::vector<float>& want);

// Cached decoding against recomputing the whole sequence: a prompt prefilled in chunks, then
// one token at a time up to windows_total windows, so the rolling buffer wraps.
struct CacheCase {
    const char* config;
    int64_t windows_total;  // total length in windows
    int64_t prompt;         // prompt length
    int64_t chunk;          // prefill chunk (0 = the window)
};
std::string cache_case_name(const ::testing::TestParamInfo<CacheCase>& info);
// At every step the cached logits are within `tolerance` (relative_error) of a from-scratch
// forward pass over the tokens so far, on the same backend.
void expect_cached_decoding_matches_recompute(Backend& be, const CacheCase& cc, uint64_t seed,
                                              double tolerance);

// The shipped demo model, greedy, 200 tokens from a fixed prompt on `cpu` and on `other`:
// `other` chooses the CPU's token at every step, unless the CPU's top two logits there are
// within near_tie(cpu logits of that step), a gap its rounding may flip (the texts part ways
// after it, so the comparison ends there). `other` holds the weights in other_weights (unset:
// the checkpoint's own format where it can, as load_model chooses).
void expect_greedy_demo_matches_cpu(
    Backend& cpu, Backend& other, const std::function<double(const std::vector<float>&)>& near_tie,
    std::optional<DType> other_weights = std::nullopt);

// A dataset of learnable documents under dir: BOS, then a random start and a random stride,
// counting modulo the vocabulary, so that the next token follows from the previous two.
void write_counting_dataset(const std::string& dir, uint64_t seed, int32_t vocab = 97);

}  // namespace tmx::test

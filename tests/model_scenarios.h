// Model-level scenarios that the CPU's tests and each GPU backend's tests run alike, so that
// every backend is held to the same checks: configs and models for tests, cached decoding
// against recomputing, greedy text from the demo model against the CPU's, a learnable
// dataset for training runs, and training against the CPU (gradients, 30 steps, resume). Each
// scenario asserts through GoogleTest.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/compute/backend.h"
#include "engine/compute/precision.h"
#include "engine/model/model.h"
#include "engine/train/train_options.h"

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

// ---- training: another backend against the CPU

struct ModelTolerances {
    double logits, loss, grad_tensor, grad_model;
};
// Both backends in fp32. Logits: errors of ~1e-6 of their scale (a few chained reductions of at
// most d_ff = 48 terms per layer); 1e-4 of max|logit| leaves a wide margin. Loss and aux: means
// of many such terms; model_grad_test.cpp holds the CPU within 1e-5 (absolute, on losses of
// ~4.6) of PyTorch in fp64, so two fp32 backends within 2e-5 relative. Gradients:
// model_grad_test.cpp holds the CPU within 1e-4 of each tensor's scale plus 1e-5 of the model's
// of fp64 (it measures ~1e-7); a second fp32 backend may sit on the other side of the exact
// value, so twice that. A wrong term, index or factor gives errors of order 1e-2 .. 1.
inline constexpr ModelTolerances kFp32ModelTol = {
    .logits = 1e-4, .loss = 2e-5, .grad_tensor = 2e-4, .grad_model = 2e-5};

// Weights and tokens are fixed, so that the router's choices are the same on both backends
// (random ones could, rarely, hold a near-tie that rounding flips); the test checks that
// they are before it compares what depends on them. An inference forward (logits, loss,
// aux), then a training forward and backward (loss, aux, every parameter's gradient). The
// largest differences are printed.
void expect_model_matches_cpu(Backend& cpu, Backend& other, const std::string& config_name,
                              const ModelTolerances& tol);

// The same 30 steps (same initial weights, same batches) on the CPU and on another backend: the
// per-step losses agree within 1e-3 relative. The first step differs only by rounding (~1e-6);
// after it the weights drift apart by rounding, amplified by training. Measured on the CPU, 300
// seeds per config, by perturbing the initial weights by a relative 1e-7 (about fp32's rounding)
// and 1e-6 (ten times that): the losses drifted by at most 1.4e-5 and 8e-5 relative over the 30
// steps (before any routing change); only a 1e-5 perturbation reached 1e-3 (once in 300).
// Routing, though, is discrete: once the weights have drifted, a near-tie between router
// logits can send a token to another expert, after which the losses part ways legitimately (by
// up to 1e-2 in that measurement). The per-step expert load shows when that happens: steps are
// compared while the loads are identical. Of the 300 runs of test-tiny perturbed by 1e-6, 11%
// changed a route within the 30 steps, 2% within 5, none within 2: the test requires the first
// 2 steps to compare.
// The same 30 steps on both backends in `precision`; per-step losses within rel_tol.
void expect_losses_follow_the_cpu(Backend& cpu, Backend& other, uint64_t seed,
                                  const std::string& config_name, Precision precision,
                                  double rel_tol);

// A run stopped after step 15 and resumed from its checkpoint ends exactly where the
// uninterrupted run ends: the same kernels on the same data in the same order give the same
// bits, every step's loss and the final weights included (no float atomics, no
// scheduling-dependent reductions, checkpoints in full precision).
void expect_resumed_run_matches_uninterrupted(Backend& be, uint64_t seed);

}  // namespace tmx::test

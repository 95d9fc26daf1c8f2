// Generation: cached decoding against recomputing the whole sequence, batches against single
// prompts, and the cache's fixed memory (docs/design.md#6-rolling-kv-cache-and-generation).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "backends/registry.h"
#include "engine/infer/generator.h"
#include "engine/model/kv_cache.h"
#include "tests/model_scenarios.h"
#include "tests/test_util.h"

namespace tmx {
namespace {

using test::CacheCase;
using test::relative_error;
using test::spread_model;
using test::test_config;

class CachedDecoding : public ::testing::TestWithParam<CacheCase> {};

// At every step, cached logits equal those of running the whole sequence again: through the
// buffer wrapping (5 windows), with prompts longer than the window, for every chunk size.
TEST_P(CachedDecoding, MatchesRecomputingTheWholeSequence) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    auto be = make_backend("cpu");
    test::expect_cached_decoding_matches_recompute(*be, GetParam(), seed, 2e-5);
}

INSTANTIATE_TEST_SUITE_P(
    Generation, CachedDecoding,
    ::testing::Values(
        // test-tiny: window 8; lengths of 1, 3 and 5 windows; chunks 1, W/2 and W.
        CacheCase{"test-tiny", 1, 3, 0}, CacheCase{"test-tiny", 1, 8, 4},
        CacheCase{"test-tiny", 3, 5, 1}, CacheCase{"test-tiny", 3, 13, 4},
        CacheCase{"test-tiny", 3, 20, 0}, CacheCase{"test-tiny", 5, 11, 1},
        CacheCase{"test-tiny", 5, 19, 4}, CacheCase{"test-tiny", 5, 30, 0},
        // SwiGLU, rmsnorm, tied embeddings, 5 experts with top-3.
        CacheCase{"test-tiny-swiglu", 5, 17, 4}, CacheCase{"test-tiny-swiglu", 3, 9, 0},
        // Full attention: the cache holds max_seq_len positions.
        CacheCase{"test-tiny-dense", 1, 10, 4}, CacheCase{"test-tiny-dense", 1, 21, 1}),
    test::cache_case_name);

// Per-step logits of each sequence, recorded through the token callback.
struct Recorded {
    std::vector<TokenGeneration> results;
    std::vector<std::vector<std::vector<float>>> logits;  // [sequence][step][V]
};

Recorded run(Model& m, const std::vector<std::vector<int32_t>>& prompts,
             const GenerationOptions& o) {
    Recorded rec;
    rec.logits.resize(prompts.size());
    rec.results = generate_tokens(m, prompts, o, [&](size_t b, int32_t, std::span<const float> l) {
        rec.logits[b].emplace_back(l.begin(), l.end());
        return false;
    });
    return rec;
}

// True when the two largest logits are within `gap` (a choice an fp32 rounding could flip).
bool near_tie(const std::vector<float>& logits, double gap) {
    std::vector<float> l = logits;
    std::partial_sort(l.begin(), l.begin() + 2, l.end(), std::greater<float>());
    return l[0] - l[1] <= gap;
}

void expect_batch_matches_alone(const GenerationOptions& o, uint64_t seed) {
    auto be = make_backend("cpu");
    const ModelConfig c = test_config("test-tiny");
    auto model = spread_model(c, *be, seed);
    Rng rng(seed ^ 0x5eed);
    std::vector<std::vector<int32_t>> prompts;
    for (int64_t len : {3, 11, 1, 20})  // shorter and longer than the window of 8
        prompts.push_back(test::random_ints(rng, static_cast<size_t>(len), 0, 97));
    const Recorded batch = run(*model, prompts, o);
    for (size_t b = 0; b < prompts.size(); ++b) {
        SCOPED_TRACE("prompt " + std::to_string(b));
        const Recorded alone = run(*model, {prompts[b]}, o);
        const std::vector<int32_t>& got = batch.results[b].ids;
        const std::vector<int32_t>& want = alone.results[0].ids;
        ASSERT_EQ(batch.logits[b].size(), got.size());
        const size_t common = std::min(got.size(), want.size());
        bool flipped = false;
        for (size_t i = 0; i < common && !flipped; ++i) {
            ASSERT_LT(relative_error(batch.logits[b][i], alone.logits[0][i]), 2e-5) << "step " << i;
            if (got[i] != want[i]) {
                // Only a near-tie may flip a choice; after it the sequences differ.
                EXPECT_TRUE(near_tie(alone.logits[0][i], 1e-4)) << "step " << i;
                flipped = true;
            }
        }
        if (flipped) continue;
        // The whole list, so that a sequence ending a token early or late in the batch fails.
        EXPECT_EQ(got.size(), want.size());
        EXPECT_EQ(got, want);
        EXPECT_EQ(batch.results[b].stop_reason, alone.results[0].stop_reason);
    }
}

TEST(BatchedGeneration, GreedyGivesWhatEachPromptGivesAlone) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    GenerationOptions o;
    o.max_new_tokens = 30;
    o.sampling.temperature = 0.0;
    o.end_ids = {5};
    expect_batch_matches_alone(o, seed);
}

TEST(BatchedGeneration, SamplingWithASeedGivesWhatEachPromptGivesAlone) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    GenerationOptions o;
    o.max_new_tokens = 30;
    o.seed = seed;
    o.sampling = {
        .repetition_penalty = 1.3, .temperature = 1.0, .top_k = 0, .top_p = 0.9, .min_p = 0.02};
    o.prefill_chunk = 3;
    expect_batch_matches_alone(o, seed);
}

// Same seed, same tokens; another seed, other tokens; a prompt repeated within a batch samples
// differently per copy, and its first copy gives what the prompt gives alone.
TEST(BatchedGeneration, SeedsAndRepeatedPrompts) {
    auto be = make_backend("cpu");
    auto model = spread_model(test_config("test-tiny"), *be, 7);
    GenerationOptions o;
    o.max_new_tokens = 40;
    o.sampling = {.temperature = 1.5, .top_k = 0, .top_p = 1.0, .min_p = 0.0};
    o.seed = 11;
    const auto a = generate_tokens(*model, {{1, 2, 3}}, o);
    const auto twice = generate_tokens(*model, {{1, 2, 3}, {1, 2, 3}}, o);
    EXPECT_EQ(twice[0].ids, a[0].ids);
    EXPECT_NE(twice[1].ids, a[0].ids);
    o.seed = 12;
    EXPECT_NE(generate_tokens(*model, {{1, 2, 3}}, o)[0].ids, a[0].ids);
}

TEST(Generation, StopsAtEndIdsAndAtTheTokenBudget) {
    auto be = make_backend("cpu");
    auto model = spread_model(test_config("test-tiny"), *be, 3);
    GenerationOptions o;
    o.sampling.temperature = 0.0;
    o.max_new_tokens = 12;
    const auto free_run = generate_tokens(*model, {{4, 5, 6}}, o);
    ASSERT_EQ(free_run[0].ids.size(), 12u);
    EXPECT_EQ(free_run[0].stop_reason, StopReason::Length);
    o.end_ids = {free_run[0].ids[4]};
    const auto stopped = generate_tokens(*model, {{4, 5, 6}}, o);
    const auto first = std::find(free_run[0].ids.begin(), free_run[0].ids.end(), o.end_ids[0]);
    EXPECT_EQ(stopped[0].ids,
              std::vector<int32_t>(free_run[0].ids.begin(), first + 1));  // EOS included
    EXPECT_EQ(stopped[0].stop_reason, StopReason::Eos);
    o.max_new_tokens = 0;
    EXPECT_TRUE(generate_tokens(*model, {{4, 5, 6}}, o)[0].ids.empty());
}

TEST(Generation, FullAttentionStopsAtMaxSeqLen) {
    auto be = make_backend("cpu");
    const ModelConfig c = test_config("test-tiny-dense");  // max_seq_len 32, no window
    auto model = spread_model(c, *be, 5);
    GenerationOptions o;
    o.sampling.temperature = 0.0;
    o.max_new_tokens = 100;
    const auto r = generate_tokens(*model, {std::vector<int32_t>(10, 3)}, o);
    EXPECT_EQ(r[0].stop_reason, StopReason::Length);
    // Tokens at positions 0 .. max_seq_len - 1 are fed; the last one predicts one more.
    EXPECT_EQ(static_cast<int64_t>(r[0].ids.size()), c.max_seq_len - 10 + 1);
    EXPECT_THROW(generate_tokens(*model, {std::vector<int32_t>(33, 3)}, o), Error);
}

TEST(Generation, RejectsAPrefillChunkLargerThanTheWindow) {
    auto be = make_backend("cpu");
    auto model = spread_model(test_config("test-tiny"), *be, 5);
    GenerationOptions o;
    o.prefill_chunk = 9;  // window 8
    EXPECT_THROW(generate_tokens(*model, {{1, 2}}, o), UsageError);
}

// The cache has W slots: generating 5 windows' worth of tokens takes no more memory than one.
TEST(Generation, MemoryDoesNotGrowWithLength) {
    auto be = make_backend("cpu");
    const ModelConfig c = test_config("test-tiny");
    auto model = spread_model(c, *be, 9);
    const int64_t W = kv_cache_slots(c);
    GenerationOptions o;
    o.sampling.temperature = 0.0;
    auto peak_for = [&](int64_t new_tokens) {
        o.max_new_tokens = new_tokens;
        be->reset_peak_memory();
        const size_t before = be->memory_stats().live_bytes;
        const auto r = generate_tokens(*model, {{1, 2, 3}}, o);
        EXPECT_EQ(static_cast<int64_t>(r[0].ids.size()), new_tokens);
        return be->memory_stats().peak_bytes - before;
    };
    const size_t one_window = peak_for(W), five_windows = peak_for(5 * W);
    EXPECT_GT(one_window, KvCache(c, *be, 1).bytes());
    EXPECT_EQ(five_windows, one_window);
}

}  // namespace
}  // namespace tmx

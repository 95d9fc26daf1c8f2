// Continuous batching: sequences that join and leave a running batch give what they give alone,
// a cancelled sequence frees its slot at once, and slots are reused through the rolling buffer.
#include "engine/infer/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "backends/cpu/cpu_backend.h"
#include "backends/registry.h"
#include "engine/core/errors.h"
#include "engine/core/threads.h"
#include "engine/infer/serve_loop.h"
#include "engine/model/kv_cache.h"
#include "tests/model_scenarios.h"
#include "tests/test_util.h"

namespace tmx {
namespace {

using test::relative_error;

struct Recorded {
    TokenGeneration result;
    std::vector<std::vector<float>> logits;  // per drawn token
    bool done = false;
};

SequenceRequest request(const std::vector<int32_t>& prompt, int64_t max_new, uint64_t seed,
                        Recorded& run) {
    SequenceRequest r;
    r.prompt = prompt;
    r.max_new_tokens = max_new;
    r.sampling.temperature = 0.9;
    r.sampling.top_k = 20;
    r.stream_seed = seed;
    r.on_token = [&run](int32_t, std::span<const float> l) {
        run.logits.emplace_back(l.begin(), l.end());
        return false;
    };
    r.on_done = [&run](TokenGeneration&& g) {
        run.result = std::move(g);
        run.done = true;
    };
    return r;
}

bool near_tie(const std::vector<float>& logits, double gap) {
    std::vector<float> l = logits;
    std::partial_sort(l.begin(), l.begin() + 2, l.end(), std::greater<float>());
    return l[0] - l[1] <= gap;
}

// Token by token the same; the logits within fp32 noise of the other rows' company (the experts'
// grouped matmuls see other row counts), and a differing token only at a near tie.
void expect_same(const Recorded& got, const Recorded& want) {
    const auto& a = got.result.ids;
    const auto& b = want.result.ids;
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
        ASSERT_LT(relative_error(got.logits[i], want.logits[i]), 2e-5) << "step " << i;
        if (a[i] != b[i]) {
            EXPECT_TRUE(near_tie(want.logits[i], 1e-4)) << "step " << i;
            return;
        }
    }
    EXPECT_EQ(a, b);
    EXPECT_EQ(got.result.stop_reason, want.result.stop_reason);
}

TEST(Scheduler, SequencesJoiningAndLeavingARunningBatchGiveWhatTheyGiveAlone) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("TMX_TEST_SEED=" + std::to_string(seed));
    auto be = make_backend("cpu");
    const ModelConfig c = test::test_config("test-tiny-swiglu");  // window 8
    auto model = test::spread_model(c, *be, seed);
    Rng rng(seed ^ 0x51075);
    struct Spec {
        std::vector<int32_t> prompt;
        int64_t max_new;
        uint64_t seed;
        int64_t arrives;  // the step at which it is submitted
    };
    std::vector<Spec> specs;
    for (int i = 0; i < 7; ++i)
        specs.push_back(
            {test::random_ints(rng, 1 + rng.below(20), 0, static_cast<int32_t>(c.vocab_size)),
             1 + static_cast<int64_t>(rng.below(25)), rng.next_u64(),
             static_cast<int64_t>(rng.below(12))});
    SchedulerOptions so;
    so.slots = 3;
    so.prefill_chunk = 3;
    so.prefill_tokens_per_step = 4;  // prefill interleaved with decode steps, as a server runs
    std::vector<Recorded> together(specs.size());
    {
        Scheduler s(*model, so);
        size_t submitted = 0;
        for (int64_t step = 0; step < 10000; ++step) {
            for (size_t i = 0; i < specs.size(); ++i)
                if (specs[i].arrives == step) {
                    s.submit(
                        request(specs[i].prompt, specs[i].max_new, specs[i].seed, together[i]));
                    ++submitted;
                }
            EXPECT_LE(s.running(), 3);
            if (!s.step() && submitted == specs.size()) break;
        }
    }
    for (size_t i = 0; i < specs.size(); ++i) {
        SCOPED_TRACE("sequence " + std::to_string(i));
        ASSERT_TRUE(together[i].done);
        Recorded alone;
        Scheduler s(*model, so);
        s.submit(request(specs[i].prompt, specs[i].max_new, specs[i].seed, alone));
        s.run_until_idle();
        expect_same(together[i], alone);
        EXPECT_EQ(together[i].result.prompt_ids, specs[i].prompt);
        EXPECT_GT(together[i].result.prefill_seconds, 0.0);
    }
}

// Greedy, on a timeline fixed in advance (every prefill in the step of its admission): a
// sequence admitted at step a draws its first token from the prefill and one more in each decode
// step, so with max_new_tokens n it ends at step a + n - 2. Three sequences end in the decode of
// step 7 while a fourth joins in that step and decodes beside their last tokens; three more wait
// for the freed slots (one ends at its first token, in its prefill) and two sequences end
// together again at step 11. Each gives its whole token list, every token and its length, as it
// does alone.
TEST(Scheduler, SequencesEndingTogetherAndOneJoiningThatStepGiveWhatTheyGiveAlone) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("TMX_TEST_SEED=" + std::to_string(seed));
    auto be = make_backend("cpu");
    const ModelConfig c = test::test_config("test-tiny-swiglu");  // window 8
    auto model = test::spread_model(c, *be, seed);
    Rng rng(seed ^ 0x70637e);
    struct Spec {
        const char* name;
        int64_t prompt_length, max_new, arrives, ends;
    };
    const std::vector<Spec> specs = {
        {"a", 5, 9, 0, 7},  {"b", 11, 9, 0, 7},  // 11 tokens: three chunks in step 0
        {"c", 1, 7, 2, 7},  {"d", 6, 6, 7, 11},  // d joins as a, b and c end
        {"e", 3, 4, 7, 10}, {"f", 9, 1, 7, 8},   // e, f and g wait for their slots
        {"g", 2, 5, 7, 11},
    };
    std::vector<std::vector<int32_t>> prompts;
    for (const Spec& spec : specs)
        prompts.push_back(test::random_ints(rng, static_cast<size_t>(spec.prompt_length), 0,
                                            static_cast<int32_t>(c.vocab_size)));
    auto greedy = [&](size_t i, Recorded& run) {
        SequenceRequest r = request(prompts[i], specs[i].max_new, 0, run);
        r.sampling = SamplingOptions{.temperature = 0.0};
        return r;
    };
    SchedulerOptions so;
    so.slots = 4;
    so.prefill_chunk = 4;
    std::vector<Recorded> together(specs.size());
    Scheduler s(*model, so);
    for (int64_t step = 0; step <= 11; ++step) {
        for (size_t i = 0; i < specs.size(); ++i)
            if (specs[i].arrives == step) s.submit(greedy(i, together[i]));
        ASSERT_TRUE(s.step()) << "step " << step;
        // The timeline above, so that the company really is what this test says it is.
        for (size_t i = 0; i < specs.size(); ++i)
            ASSERT_EQ(together[i].done, specs[i].ends <= step)
                << specs[i].name << " at step " << step;
        if (step == 7) {
            EXPECT_EQ(s.running(), 1);  // d
            EXPECT_EQ(s.waiting(), 3);  // e, f, g
        }
    }
    EXPECT_FALSE(s.step());
    for (size_t i = 0; i < specs.size(); ++i) {
        SCOPED_TRACE(specs[i].name);
        Recorded alone;
        Scheduler single(*model, so);
        single.submit(greedy(i, alone));
        single.run_until_idle();
        ASSERT_TRUE(alone.done);
        const auto& got = together[i].result;
        EXPECT_EQ(got.stop_reason, StopReason::Length);
        EXPECT_EQ(alone.result.stop_reason, StopReason::Length);
        EXPECT_EQ(got.ids.size(), static_cast<size_t>(specs[i].max_new));
        EXPECT_EQ(alone.result.ids.size(), static_cast<size_t>(specs[i].max_new));
        EXPECT_EQ(got.prompt_ids, prompts[i]);
        // Every token the same, unless the logits (within fp32 noise of the company) put two
        // tokens within a rounding of each other, after which the lists may part.
        bool flipped = false;
        for (size_t t = 0; t < std::min(got.ids.size(), alone.result.ids.size()) && !flipped; ++t) {
            ASSERT_LT(relative_error(together[i].logits[t], alone.logits[t]), 2e-5)
                << "token " << t;
            flipped = got.ids[t] != alone.result.ids[t];
            if (flipped) {
                EXPECT_TRUE(near_tie(alone.logits[t], 1e-4)) << "token " << t;
            }
        }
        if (!flipped) {
            EXPECT_EQ(got.ids, alone.result.ids);
        }
    }
}

TEST(Scheduler, ACancelledSequenceFreesItsSlotForTheNextAtOnce) {
    const uint64_t seed = test::fresh_seed();
    auto be = make_backend("cpu");
    const ModelConfig c = test::test_config("test-tiny-swiglu");
    auto model = test::spread_model(c, *be, seed);
    Rng rng(seed);
    SchedulerOptions so;
    so.slots = 1;
    Scheduler s(*model, so);
    Recorded endless, next, queued_then_cancelled;
    const Scheduler::Id a = s.submit(request(
        test::random_ints(rng, 5, 0, static_cast<int32_t>(c.vocab_size)), 100000, 1, endless));
    for (int i = 0; i < 30; ++i) ASSERT_TRUE(s.step());  // well past the window of 8
    EXPECT_FALSE(endless.done);
    const std::vector<int32_t> prompt =
        test::random_ints(rng, 12, 0, static_cast<int32_t>(c.vocab_size));
    s.submit(request(prompt, 15, 2, next));
    const Scheduler::Id c_id = s.submit(request(prompt, 15, 3, queued_then_cancelled));
    EXPECT_EQ(s.waiting(), 2);
    s.cancel(a);
    s.cancel(c_id);
    s.step();
    EXPECT_TRUE(endless.done);
    EXPECT_EQ(endless.result.stop_reason, StopReason::Cancelled);
    EXPECT_EQ(endless.result.ids.size(), 31u);  // one drawn at the end of its prefill, 30 decoded
    EXPECT_TRUE(queued_then_cancelled.done);
    EXPECT_EQ(queued_then_cancelled.result.stop_reason, StopReason::Cancelled);
    EXPECT_TRUE(queued_then_cancelled.result.ids.empty());
    EXPECT_EQ(s.running(), 1);  // `next` took the freed slot in the same step
    s.run_until_idle();
    ASSERT_TRUE(next.done);
    // The slot's stale keys from the long sequence are never read by the new one.
    Recorded alone;
    Scheduler fresh(*model, so);
    fresh.submit(request(prompt, 15, 2, alone));
    fresh.run_until_idle();
    EXPECT_EQ(next.result.ids, alone.result.ids);
    EXPECT_EQ(next.logits, alone.logits);
}

// A prompt's logits at every position (for scoring text) are the whole sequence's, row by row:
// through a rolling buffer that wraps (19 tokens, window 8), in chunks of 3 ending with one of a
// single token, beside another sequence; the last position's are those of the first drawn token.
TEST(Scheduler, PromptLogitsAreTheWholeSequencesAtEveryPosition) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("TMX_TEST_SEED=" + std::to_string(seed));
    auto be = make_backend("cpu");
    const ModelConfig c = test::test_config("test-tiny-swiglu");  // window 8
    auto model = test::spread_model(c, *be, seed);
    Rng rng(seed ^ 0x9e0);
    const int64_t V = c.vocab_size;
    const std::vector<int32_t> prompt = test::random_ints(rng, 19, 0, static_cast<int32_t>(V));
    std::vector<float> whole(static_cast<size_t>(19 * V));
    be->download(model->forward(prompt, 1, 19).logits, whole.data());
    auto row = [&](int64_t p) {
        return std::vector<float>(whole.begin() + p * V, whole.begin() + (p + 1) * V);
    };

    SchedulerOptions so;
    so.slots = 2;
    so.prefill_chunk = 3;
    Scheduler s(*model, so);
    Recorded other, scored;
    s.submit(request(test::random_ints(rng, 5, 0, static_cast<int32_t>(V)), 12, 1, other));
    s.step();
    std::vector<int64_t> positions;
    SequenceRequest r = request(prompt, 2, 2, scored);
    r.on_prompt_logits = [&](int64_t position, std::span<const float> logits) {
        ASSERT_EQ(logits.size(), static_cast<size_t>(V));
        EXPECT_LT(relative_error(std::vector<float>(logits.begin(), logits.end()), row(position)),
                  2e-5)
            << "position " << position;
        positions.push_back(position);
    };
    s.submit(std::move(r));
    s.run_until_idle();
    std::vector<int64_t> all(19);
    for (int64_t p = 0; p < 19; ++p) all[static_cast<size_t>(p)] = p;
    EXPECT_EQ(positions, all);
    ASSERT_TRUE(scored.done);
    ASSERT_FALSE(scored.logits.empty());
    EXPECT_LT(relative_error(scored.logits[0], row(18)), 2e-5);
}

// forward_cached hands every chunk row's logits over in blocks of the rows asked for.
TEST(Scheduler, ForwardCachedGivesEveryRowsLogitsInBlocks) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("TMX_TEST_SEED=" + std::to_string(seed));
    auto be = make_backend("cpu");
    const ModelConfig c = test::test_config("test-tiny");
    auto model = test::spread_model(c, *be, seed);
    Rng rng(seed ^ 0xb10c);
    const int64_t V = c.vocab_size;
    const std::vector<int32_t> prompt = test::random_ints(rng, 7, 0, static_cast<int32_t>(V));
    std::vector<float> whole(static_cast<size_t>(7 * V));
    be->download(model->forward(prompt, 1, 7).logits, whole.data());
    KvCache cache(c, *be, 1);
    std::vector<int64_t> firsts, sizes;
    const Tensor last = model->forward_cached(
        prompt, 1, 7, {0}, cache,
        [&](int64_t first, const Tensor& block) {
            firsts.push_back(first);
            sizes.push_back(block.dim(0));
            std::vector<float> got(static_cast<size_t>(block.numel()));
            be->download(block, got.data());
            const std::vector<float> want(whole.begin() + first * V,
                                          whole.begin() + (first + block.dim(0)) * V);
            EXPECT_LT(relative_error(got, want), 2e-5) << "block at row " << first;
        },
        /*block_rows=*/2);
    EXPECT_EQ(firsts, (std::vector<int64_t>{0, 2, 4, 6}));
    EXPECT_EQ(sizes, (std::vector<int64_t>{2, 2, 2, 1}));
    std::vector<float> got_last(static_cast<size_t>(V));
    be->download(last, got_last.data());
    EXPECT_LT(relative_error(got_last, std::vector<float>(whole.end() - V, whole.end())), 2e-5);
}

TEST(Scheduler, BadRequestsAreRefusedAtSubmit) {
    auto be = make_backend("cpu");
    const ModelConfig c = test::test_config("test-tiny-dense");  // full attention
    auto model = test::spread_model(c, *be, 1);
    Scheduler s(*model, {});
    Recorded r;
    EXPECT_NE(test::error_of([&] { s.submit(request({}, 4, 1, r)); }), "");
    EXPECT_NE(test::error_of([&] {
                  s.submit(request(std::vector<int32_t>(c.max_seq_len + 1, 1), 4, 1, r));
              }).find("longer than this full-attention model's max_seq_len"),
              std::string::npos);
    EXPECT_NE(test::error_of([&] {
                  s.submit(request({1, int32_t(c.vocab_size)}, 4, 1, r));
              }).find("outside the vocabulary"),
              std::string::npos);
    // A sequence reaching max_seq_len ends with Length.
    Recorded full;
    s.submit(request(std::vector<int32_t>(c.max_seq_len - 2, 3), 100, 1, full));
    s.run_until_idle();
    ASSERT_TRUE(full.done);
    EXPECT_EQ(full.result.stop_reason, StopReason::Length);
    EXPECT_EQ(full.result.ids.size(), 3u);  // fed at L-2 and L-1; the third drawn from L-1
}

TEST(Scheduler, ThePrefillBudgetTakesTheOldestPromptsFirstAndAtLeastOneChunk) {
    auto be = make_backend("cpu");
    const ModelConfig c = test::test_config("test-tiny-swiglu");  // window 8
    auto model = test::spread_model(c, *be, test::fresh_seed());
    Rng rng(test::fresh_seed());
    auto prompt = [&](int64_t n) {
        return test::random_ints(rng, n, 0, static_cast<int32_t>(c.vocab_size));
    };
    SchedulerOptions so;
    so.slots = 4;
    so.prefill_tokens_per_step = 5;
    Scheduler s(*model, so);
    std::vector<Recorded> r(4);
    s.submit(request(prompt(2), 50, 1, r[0]));
    s.submit(request(prompt(3), 50, 2, r[1]));
    s.submit(request(prompt(1), 50, 3, r[2]));  // would fit beside the first two: it waits its turn
    s.submit(request(prompt(8), 50, 4, r[3]));  // a whole chunk, more than the budget
    s.step();  // prefills 2 + 3 tokens, draws their first tokens, decodes them once
    EXPECT_EQ(r[0].logits.size(), 2u);
    EXPECT_EQ(r[1].logits.size(), 2u);
    EXPECT_TRUE(r[2].logits.empty());
    EXPECT_TRUE(r[3].logits.empty());
    s.step();  // 1 token, then the 8-token chunk does not fit the 4 left
    EXPECT_EQ(r[2].logits.size(), 2u);
    EXPECT_TRUE(r[3].logits.empty());
    s.step();  // alone in a step, a chunk larger than the budget still runs
    EXPECT_EQ(r[3].logits.size(), 2u);
}

// The CPU backend with faults on demand at the logits' download (the host's read of a step's
// results): a NaN written into one sequence's row, or an exception as a failing device gives.
// Counts the logits downloads the scheduler makes and its argmax_rows calls (whose host
// default downloads the logits too, not counted).
struct FaultyCpu : CpuBackend {
    int64_t vocab = 0;
    int64_t nan_row = -1;           // in the next logits download
    int throws = 0;                 // logits downloads left to fail
    std::atomic<bool> hold{false};  // while true, a logits download waits (a step in progress)
    int64_t logits_downloads = 0, argmax_calls = 0;

  protected:
    void argmax_rows_impl(const Tensor& logits, int32_t* tokens) override {
        ++argmax_calls;
        in_argmax_ = true;
        CpuBackend::argmax_rows_impl(logits, tokens);
        in_argmax_ = false;
    }
    void download_impl(const Tensor& src, void* host) override {
        const bool logits = src.rank() >= 1 && src.dim(-1) == vocab;
        logits_downloads += logits && !in_argmax_;
        while (logits && hold) std::this_thread::yield();
        if (logits && throws > 0) {
            --throws;
            throw Error("injected device fault");
        }
        CpuBackend::download_impl(src, host);
        if (logits && nan_row >= 0 && nan_row < src.numel() / vocab) {
            static_cast<float*>(host)[nan_row * vocab + 7] = NAN;
            nan_row = -1;
        }
    }

  private:
    bool in_argmax_ = false;
};

// A test-tiny-swiglu model (window 8) on a FaultyCpu.
struct FaultyModel {
    FaultyCpu be;
    const ModelConfig c = test::test_config("test-tiny-swiglu");
    std::unique_ptr<Model> model;
    explicit FaultyModel(uint64_t seed) {
        be.vocab = c.vocab_size;
        model = test::spread_model(c, be, seed);
    }
    std::vector<int32_t> prompt(Rng& rng, int64_t n) const {
        return test::random_ints(rng, n, 0, static_cast<int32_t>(c.vocab_size));
    }
};

// Three sequences of 2, 3 and 4 prompt tokens in as many slots, on a FaultyModel.
class FaultyScheduler : public ::testing::Test {
  protected:
    FaultyScheduler() {
        for (int i = 0; i < 3; ++i) prompts.push_back(fm.prompt(rng, 2 + i));
        so.slots = 3;
    }
    const uint64_t seed = test::fresh_seed();
    FaultyModel fm{seed};
    FaultyCpu& be = fm.be;
    Rng rng{seed};
    std::vector<std::vector<int32_t>> prompts;
    SchedulerOptions so;
};

TEST_F(FaultyScheduler, NonFiniteLogitsFailThatSequenceAloneAndTheOthersGoOn) {
    SCOPED_TRACE("TMX_TEST_SEED=" + std::to_string(seed));
    Scheduler s(*fm.model, so);
    std::vector<Recorded> r(3);
    for (int i = 0; i < 3; ++i) s.submit(request(prompts[i], 12, 10 + i, r[i]));
    s.step();  // prefills, first tokens, one decode step
    ASSERT_EQ(r[1].logits.size(), 2u);
    be.nan_row = 1;  // the next decode step's row of the second sequence
    s.run_until_idle();
    ASSERT_TRUE(r[1].done);
    EXPECT_EQ(r[1].result.stop_reason, StopReason::Failed);
    EXPECT_NE(r[1].result.error.find("not finite"), std::string::npos) << r[1].result.error;
    EXPECT_EQ(r[1].result.ids.size(), 2u);  // nothing drawn from the NaN row
    for (int i : {0, 2}) {
        SCOPED_TRACE("sequence " + std::to_string(i));
        Recorded alone;
        Scheduler fresh(*fm.model, so);
        fresh.submit(request(prompts[static_cast<size_t>(i)], 12, 10 + i, alone));
        fresh.run_until_idle();
        expect_same(r[static_cast<size_t>(i)], alone);
    }
}

// Greedy sequences whose on_token reads no logits: each decode step takes their tokens from
// the backend's argmax_rows and downloads no logits (only each prompt's last position's, for
// the first token), on_token sees none, and the tokens are those the host draws from the
// downloaded logits. A NaN in one row fails that sequence alone, as on the host's path.
TEST_F(FaultyScheduler, GreedySequencesThatReadNoLogitsTakeTheBackendsArgmax) {
    SCOPED_TRACE("TMX_TEST_SEED=" + std::to_string(seed));
    const int64_t max_new = 10;
    auto run = [&](bool reads_logits, int64_t nan_row) {
        std::vector<Recorded> r(prompts.size());
        Scheduler s(*fm.model, so);
        for (size_t i = 0; i < prompts.size(); ++i) {
            SequenceRequest q = request(prompts[i], max_new, 10 + i, r[i]);
            q.sampling.temperature = 0.0;
            q.on_token_reads_logits = reads_logits;
            s.submit(std::move(q));
        }
        be.logits_downloads = be.argmax_calls = 0;
        s.step();  // prefills, first tokens, one decode step
        be.nan_row = nan_row;
        s.run_until_idle();
        return r;
    };
    const std::vector<Recorded> host = run(true, -1);
    EXPECT_EQ(be.argmax_calls, 0);
    EXPECT_EQ(be.logits_downloads, 3 + (max_new - 1));  // the prefills', every decode step's
    const std::vector<Recorded> device = run(false, -1);
    EXPECT_EQ(be.argmax_calls, max_new - 1);
    EXPECT_EQ(be.logits_downloads, 3);
    for (size_t i = 0; i < prompts.size(); ++i) {
        SCOPED_TRACE("sequence " + std::to_string(i));
        ASSERT_TRUE(device[i].done);
        EXPECT_EQ(device[i].result.ids, host[i].result.ids);
        EXPECT_EQ(device[i].result.stop_reason, host[i].result.stop_reason);
        ASSERT_EQ(device[i].logits.size(), static_cast<size_t>(max_new));
        EXPECT_TRUE(device[i].logits.back().empty());  // a decode step's token: no logits
        EXPECT_EQ(host[i].logits.back().size(), static_cast<size_t>(fm.c.vocab_size));
    }
    // The second decode step's row of the second sequence holds a NaN.
    const std::vector<Recorded> faulty = run(false, 1);
    EXPECT_EQ(faulty[1].result.stop_reason, StopReason::Failed);
    EXPECT_NE(faulty[1].result.error.find("not finite"), std::string::npos)
        << faulty[1].result.error;
    EXPECT_EQ(faulty[1].result.ids.size(), 2u);
    for (size_t i : {0u, 2u}) EXPECT_EQ(faulty[i].result.ids, host[i].result.ids) << i;
}

// Requests to a ServeLoop, each recording its outcome.
struct Outcomes {
    std::mutex mutex;
    std::condition_variable changed;
    std::map<int, TokenGeneration> done;
    SequenceRequest request(std::vector<int32_t> prompt, int key, int64_t max_new) {
        SequenceRequest q;
        q.prompt = std::move(prompt);
        q.max_new_tokens = max_new;
        q.stream_seed = static_cast<uint64_t>(key);
        q.on_done = [this, key](TokenGeneration&& g) {
            std::lock_guard<std::mutex> lock(mutex);
            done[key] = std::move(g);
            changed.notify_all();
        };
        return q;
    }
    TokenGeneration wait(int key) {
        std::unique_lock<std::mutex> lock(mutex);
        EXPECT_TRUE(
            changed.wait_for(lock, std::chrono::seconds(60), [&] { return done.count(key) > 0; }))
            << "request " << key << " never ended";
        return done[key];
    }
};

// The engine thread computes with the thread count its creator was given (`tmx serve --threads`),
// not OpenMP's default for a new thread (every core). 3 is neither this machine's default nor 1.
TEST(ServeLoop, TheEngineThreadTakesItsCreatorsThreadCount) {
    FaultyModel fm(test::fresh_seed());
    Rng rng(test::fresh_seed());
    SchedulerOptions so;
    so.slots = 1;
    Outcomes out;
    struct RestoreThreads {  // the other tests of this process keep their count, on any exit
        int before = num_threads();
        ~RestoreThreads() { set_num_threads(before); }
    } restore;
    const int wanted = restore.before == 3 ? 4 : 3;
    set_num_threads(wanted);
    std::atomic<int> seen{0};
    {
        ServeLoop loop(*fm.model, so, 8, {});
        SequenceRequest q = out.request(fm.prompt(rng, 3), 0, 2);
        q.on_token = [&](int32_t, std::span<const float>) {  // runs on the engine thread
            seen = num_threads();
            return false;
        };
        ASSERT_TRUE(loop.submit(std::move(q)));
        EXPECT_EQ(out.wait(0).stop_reason, StopReason::Length);
    }
    EXPECT_EQ(seen.load(), wanted);
}

TEST(ServeLoop, AFailedStepFailsItsRequestsAndTheNextAreServed) {
    FaultyModel fm(test::fresh_seed());
    Rng rng(test::fresh_seed());
    auto prompt = [&] { return fm.prompt(rng, 4); };
    SchedulerOptions so;
    so.slots = 2;
    Outcomes out;
    std::string gave_up;
    {
        fm.be.throws = ServeLoop::kMaxFailedSteps - 1;  // fewer than the loop gives up at
        ServeLoop loop(*fm.model, so, 8, [&](const std::string& why) { gave_up = why; });
        for (int k : {0, 1}) {  // a failed step each
            ASSERT_TRUE(loop.submit(out.request(prompt(), k, 5)));
            const TokenGeneration failed = out.wait(k);
            EXPECT_EQ(failed.stop_reason, StopReason::Failed);
            EXPECT_NE(failed.error.find("injected device fault"), std::string::npos)
                << failed.error;
        }
        // The device recovered: the loop serves on.
        ASSERT_TRUE(loop.submit(out.request(prompt(), 2, 5)));
        ASSERT_TRUE(loop.submit(out.request(prompt(), 3, 5)));
        for (int k : {2, 3}) {
            const TokenGeneration g = out.wait(k);
            EXPECT_EQ(g.stop_reason, StopReason::Length) << g.error;
            EXPECT_EQ(g.ids.size(), 5u);
        }
        EXPECT_EQ(loop.failure(), "");
    }
    EXPECT_EQ(gave_up, "");
}

TEST(ServeLoop, StepsFailingInARowEndEveryRequestAndTheLoop) {
    FaultyModel fm(test::fresh_seed());
    Rng rng(test::fresh_seed());
    SchedulerOptions so;
    so.slots = 1;
    Outcomes out;
    std::mutex m;
    std::condition_variable cv;
    std::string gave_up;
    fm.be.throws = 1000;
    fm.be.hold = true;  // the first step waits until every request is in
    ServeLoop loop(*fm.model, so, 64, [&](const std::string& why) {
        std::lock_guard<std::mutex> lock(m);
        gave_up = why;
        cv.notify_all();
    });
    for (int k = 0; k < 6; ++k)  // more than the steps it takes to give up: some wait
        EXPECT_TRUE(loop.submit(out.request(fm.prompt(rng, 3), k, 4)));
    fm.be.hold = false;
    {
        std::unique_lock<std::mutex> lock(m);
        ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return !gave_up.empty(); }));
    }
    EXPECT_EQ(gave_up, "injected device fault");
    for (int k = 0; k < 6; ++k) {
        const TokenGeneration g = out.wait(k);
        EXPECT_EQ(g.stop_reason, StopReason::Failed) << k;
        EXPECT_NE(g.error.find("injected device fault"), std::string::npos) << g.error;
    }
    EXPECT_EQ(loop.failure(), "injected device fault");
    EXPECT_FALSE(loop.submit(out.request({1, 2}, 99, 4)));  // refused, not queued forever
}

}  // namespace
}  // namespace tmx

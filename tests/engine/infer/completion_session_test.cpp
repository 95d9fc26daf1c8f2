// The serving session without HTTP (engine/infer/completion_session.h): log-probabilities of
// drawn and echoed prompt tokens against the log-softmax of the model's own logits, stop strings
// cutting the text exactly, penalties and logit bias steering the draws as specified, several
// prompts with several choices each, the streamed updates adding up to the choices, and the
// requests it refuses.
#include "engine/infer/completion_session.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <optional>
#include <thread>

#include "backends/registry.h"
#include "engine/infer/serve_loop.h"
#include "tests/model_scenarios.h"
#include "tests/test_util.h"

namespace tmx {
namespace {

// The shipped demo's tokenizer (2,048 pieces) over a random test-tiny model of that vocabulary.
class CompletionSessionTest : public ::testing::Test {
  protected:
    void SetUp() override {
        seed_ = test::fresh_seed();
        rng_ = std::make_unique<Rng>(seed_);
        tokenizer_ = std::make_unique<Tokenizer>(
            Tokenizer::load(test::source_dir() + "/assets/demo/tokenizer.model"));
        be_ = make_backend("cpu");
        config_ = test::test_config("test-tiny");  // window 8
        config_.vocab_size = tokenizer_->vocab_size();
    }

    // A model with logits spread out (greedy choices rarely near-ties), or with the small logits
    // of a fresh initialisation (a flat distribution: penalties of ~1 decide, and random streams
    // part ways).
    void make_model(bool spread) {
        if (spread) {
            model_ = test::spread_model(config_, *be_, seed_);
        } else {
            model_ = std::make_unique<Model>(config_, *be_);
            model_->init_random(seed_);
        }
    }

    // A loop and a session on it; one slot runs one sequence at a time, so that each computes
    // exactly what it computes alone.
    void start_serving(int64_t slots = 1, int64_t max_waiting = 64,
                       int64_t max_scored_tokens = 65536) {
        SchedulerOptions so;
        so.slots = slots;
        so.prefill_tokens_per_step = serving_prefill_budget(config_, 0);
        loop_ = std::make_unique<ServeLoop>(*model_, so, max_waiting);
        CompletionSessionOptions o;
        o.max_scored_tokens = max_scored_tokens;
        session_ = std::make_unique<CompletionSession>(*tokenizer_, *loop_, o);
    }

    std::shared_ptr<Completion> complete(const CompletionParams& p) {
        std::shared_ptr<Completion> c = session_->start(p);
        c->wait();
        return c;
    }

    // A few random words of lower-case letters, one space apart: text that SentencePiece's
    // normalisation leaves as it is, so that its pieces decode back to it.
    std::string random_text(size_t words) {
        std::string text;
        for (size_t w = 0; w < words; ++w) {
            if (w > 0) text += ' ';
            for (size_t n = 1 + rng_->below(6); n > 0; --n)
                text += static_cast<char>('a' + rng_->below(26));
        }
        return text;
    }
    std::vector<int32_t> random_ids(size_t n) {
        return test::random_ints(*rng_, n, 3, static_cast<int32_t>(config_.vocab_size));
    }
    // A string prompt as the session feeds it: BOS, then its pieces.
    std::vector<int32_t> prompt_ids(const std::string& text) const {
        std::vector<int32_t> ids{tokenizer_->bos_id()};
        for (int32_t id : tokenizer_->encode(text)) ids.push_back(id);
        return ids;
    }

    // The model's logits at every position of `tokens`, from one forward pass over all of them.
    std::vector<std::vector<float>> logits_at_every_position(const std::vector<int32_t>& tokens) {
        const int64_t n = static_cast<int64_t>(tokens.size()), V = config_.vocab_size;
        std::vector<float> all(static_cast<size_t>(n * V));
        be_->download(model_->forward(tokens, 1, n).logits, all.data());
        std::vector<std::vector<float>> rows;
        for (int64_t p = 0; p < n; ++p)
            rows.emplace_back(all.begin() + p * V, all.begin() + (p + 1) * V);
        return rows;
    }

    uint64_t seed_ = 0;
    std::unique_ptr<Rng> rng_;
    std::unique_ptr<Tokenizer> tokenizer_;
    std::unique_ptr<Backend> be_;
    ModelConfig config_;
    std::unique_ptr<Model> model_;
    std::unique_ptr<ServeLoop> loop_;
    std::unique_ptr<CompletionSession> session_;
};

// log softmax(logits), computed here in long double.
std::vector<double> log_softmax(const std::vector<float>& logits) {
    long double max = -INFINITY, sum = 0;
    for (float l : logits) max = std::max<long double>(max, l);
    for (float l : logits) sum += std::exp(static_cast<long double>(l) - max);
    std::vector<double> out;
    for (float l : logits) out.push_back(static_cast<double>(l - max - std::log(sum)));
    return out;
}

// The error a log-probability may have when the session's logits (the cached prefill and
// decode) differ from one whole forward pass's by fp32 rounding: tests/engine/infer's cached
// decoding agrees within 2e-5 of max |logit|, and a log-softmax moves by at most twice that.
double logprob_tolerance(const std::vector<float>& logits) {
    double scale = 1;
    for (float l : logits) scale = std::max(scale, std::abs(static_cast<double>(l)));
    return 4e-5 * scale;
}

// A TokenLogprob's alternatives: most likely first, each a log-probability.
void expect_sorted_logprobs(const TokenLogprob& t) {
    for (size_t k = 0; k < t.top.size(); ++k) {
        EXPECT_LE(t.top[k].second, 0.0);
        if (k > 0) {
            EXPECT_GE(t.top[k - 1].second, t.top[k].second) << "entry " << k;
        }
    }
}

// Each drawn token's log-probability and its top 5 are the log-softmax of the logits the model
// gives at that position; asking for every token's gives probabilities summing to 1, whose
// first five are exactly the top 5.
TEST_F(CompletionSessionTest, DrawnTokensLogprobsAreTheLogSoftmaxOfTheModelsLogits) {
    SCOPED_TRACE("TMX_TEST_SEED=" + std::to_string(seed_));
    make_model(true);
    start_serving();
    CompletionParams p;
    p.prompt_tokens = {random_ids(1 + rng_->below(12))};
    p.max_tokens = 14;
    p.sampling.temperature = 1.0;
    p.sampling.top_k = 0;
    p.sampling.top_p = 1.0;
    p.sampling.min_p = 0.0;
    p.ignore_eos = true;
    p.seed = rng_->next_u64();
    p.logprobs = 5;
    const std::shared_ptr<Completion> top5 = complete(p);
    p.logprobs = config_.vocab_size;
    const std::shared_ptr<Completion> every = complete(p);

    const Completion::Choice& c = top5->choices()[0];
    ASSERT_EQ(c.stop_reason, StopReason::Length);
    ASSERT_EQ(c.token_ids.size(), 14u);
    ASSERT_EQ(every->choices()[0].token_ids, c.token_ids);  // logprobs leave the draws alone
    ASSERT_EQ(c.logprobs.size(), 14u);
    std::vector<int32_t> tokens = p.prompt_tokens[0];
    tokens.insert(tokens.end(), c.token_ids.begin(), c.token_ids.end() - 1);
    const std::vector<std::vector<float>> rows = logits_at_every_position(tokens);
    size_t offset = 0;
    for (size_t j = 0; j < c.token_ids.size(); ++j) {
        SCOPED_TRACE("token " + std::to_string(j));
        const std::vector<float>& logits = rows[p.prompt_tokens[0].size() - 1 + j];
        const std::vector<double> want = log_softmax(logits);
        const double tol = logprob_tolerance(logits);
        const TokenLogprob& got = c.logprobs[j];
        ASSERT_TRUE(got.logprob.has_value());
        EXPECT_NEAR(*got.logprob, want[static_cast<size_t>(c.token_ids[j])], tol);
        EXPECT_EQ(got.text_offset, offset);
        offset += got.token.size();

        std::vector<double> sorted = want;
        std::sort(sorted.begin(), sorted.end(), std::greater<double>());
        ASSERT_EQ(got.top.size(), 5u);
        expect_sorted_logprobs(got);
        for (size_t k = 0; k < 5; ++k) EXPECT_NEAR(got.top[k].second, sorted[k], tol);
        EXPECT_LE(*got.logprob, got.top[0].second);

        const TokenLogprob& full = every->choices()[0].logprobs[j];
        ASSERT_EQ(full.top.size(), static_cast<size_t>(config_.vocab_size));
        expect_sorted_logprobs(full);
        double mass = 0;
        for (const auto& [text, lp] : full.top) mass += std::exp(lp);
        EXPECT_NEAR(mass, 1.0, 1e-9);
        for (size_t k = 0; k < 5; ++k) EXPECT_EQ(full.top[k], got.top[k]) << "entry " << k;
        EXPECT_EQ(full.logprob, got.logprob);
    }
}

// Echo with logprobs: the text starts with the prompt's, and every prompt token after the first
// is scored by the model's logits at the position before it (a string prompt's BOS is neither
// echoed nor scored; a prompt given as ids echoes its first token without a score). The echoed
// tokens' texts make up the prompt's, at their offsets.
TEST_F(CompletionSessionTest, EchoScoresEveryPromptTokenAsTheModelDoes) {
    SCOPED_TRACE("TMX_TEST_SEED=" + std::to_string(seed_));
    make_model(true);
    start_serving(2);
    for (bool as_ids : {false, true}) {
        SCOPED_TRACE(as_ids ? "prompts of ids" : "string prompts");
        CompletionParams p;
        std::vector<std::vector<int32_t>> fed;  // each prompt as the model takes it
        std::vector<std::string> texts;
        for (int k = 0; k < 2; ++k) {
            if (as_ids) {
                p.prompt_tokens.push_back(random_ids(2 + rng_->below(14)));
                fed.push_back(p.prompt_tokens.back());
                texts.push_back(tokenizer_->decode(fed.back()));
            } else {
                p.prompts.push_back(random_text(1 + rng_->below(12)));
                fed.push_back(prompt_ids(p.prompts.back()));
                texts.push_back(p.prompts.back());
            }
        }
        p.max_tokens = 3;
        p.echo = true;
        p.logprobs = 3;
        p.sampling.temperature = 0.0;
        p.ignore_eos = true;
        const std::shared_ptr<Completion> done = complete(p);
        ASSERT_EQ(done->choices().size(), 2u);
        for (size_t k = 0; k < 2; ++k) {
            SCOPED_TRACE("prompt " + std::to_string(k));
            const Completion::Choice& c = done->choices()[k];
            const size_t first = as_ids ? 0 : 1;  // the first prompt token echoed
            const size_t echoed = fed[k].size() - first;
            ASSERT_EQ(c.logprobs.size(), echoed + 3);
            EXPECT_EQ(c.text.substr(0, texts[k].size()), texts[k]);
            EXPECT_EQ(c.prompt_tokens, static_cast<int64_t>(fed[k].size()));
            const std::vector<std::vector<float>> rows = logits_at_every_position(fed[k]);
            std::string joined;
            for (size_t j = 0; j < echoed; ++j) {
                SCOPED_TRACE("prompt token " + std::to_string(first + j));
                const TokenLogprob& t = c.logprobs[j];
                EXPECT_EQ(t.text_offset, joined.size());
                joined += t.token;
                const size_t position = first + j;
                if (position == 0) {
                    EXPECT_FALSE(t.logprob.has_value());
                    EXPECT_TRUE(t.top.empty());
                    continue;
                }
                ASSERT_TRUE(t.logprob.has_value());
                const std::vector<float>& logits = rows[position - 1];
                const std::vector<double> want = log_softmax(logits);
                const double tol = logprob_tolerance(logits);
                EXPECT_NEAR(*t.logprob, want[static_cast<size_t>(fed[k][position])], tol);
                ASSERT_EQ(t.top.size(), 3u);
                expect_sorted_logprobs(t);
                EXPECT_NEAR(t.top[0].second, *std::max_element(want.begin(), want.end()), tol);
            }
            EXPECT_EQ(joined, texts[k]);
            // The generated tokens' offsets go on from the end of the echo.
            EXPECT_EQ(c.logprobs[echoed].text_offset, texts[k].size());
        }
    }
}

// The text ends right before the first occurrence of a stop string, whole or streamed: a stop
// string cut from a run without it stops a second, identical run exactly there, and the held
// back tail that might have begun it never reaches an update.
TEST_F(CompletionSessionTest, StopStringsCutTheTextExactly) {
    SCOPED_TRACE("TMX_TEST_SEED=" + std::to_string(seed_));
    make_model(true);
    start_serving();
    CompletionParams p;
    p.prompts = {random_text(1 + rng_->below(6))};
    p.max_tokens = 24;
    p.sampling.temperature = 0.0;
    p.ignore_eos = true;
    const std::string whole = complete(p)->choices()[0].text;
    ASSERT_FALSE(whole.empty());
    // Up to 3 bytes from a random place of the text, where they are ASCII (no UTF-8 character
    // cut, which stops nothing a client can see).
    std::vector<size_t> ascii;
    for (size_t i = 0; i < whole.size(); ++i)
        if (static_cast<unsigned char>(whole[i]) < 0x80) ascii.push_back(i);
    ASSERT_FALSE(ascii.empty()) << whole;
    const size_t from = ascii[rng_->below(ascii.size())];
    size_t size = 1 + rng_->below(3);
    while (from + size > whole.size() || static_cast<unsigned char>(whole[from + size - 1]) >= 0x80)
        --size;
    const std::string stop = whole.substr(from, size);
    const size_t cut = whole.find(stop);
    SCOPED_TRACE("text \"" + whole + "\", stop \"" + stop + "\"");

    p.stop = {stop, "\x01never"};
    const std::shared_ptr<Completion> stopped = session_->start(p);
    std::string streamed;
    for (bool done = false; !done;) {
        const Completion::Progress progress = stopped->next_updates(std::chrono::seconds(60));
        for (const Completion::Update& u : progress.updates) streamed += u.text;
        done = progress.all_done;
    }
    const Completion::Choice& c = stopped->choices()[0];
    EXPECT_EQ(c.text, whole.substr(0, cut));
    EXPECT_EQ(streamed, c.text);
    EXPECT_EQ(c.stop_reason, StopReason::Stop);
}

// Greedy draws under frequency and presence penalties and a logit bias are the argmax of the
// model's log-probabilities plus the bias, minus frequency x count + presence for every token
// drawn before (the prompt's own tokens are not penalised). On a flat distribution the
// penalties change the choice at most steps.
TEST_F(CompletionSessionTest, PenaltiesAndLogitBiasSteerTheDrawsAsSpecified) {
    SCOPED_TRACE("TMX_TEST_SEED=" + std::to_string(seed_));
    make_model(false);
    start_serving();
    CompletionParams p;
    p.prompt_tokens = {random_ids(1 + rng_->below(8))};
    p.max_tokens = 20;
    p.sampling.temperature = 0.0;
    // A drawn token always loses something (0.5 .. 3 the first time), far beyond the spread of
    // a fresh model's logits; one token is favoured as much, two others by -2 .. 2.
    p.sampling.frequency_penalty = 0.5 + 1.5 * rng_->uniform();
    p.sampling.presence_penalty = 1.5 * rng_->uniform() - 0.5;
    const std::vector<int32_t> biased = random_ids(3);
    p.sampling.logit_bias.emplace_back(biased[0], 1.0 + rng_->uniform());
    for (int32_t id : {biased[1], biased[2]})
        p.sampling.logit_bias.emplace_back(id, 4.0 * rng_->uniform() - 2.0);
    p.ignore_eos = true;
    p.logprobs = config_.vocab_size;  // every token's log-probability at every step
    const std::shared_ptr<Completion> done = complete(p);
    const Completion::Choice& c = done->choices()[0];
    ASSERT_EQ(c.token_ids.size(), 20u);

    std::vector<int> count(static_cast<size_t>(config_.vocab_size), 0);
    int changed = 0;
    for (size_t j = 0; j < c.token_ids.size(); ++j) {
        SCOPED_TRACE("step " + std::to_string(j));
        std::vector<int32_t> tokens = p.prompt_tokens[0];
        tokens.insert(tokens.end(), c.token_ids.begin(), c.token_ids.begin() + j);
        const std::vector<float> logits = logits_at_every_position(tokens).back();
        std::vector<double> score = log_softmax(logits);
        const int32_t plain =
            static_cast<int32_t>(std::max_element(score.begin(), score.end()) - score.begin());
        for (const auto& [id, bias] : p.sampling.logit_bias) score[id] += bias;
        for (size_t v = 0; v < score.size(); ++v)
            if (count[v] > 0)
                score[v] -= p.sampling.frequency_penalty * count[v] + p.sampling.presence_penalty;
        std::vector<size_t> order(score.size());
        std::iota(order.begin(), order.end(), 0);
        std::partial_sort(order.begin(), order.begin() + 2, order.end(),
                          [&](size_t a, size_t b) { return score[a] > score[b]; });
        const int32_t drawn = c.token_ids[j];
        // The session's logits and this forward pass's differ by fp32 rounding: a near-tie may
        // go either way, and the run parts ways with this reconstruction after it.
        if (score[order[0]] - score[order[1]] <= logprob_tolerance(logits)) {
            EXPECT_TRUE(drawn == static_cast<int32_t>(order[0]) ||
                        drawn == static_cast<int32_t>(order[1]));
            break;
        }
        EXPECT_EQ(drawn, static_cast<int32_t>(order[0]));
        // The reported log-probabilities are the model's, before bias and penalties.
        EXPECT_NEAR(*c.logprobs[j].logprob, log_softmax(logits)[static_cast<size_t>(drawn)],
                    logprob_tolerance(logits));
        changed += drawn != plain;
        ++count[static_cast<size_t>(drawn)];
    }
    EXPECT_GE(changed, 1) << "the penalties never changed a choice";
}

// Several prompts with n choices each: choice p * n + k is the k-th choice of prompt p asked
// alone, each copy draws from its own stream, the usage counts every choice's tokens, and the
// updates add up to each choice's text, each starting with `first` and ending once.
TEST_F(CompletionSessionTest, SeveralPromptsWithSeveralChoicesEachGiveWhatEachGivesAlone) {
    SCOPED_TRACE("TMX_TEST_SEED=" + std::to_string(seed_));
    make_model(false);
    start_serving();
    CompletionParams p;
    for (int k = 0; k < 3; ++k) p.prompts.push_back(random_text(1 + rng_->below(8)));
    p.n = 2;
    p.max_tokens = 10;
    p.sampling.temperature = 1.0;
    p.sampling.top_k = 0;
    p.seed = rng_->next_u64();
    p.echo = rng_->below(2) == 1;
    const std::shared_ptr<Completion> all = session_->start(p);
    std::vector<std::string> streamed(6);
    std::vector<int> firsts(6, 0), ends(6, 0);
    for (bool done = false; !done;) {
        const Completion::Progress progress = all->next_updates(std::chrono::seconds(60));
        for (const Completion::Update& u : progress.updates) {
            ASSERT_LT(u.choice, 6u);
            EXPECT_EQ(u.first, firsts[u.choice] == 0 && ends[u.choice] == 0);
            firsts[u.choice] += u.first;
            streamed[u.choice] += u.text;
            ends[u.choice] += u.done;
        }
        done = progress.all_done;
    }
    ASSERT_EQ(all->choices().size(), 6u);
    int64_t prompt_tokens = 0, completion_tokens = 0;
    int copies_differ = 0;
    for (size_t prompt = 0; prompt < 3; ++prompt) {
        CompletionParams alone = p;
        alone.prompts = {p.prompts[prompt]};
        const std::shared_ptr<Completion> want = complete(alone);
        for (size_t k = 0; k < 2; ++k) {
            SCOPED_TRACE("prompt " + std::to_string(prompt) + " choice " + std::to_string(k));
            const Completion::Choice& got = all->choices()[prompt * 2 + k];
            EXPECT_EQ(got.token_ids, want->choices()[k].token_ids);
            EXPECT_EQ(got.text, want->choices()[k].text);
            EXPECT_EQ(got.stop_reason, want->choices()[k].stop_reason);
            EXPECT_EQ(streamed[prompt * 2 + k], got.text);
            EXPECT_EQ(firsts[prompt * 2 + k], 1);
            EXPECT_EQ(ends[prompt * 2 + k], 1);
            if (p.echo) {
                EXPECT_EQ(got.text.rfind(p.prompts[prompt], 0), 0u);
            }
            prompt_tokens += static_cast<int64_t>(prompt_ids(p.prompts[prompt]).size());
            completion_tokens += static_cast<int64_t>(got.token_ids.size());
        }
        copies_differ +=
            all->choices()[prompt * 2].token_ids != all->choices()[prompt * 2 + 1].token_ids;
    }
    EXPECT_GE(copies_differ, 1) << "the copies of a prompt drew the same tokens";
    EXPECT_EQ(all->usage().prompt_tokens, prompt_tokens);
    EXPECT_EQ(all->usage().completion_tokens, completion_tokens);
    EXPECT_FALSE(all->cancelled());
    EXPECT_FALSE(all->failure().has_value());
}

// A cancelled completion ends its running choices as cancelled.
TEST_F(CompletionSessionTest, CancellingEndsTheRunningChoices) {
    SCOPED_TRACE("TMX_TEST_SEED=" + std::to_string(seed_));
    make_model(false);
    start_serving(2);
    CompletionParams p;
    p.prompt_tokens = {random_ids(3), random_ids(5)};
    p.max_tokens = 1 << 20;  // runs until cancelled
    p.ignore_eos = true;
    const std::shared_ptr<Completion> c = session_->start(p);
    c->next_updates(std::chrono::seconds(60));  // something has run
    c->cancel();
    c->wait();
    for (const Completion::Choice& choice : c->choices())
        EXPECT_EQ(choice.stop_reason, StopReason::Cancelled);
    EXPECT_TRUE(c->cancelled());
}

// What the session refuses, and where in the request the fault is; a refused request leaves
// nothing running.
TEST_F(CompletionSessionTest, RefusedRequestsSayWhy) {
    SCOPED_TRACE("TMX_TEST_SEED=" + std::to_string(seed_));
    make_model(false);
    start_serving(1, 0, 20);
    const int32_t V = static_cast<int32_t>(config_.vocab_size);
    auto refusal = [&](const CompletionParams& p) -> std::optional<CompletionError> {
        try {
            session_->start(p)->wait();
        } catch (const CompletionError& e) {
            return e;
        }
        return std::nullopt;
    };

    CompletionParams p;
    p.prompt_tokens = {random_ids(4), random_ids(6)};
    const size_t at = rng_->below(6);
    const int32_t outside = V + static_cast<int32_t>(rng_->below(1000));
    p.prompt_tokens[1][at] = outside;
    std::optional<CompletionError> e = refusal(p);
    ASSERT_TRUE(e);
    EXPECT_EQ(e->kind, CompletionError::Kind::TokenOutsideVocabulary);
    EXPECT_EQ(e->prompt, 1u);
    EXPECT_EQ(e->position, at);
    EXPECT_EQ(e->token, outside);
    EXPECT_EQ(std::string(e->what()), "token " + std::to_string(outside) +
                                          " is outside the vocabulary (" + std::to_string(V) +
                                          " tokens)");

    p.prompt_tokens = {random_ids(4)};
    p.sampling.logit_bias = {{outside, 1.0}};
    e = refusal(p);
    ASSERT_TRUE(e);
    EXPECT_EQ(e->kind, CompletionError::Kind::TokenOutsideVocabulary);
    EXPECT_EQ(e->prompt, CompletionError::kLogitBias);
    EXPECT_EQ(e->token, outside);
    p.sampling.logit_bias.clear();

    p.prompt_tokens = {random_ids(11)};  // scored twice: 22, over 20
    p.n = 2;
    p.echo = true;
    p.logprobs = 0;
    e = refusal(p);
    ASSERT_TRUE(e);
    EXPECT_EQ(e->kind, CompletionError::Kind::TooManyScoredTokens);
    EXPECT_NE(std::string(e->what()).find("this one has 22"), std::string::npos) << e->what();
    p.n = 1;  // 11: within the limit
    EXPECT_FALSE(refusal(p));
    p.echo = false;
    p.logprobs = -1;

    p.sampling.temperature = -1;
    e = refusal(p);
    ASSERT_TRUE(e);
    EXPECT_EQ(e->kind, CompletionError::Kind::Unrunnable);
    p.sampling = {};

    // One slot and no room to wait: the second sequence is refused, and the first with it.
    p.n = 2;
    p.max_tokens = 1 << 20;
    p.ignore_eos = true;
    e = refusal(p);
    ASSERT_TRUE(e);
    EXPECT_EQ(e->kind, CompletionError::Kind::QueueFull);
    for (int i = 0; i < 6000; ++i) {  // the cancelled first sequence leaves its slot
        const ServeLoop::Stats s = loop_->stats();
        if (s.running == 0 && s.waiting == 0) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    p.n = 1;
    p.max_tokens = 2;
    const std::shared_ptr<Completion> after = session_->start(p);  // the slot is free again
    after->wait();
    EXPECT_EQ(after->choices()[0].stop_reason, StopReason::Length);
}

TEST(ServingPrefillBudget, IsTheRequestOrTheAttentionWindow) {
    ModelConfig c = test::test_config("test-tiny");
    EXPECT_EQ(serving_prefill_budget(c, 5), 5);
    EXPECT_EQ(serving_prefill_budget(c, 0), c.sliding_window);
    c.sliding_window = 0;
    EXPECT_EQ(serving_prefill_budget(c, 0), c.max_seq_len);
}

}  // namespace
}  // namespace tmx

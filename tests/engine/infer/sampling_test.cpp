// Sampling: the distribution after each truncation, checked against a direct re-implementation
// of the documented order (penalty, temperature, top-k, top-p, min-p) and by drawing from it;
// degenerate settings.
#include "engine/infer/sampling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>

#include "engine/core/errors.h"
#include "tests/test_util.h"

namespace tmx {
namespace {

// The documented steps one at a time, each renormalising: the reference.
std::vector<double> reference_distribution(const std::vector<float>& logits,
                                           const SamplingOptions& o,
                                           const std::vector<int32_t>& history) {
    const size_t V = logits.size();
    std::vector<double> l(logits.begin(), logits.end());
    std::vector<bool> seen(V, false);
    for (int32_t id : history) seen[id] = true;
    for (size_t i = 0; i < V; ++i)
        if (seen[i]) l[i] = l[i] > 0 ? l[i] / o.repetition_penalty : l[i] * o.repetition_penalty;
    std::vector<size_t> order(V);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return l[a] > l[b]; });
    std::vector<double> p(V, 0.0);
    if (o.temperature == 0.0) {
        p[order[0]] = 1.0;
        return p;
    }
    double z = 0.0;
    for (size_t i = 0; i < V; ++i) z += p[i] = std::exp((l[i] - l[order[0]]) / o.temperature);
    for (double& x : p) x /= z;
    auto keep_first = [&](size_t n) {  // keep the n most likely, renormalise
        double mass = 0.0;
        for (size_t r = 0; r < V; ++r) {
            if (r >= n) p[order[r]] = 0.0;
            mass += p[order[r]];
        }
        for (double& x : p) x /= mass;
    };
    if (o.top_k > 0 && static_cast<size_t>(o.top_k) < V) keep_first(o.top_k);
    if (o.top_p < 1.0) {  // 1 = off (its running sum would reach 1 before the smallest tokens)
        size_t n = 0;
        for (double cum = 0.0; n < V && (n == 0 || cum < o.top_p); ++n) cum += p[order[n]];
        keep_first(n);
    }
    const double threshold = o.min_p * p[order[0]];
    keep_first(
        std::count_if(p.begin(), p.end(), [&](double x) { return x > 0 && x >= threshold; }));
    return p;
}

struct Case {
    const char* name;
    SamplingOptions options;
};

const Case kCases[] = {
    {"temperature",
     {.repetition_penalty = 1.0, .temperature = 0.7, .top_k = 0, .top_p = 1.0, .min_p = 0.0}},
    {"top_k",
     {.repetition_penalty = 1.0, .temperature = 1.0, .top_k = 5, .top_p = 1.0, .min_p = 0.0}},
    {"top_p",
     {.repetition_penalty = 1.0, .temperature = 1.3, .top_k = 0, .top_p = 0.6, .min_p = 0.0}},
    {"min_p",
     {.repetition_penalty = 1.0, .temperature = 1.0, .top_k = 0, .top_p = 1.0, .min_p = 0.2}},
    {"penalty",
     {.repetition_penalty = 1.8, .temperature = 1.0, .top_k = 0, .top_p = 1.0, .min_p = 0.0}},
    {"all",
     {.repetition_penalty = 1.4, .temperature = 0.8, .top_k = 8, .top_p = 0.85, .min_p = 0.05}},
};

// Over many draws, each token's frequency is within 5 standard errors of its probability
// (a binomial proportion), and removed tokens never appear. With 16 tokens and 6 cases, a
// correct sampler fails this by chance with probability ~1e-5; a wrong truncation shifts some
// probability by far more than 5 standard errors (~0.007 at 2e5 draws).
TEST(Sampling, DrawFrequenciesMatchTheTruncatedDistribution) {
    const uint64_t seed = 2026;  // fixed: the statistical bound is for one known stream
    Rng inputs(seed);
    for (const Case& c : kCases) {
        SCOPED_TRACE(c.name);
        const std::vector<float> logits = test::random_normal(inputs, 16, 1.5);
        const std::vector<int32_t> history = {3, 7, 7, 12};
        const std::vector<double> want = reference_distribution(logits, c.options, history);
        const std::vector<double> got =
            sampling_distribution(logits.data(), 16, c.options, history, 0);
        for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-12) << i;

        const int draws = 200000;
        std::vector<int> counts(16, 0);
        Rng rng(seed + 1);
        for (int d = 0; d < draws; ++d)
            ++counts[sample_token(logits.data(), 16, c.options, history, 0, rng)];
        for (size_t i = 0; i < want.size(); ++i) {
            const double freq = static_cast<double>(counts[i]) / draws;
            if (want[i] == 0.0) {
                EXPECT_EQ(counts[i], 0) << "token " << i << " was truncated away";
                continue;
            }
            const double se = std::sqrt(want[i] * (1 - want[i]) / draws);
            EXPECT_NEAR(freq, want[i], 5 * se + 1e-9) << "token " << i;
        }
    }
}

// A vocabulary's worth of logits (the sizes of the demo model and tiny-mixtral), spread wide
// enough that the weights span the whole double range and underflow: each probability within
// 1e-13 of its own size (the weights' exp is the sampler's own, vectorised) or, below exp(-708)
// of the top's, within 1e-300 absolutely; and the truncations keep the reference's tokens (a
// removed token's probability is 0), ties at top-k's boundary included (lower ids first).
TEST(Sampling, VocabularySizedRowsGiveTheReferenceDistribution) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    Rng inputs(seed);
    for (int64_t V : {2048, 32000}) {
        std::vector<float> logits = test::random_normal(inputs, static_cast<size_t>(V), 40.0);
        // Ties: eight tokens share the 40th-largest logit.
        std::vector<float> sorted = logits;
        std::sort(sorted.begin(), sorted.end(), std::greater<float>());
        for (int i = 0; i < 8; ++i) logits[static_cast<size_t>(97 * i + 5)] = sorted[39];
        for (const SamplingOptions& o :
             {SamplingOptions{.temperature = 1.0, .top_k = 0, .top_p = 1.0, .min_p = 0.0},
              SamplingOptions{.temperature = 0.05, .top_k = 0, .top_p = 1.0, .min_p = 0.0},
              SamplingOptions{.temperature = 30.0, .top_k = 40, .top_p = 1.0, .min_p = 0.0},
              // Fewer than k weights above 0: top-k's search for a floor goes down to 0.
              SamplingOptions{.temperature = 1e-3, .top_k = 40, .top_p = 1.0, .min_p = 0.0},
              SamplingOptions{.temperature = 30.0, .top_k = 0, .top_p = 0.9, .min_p = 0.0},
              SamplingOptions{.temperature = 30.0, .top_k = 0, .top_p = 1.0, .min_p = 0.05},
              SamplingOptions{}}) {
            SCOPED_TRACE("V " + std::to_string(V) + ", temperature " +
                         std::to_string(o.temperature) + ", top-k " + std::to_string(o.top_k));
            const std::vector<double> want = reference_distribution(logits, o, {});
            const std::vector<double> got = sampling_distribution(logits.data(), V, o, {}, 0);
            for (int64_t i = 0; i < V; ++i) {
                ASSERT_NEAR(got[i], want[i], 1e-13 * want[i] + 1e-300) << "token " << i;
            }
        }
    }
}

// Draws over every token of a vocabulary that is no multiple of the sampler's blocks of 8 (its
// inverse CDF sums blocks, then within one): each token's frequency within 5 standard errors.
TEST(Sampling, DrawsOverAWholeVocabularyFollowTheDistribution) {
    const uint64_t seed = 2027;  // fixed: the statistical bound is for one known stream
    Rng inputs(seed);
    const int64_t V = 29;
    const std::vector<float> logits = test::random_normal(inputs, V, 1.0);
    const SamplingOptions o{.temperature = 1.0, .top_k = 0, .top_p = 1.0, .min_p = 0.0};
    const std::vector<double> want = reference_distribution(logits, o, {});
    const int draws = 200000;
    std::vector<int> counts(static_cast<size_t>(V), 0);
    Rng rng(seed + 1);
    for (int d = 0; d < draws; ++d) ++counts[sample_token(logits.data(), V, o, {}, 0, rng)];
    for (int64_t i = 0; i < V; ++i) {
        const double se = std::sqrt(want[i] * (1 - want[i]) / draws);
        EXPECT_NEAR(static_cast<double>(counts[i]) / draws, want[i], 5 * se + 1e-9)
            << "token " << i;
    }
}

TEST(Sampling, TruncationsKeepWhatTheyShould) {
    // Probabilities 0.4, 0.3, 0.2, 0.1 at temperature 1.
    const std::vector<float> logits = {std::log(0.1f), std::log(0.4f), std::log(0.2f),
                                       std::log(0.3f)};
    auto dist = [&](SamplingOptions o) {
        return sampling_distribution(logits.data(), 4, o, {}, 0);
    };
    SamplingOptions off{.temperature = 1.0, .top_k = 0, .top_p = 1.0, .min_p = 0.0};
    SamplingOptions o = off;
    o.top_k = 2;  // 0.4, 0.3 -> 4/7, 3/7
    EXPECT_NEAR(dist(o)[1], 4.0 / 7, 1e-6);
    EXPECT_NEAR(dist(o)[3], 3.0 / 7, 1e-6);
    EXPECT_EQ(dist(o)[2], 0.0);
    o = off;
    o.top_p = 0.75;  // 0.4 + 0.3 < 0.75: needs the 0.2 too
    EXPECT_NEAR(dist(o)[2], 0.2 / 0.9, 1e-6);
    EXPECT_EQ(dist(o)[0], 0.0);
    o = off;
    o.min_p = 0.45;  // keeps p >= 0.18
    EXPECT_NEAR(dist(o)[2], 0.2 / 0.9, 1e-6);
    EXPECT_EQ(dist(o)[0], 0.0);
    o = off;
    o.top_k = 3;     // 0.4, 0.3, 0.2 -> /0.9
    o.top_p = 0.75;  // 0.444 + 0.333 = 0.778 >= 0.75: two tokens
    EXPECT_EQ(dist(o)[2], 0.0);
    EXPECT_NEAR(dist(o)[1], 4.0 / 7, 1e-6);
}

// OpenAI's adjustments: the bias added, then a token drawn c times loses frequency * c +
// presence; tokens only in the prompt keep their logits.
TEST(Sampling, LogitBiasAndFrequencyAndPresencePenaltiesCountOnlyDrawnTokens) {
    const std::vector<float> logits = {1.0f, 0.5f, 0.2f, -0.3f};
    SamplingOptions o{.repetition_penalty = 1.0,
                      .temperature = 1.0,
                      .top_k = 0,
                      .top_p = 1.0,
                      .min_p = 0.0,
                      .frequency_penalty = 0.5,
                      .presence_penalty = 0.25,
                      .logit_bias = {{3, 1.5}}};
    const std::vector<int32_t> history = {0, 0, 3, 1, 1, 2};  // a prompt of 3, then 3 drawn
    const std::vector<double> p = sampling_distribution(logits.data(), 4, o, history, 3);
    const std::vector<double> adjusted = {1.0, 0.5 - 0.5 * 2 - 0.25, 0.2 - 0.5 - 0.25, -0.3 + 1.5};
    double z = 0;
    for (double a : adjusted) z += std::exp(a);
    for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(p[i], std::exp(adjusted[i]) / z, 1e-7) << i;

    SamplingOptions greedy = o;
    greedy.temperature = 0.0;
    Rng rng(test::fresh_seed());
    EXPECT_EQ(sample_token(logits.data(), 4, greedy, history, 3, rng), 3);  // the bias wins
    greedy.logit_bias.clear();
    EXPECT_EQ(sample_token(logits.data(), 4, greedy, history, 3, rng), 0);
    // Nothing drawn yet: no penalty, token 0 leads.
    EXPECT_NEAR(sampling_distribution(logits.data(), 4, o, history, 0)[1],
                std::exp(0.5) / (std::exp(1.0) + std::exp(0.5) + std::exp(0.2) + std::exp(1.2)),
                1e-7);

    SamplingOptions bad = o;
    bad.frequency_penalty = 2.5;
    EXPECT_THROW(validate(bad), UsageError);
    bad = o;
    bad.presence_penalty = -3;
    EXPECT_THROW(validate(bad), UsageError);
    bad = o;
    bad.logit_bias = {{1, 101.0}};
    EXPECT_THROW(validate(bad), UsageError);
}

TEST(Sampling, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogits) {
    const std::vector<float> logits = {2.0f, -1.0f, 0.5f};
    SamplingOptions o{
        .repetition_penalty = 2.0, .temperature = 1.0, .top_k = 0, .top_p = 1.0, .min_p = 0.0};
    const std::vector<double> p = sampling_distribution(logits.data(), 3, o, {0, 1, 1}, 0);
    const double z = std::exp(1.0) + std::exp(-2.0) + std::exp(0.5);
    EXPECT_NEAR(p[0], std::exp(1.0) / z, 1e-12);
    EXPECT_NEAR(p[1], std::exp(-2.0) / z, 1e-12);
    EXPECT_NEAR(p[2], std::exp(0.5) / z, 1e-12);
}

TEST(Sampling, DegenerateSettingsBehave) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    Rng inputs(seed);
    const int64_t V = 50;
    std::vector<float> logits = test::random_normal(inputs, V, 3.0);
    const int32_t best =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    Rng rng(seed);
    auto draws_only_best = [&](SamplingOptions o) {
        for (int i = 0; i < 200; ++i)
            if (sample_token(logits.data(), V, o, {}, 0, rng) != best) return false;
        return true;
    };
    SamplingOptions o;
    o.temperature = 0.0;
    EXPECT_TRUE(draws_only_best(o)) << "temperature 0 is greedy";
    o = {.temperature = 1.0, .top_k = 1, .top_p = 1.0, .min_p = 0.0};
    EXPECT_TRUE(draws_only_best(o)) << "top-k 1";
    o = {.temperature = 1.0, .top_k = 0, .top_p = 1e-9, .min_p = 0.0};
    EXPECT_TRUE(draws_only_best(o)) << "top-p small enough to keep one token";
    o.top_p = 0.0;
    EXPECT_TRUE(draws_only_best(o)) << "top-p 0";
    o = {.temperature = 1e-30, .top_k = 0, .top_p = 1.0, .min_p = 0.0};
    EXPECT_TRUE(draws_only_best(o)) << "a vanishing temperature";
    o = {.temperature = 1.0, .top_k = 0, .top_p = 1.0, .min_p = 1.0};
    EXPECT_TRUE(draws_only_best(o)) << "min-p 1";

    // top-k beyond the vocabulary is no truncation at all.
    SamplingOptions all{.temperature = 1.0, .top_k = 0, .top_p = 1.0, .min_p = 0.0};
    SamplingOptions big = all;
    big.top_k = 1000;
    EXPECT_EQ(sampling_distribution(logits.data(), V, all, {}, 0),
              sampling_distribution(logits.data(), V, big, {}, 0));

    // Huge temperatures, huge logits and ties: finite, normalised distributions.
    std::vector<float> extreme(V, 0.0f);
    extreme[3] = 3e38f;
    extreme[4] = -3e38f;
    extreme[5] = 3e38f;  // tie with 3
    for (SamplingOptions s :
         {SamplingOptions{.temperature = 1e30, .top_k = 0, .top_p = 1.0, .min_p = 0.0},
          SamplingOptions{.temperature = 1e-3, .top_k = 0, .top_p = 0.5, .min_p = 0.1},
          SamplingOptions{.repetition_penalty = 1e10, .temperature = 2.0}}) {
        const std::vector<double> p = sampling_distribution(extreme.data(), V, s, {3, 4}, 0);
        double sum = 0.0;
        for (double x : p) {
            ASSERT_TRUE(std::isfinite(x));
            sum += x;
        }
        EXPECT_NEAR(sum, 1.0, 1e-12);
        const int32_t t = sample_token(extreme.data(), V, s, {3, 4}, 0, rng);
        EXPECT_TRUE(t >= 0 && t < V);
    }
    // Greedy ties go to the lower id.
    SamplingOptions greedy;
    greedy.temperature = 0.0;
    EXPECT_EQ(sample_token(extreme.data(), V, greedy, {}, 0, rng), 3);
}

TEST(Sampling, UsesOneRandomNumberPerDrawWhateverTheSettings) {
    const std::vector<float> logits = {0.1f, 0.5f, -0.2f, 0.3f};
    Rng a(5), b(5);
    SamplingOptions greedy;
    greedy.temperature = 0.0;
    sample_token(logits.data(), 4, greedy, {}, 0, a);
    sample_token(logits.data(), 4, SamplingOptions{}, {}, 0, b);
    EXPECT_EQ(a.next_u64(), b.next_u64());
}

TEST(Sampling, RejectsOutOfRangeOptionsNamingTheOption) {
    auto message = [](SamplingOptions o) {
        try {
            validate(o);
        } catch (const UsageError& e) {
            return std::string(e.what());
        }
        return std::string();
    };
    SamplingOptions o;
    o.temperature = -1;
    EXPECT_EQ(message(o).rfind("temperature is ", 0), 0u) << message(o);
    o = {};
    o.top_p = 1.5;
    EXPECT_EQ(message(o).rfind("top_p is ", 0), 0u) << message(o);
    o = {};
    o.min_p = -0.1;
    EXPECT_EQ(message(o).rfind("min_p is ", 0), 0u) << message(o);
    o = {};
    o.top_k = -3;
    EXPECT_EQ(message(o).rfind("top_k is ", 0), 0u) << message(o);
    o = {};
    o.repetition_penalty = 0;
    EXPECT_EQ(message(o).rfind("repetition_penalty is ", 0), 0u) << message(o);
    EXPECT_EQ(message(SamplingOptions{}), "");
}

}  // namespace
}  // namespace tmx

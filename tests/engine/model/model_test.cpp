#include "engine/model/model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backends/registry.h"
#include "engine/core/file_io.h"
#include "engine/model/checkpoint.h"
#include "tests/test_util.h"

namespace tmx {
namespace {

std::string config_path(const std::string& name) {
    return test::source_dir() + "/assets/configs/" + name + ".json";
}

TEST(ModelLayout, TinyMixtralHasExactly172442624Parameters) {
    EXPECT_EQ(model_param_layout(ModelConfig{}).total, 172442624);
}

TEST(ModelLayout, NamesFollowHuggingFaceMixtral) {
    ParamLayout l = model_param_layout(load_config(config_path("tiny-mixtral-swiglu")));
    for (const char* name : {"model.embed_tokens.weight", "model.layers.0.input_layernorm.weight",
                             "model.layers.7.self_attn.k_proj.weight",
                             "model.layers.3.post_attention_layernorm.weight",
                             "model.layers.2.block_sparse_moe.gate.weight",
                             "model.layers.5.block_sparse_moe.experts.7.w3.weight",
                             "model.norm.weight", "lm_head.weight"})
        EXPECT_NE(l.find(name), nullptr) << name;
    EXPECT_EQ(l.find("model.layers.0.self_attn.q_proj.bias"), nullptr);
    EXPECT_EQ(l.find("model.norm.bias"), nullptr);
    EXPECT_EQ(l.find("model.layers.0.self_attn.k_proj.weight")->shape, (Shape{128, 512}));
    EXPECT_EQ(l.find("model.layers.0.self_attn.o_proj.weight")->shape, (Shape{512, 512}));
    EXPECT_EQ(l.find("model.layers.0.block_sparse_moe.experts.0.w2.weight")->shape,
              (Shape{512, 2048}));
}

TEST(ModelLayout, DenseConfigUsesMlpNames) {
    ParamLayout l = model_param_layout(load_config(config_path("test-tiny-dense")));
    EXPECT_NE(l.find("model.layers.1.mlp.w1.weight"), nullptr);
    EXPECT_NE(l.find("model.layers.1.mlp.w2.bias"), nullptr);
    EXPECT_EQ(l.find("model.layers.1.block_sparse_moe.gate.weight"), nullptr);
}

TEST(ModelInit, IsSeededAndFollowsTheDesignDistribution) {
    auto be = make_backend("cpu");
    ModelConfig c = load_config(config_path("test-tiny"));
    c.d_model = 64;
    c.d_ff = 256;
    Model a(c, *be), b(c, *be), other(c, *be);
    a.init_random(42);
    b.init_random(42);
    other.init_random(43);
    std::vector<float> pa = a.params_to_host(), pb = b.params_to_host(),
                       po = other.params_to_host();
    EXPECT_EQ(pa, pb);
    EXPECT_NE(pa, po);
    auto stats = [&](const std::string& name) {
        const ParamSpec* s = a.layout().find(name);
        double sum = 0, sq = 0;
        for (int64_t i = 0; i < s->numel(); ++i) {
            sum += pa[s->offset + i];
            sq += pa[s->offset + i] * pa[s->offset + i];
        }
        double n = static_cast<double>(s->numel());
        return std::pair{sum / n, std::sqrt(sq / n - (sum / n) * (sum / n))};
    };
    auto [m_q, s_q] = stats("model.layers.0.self_attn.q_proj.weight");  // 2048 values
    EXPECT_NEAR(m_q, 0.0, 0.003);
    EXPECT_NEAR(s_q, 0.02, 0.002);
    auto [m_w2, s_w2] = stats("model.layers.1.block_sparse_moe.experts.2.w2.weight");
    EXPECT_NEAR(s_w2, 0.02 / std::sqrt(2.0 * c.n_layers), 0.001);
    EXPECT_EQ(stats("model.layers.0.input_layernorm.weight"), (std::pair{1.0, 0.0}));
    EXPECT_EQ(stats("model.layers.0.self_attn.q_proj.bias"), (std::pair{0.0, 0.0}));
    EXPECT_EQ(stats("model.layers.0.block_sparse_moe.experts.3.w1.bias"), (std::pair{0.0, 0.0}));
}

// The forward pass against PyTorch's fp64 logits of the same random checkpoint
// (tests/fixtures/torch, made by make_fixtures.sh from ../shared/tools/torch_reference.py).
class ForwardVsTorch : public ::testing::TestWithParam<const char*> {};

TEST_P(ForwardVsTorch, LogitsAndAuxMatchFp64Reference) {
    const std::string dir = test::source_dir() + "/tests/fixtures/torch/" + GetParam();
    nlohmann::json ref = read_json_file(dir + "/logits.json");
    const std::vector<int32_t> tokens = test::read_token_file(dir + "/tokens.txt");
    auto be = make_backend("cpu");
    auto model = load_model(dir, *be);
    ASSERT_GT(static_cast<int64_t>(tokens.size()), model->config().sliding_window)
        << "the fixture must be longer than the window";
    const int64_t T = static_cast<int64_t>(tokens.size()), V = model->config().vocab_size;
    std::vector<int32_t> targets(tokens.begin() + 1, tokens.end());
    targets.push_back(-1);
    ForwardResult r = model->forward(tokens, 1, T, &targets);
    std::vector<float> logits(static_cast<size_t>(T * V));
    be->download(r.logits, logits.data());
    double max_ref = 0, max_err = 0;
    for (int64_t t = 0; t < T; ++t)
        for (int64_t v = 0; v < V; ++v) {
            double want = ref["logits"][t][v].get<double>();
            max_ref = std::max(max_ref, std::abs(want));
            max_err = std::max(max_err, std::abs(want - logits[t * V + v]));
        }
    // fp32 through two layers of width 32 lands near 1e-7 of the largest logit; 1e-5 leaves
    // room for other summation orders but catches any wrong mask, rotation or routing.
    EXPECT_LT(max_err, 1e-5 * max_ref) << "max |logit| " << max_ref;
    if (model->config().is_moe()) {
        EXPECT_NEAR(r.aux, ref["aux"].get<double>(), 1e-5);
    }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ForwardVsTorch,
                         ::testing::Values("test-tiny", "test-tiny-swiglu", "test-tiny-dense"));

TEST(ModelForward, BatchRowsMatchEachSequenceAlone) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    Rng rng(seed);
    auto be = make_backend("cpu");
    Model model(load_config(config_path("test-tiny")), *be);
    model.init_random(seed);
    const int64_t B = 3, T = 19, V = model.config().vocab_size;
    std::vector<int32_t> tokens = test::random_ints(rng, B * T, 0, static_cast<int32_t>(V));
    ForwardResult batch = model.forward(tokens, B, T);
    std::vector<float> all(static_cast<size_t>(B * T * V));
    be->download(batch.logits, all.data());
    for (int64_t b = 0; b < B; ++b) {
        std::vector<int32_t> row(tokens.begin() + b * T, tokens.begin() + (b + 1) * T);
        ForwardResult one = model.forward(row, 1, T);
        std::vector<float> alone(static_cast<size_t>(T * V));
        be->download(one.logits, alone.data());
        for (int64_t i = 0; i < T * V; ++i)
            ASSERT_NEAR(alone[i], all[b * T * V + i], 1e-5) << "row " << b << " element " << i;
    }
}

// The memory tests' cases: three small models in fp32 and bf16, each at a random batch, length
// and classifier chunk (1 to 3 rows), freshly initialised on a CPU backend of its own.
struct MemoryCase {
    ModelConfig config;
    Precision precision;
    int64_t B, T, chunk_values;
    std::unique_ptr<Backend> be;
    std::unique_ptr<Model> model;
    std::vector<int32_t> tokens(Rng& rng) const {
        return test::random_ints(rng, B * T, 0, static_cast<int32_t>(config.vocab_size));
    }
    std::vector<int32_t> targets(Rng& rng) const {  // some unscored (-1)
        return test::random_ints(rng, B * T, -1, static_cast<int32_t>(config.vocab_size));
    }
    TrainingMemory estimate(bool with_validation) const {
        return training_memory(config, B, T, precision, with_validation, chunk_values);
    }
    double peak() const { return static_cast<double>(be->memory_stats().peak_bytes); }
};
void for_each_memory_case(Rng& rng, uint64_t seed, const std::function<void(MemoryCase&)>& body) {
    for (const char* name : {"test-tiny", "test-tiny-swiglu", "mini-gpt"}) {
        for (const Precision precision : {Precision::F32, Precision::BF16}) {
            MemoryCase m{load_config(config_path(name)), precision, 0, 0, 0, nullptr, nullptr};
            m.B = 1 + static_cast<int64_t>(rng.below(3));
            m.T = 3 + static_cast<int64_t>(rng.below(30));
            m.chunk_values = m.config.vocab_size * (1 + static_cast<int64_t>(rng.below(3)));
            SCOPED_TRACE(std::string(name) + " " + to_string(precision) + " B " +
                         std::to_string(m.B) + " T " + std::to_string(m.T) + " chunk " +
                         std::to_string(m.chunk_values / m.config.vocab_size) + " rows");
            m.be = make_backend("cpu");
            Backend::ModeScope mode(*m.be, {.precision = precision});
            m.model = std::make_unique<Model>(m.config, *m.be);
            m.model->init_random(seed);
            m.model->set_classifier_chunk_values(m.chunk_values);
            body(m);
        }
    }
}

// Training steps as the Trainer runs them, with the classifier in chunks of a few rows, peak at
// training_memory() to the byte; a validation pass after them at training_memory() with
// validation. The second step frees the first's activations before making its own.
TEST(ModelMemory, ChunkedTrainingStepsAndValidationPeakAtTheTrainingMemoryEstimate) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("TMX_TEST_SEED=" + std::to_string(seed));
    Rng rng(seed);
    for_each_memory_case(rng, seed, [&](MemoryCase& m) {
        Model& model = *m.model;
        const int64_t P = model.num_params();
        const Tensor adam_m = m.be->alloc({P}), adam_v = m.be->alloc({P});  // as a Trainer holds
        std::vector<int32_t> tokens, targets;
        for (int step = 0; step < 2; ++step) {
            tokens = m.tokens(rng);
            targets = m.targets(rng);
            model.zero_grads();
            model.forward(tokens, m.B, m.T, &targets, /*keep_activations=*/true);
            model.backward();
            model.params_changed();
        }
        EXPECT_EQ(m.peak(), m.estimate(false).total());
        model.forward_loss(tokens, m.B, m.T, targets);  // a validation pass
        EXPECT_EQ(m.peak(), m.estimate(true).total());
    });
}

// A validation pass (forward_loss) on a model that has not trained allocates, beside its
// weights (and their bf16 copy), exactly training_memory()'s validation_pass: one layer's
// activations and one chunk of logits, never the [B*T, V] logits.
TEST(ModelMemory, AValidationPassPeaksAtItsEstimate) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("TMX_TEST_SEED=" + std::to_string(seed));
    Rng rng(seed);
    for_each_memory_case(rng, seed, [&](MemoryCase& m) {
        const std::vector<int32_t> tokens = m.tokens(rng), targets = m.targets(rng);
        m.model->forward_loss(tokens, m.B, m.T, targets);
        const TrainingMemory e = m.estimate(true);
        EXPECT_EQ(m.peak(), e.weights + e.bf16_weights + e.validation_pass);
        EXPECT_LT(e.validation_pass, e.step_scratch + e.activations);
    });
}

TEST(ModelForward, ScoreTokensCoversEveryTokenOnceAcrossWindows) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    Rng rng(seed);
    auto be = make_backend("cpu");
    Model model(load_config(config_path("test-tiny")), *be);
    model.init_random(seed);
    std::vector<int32_t> tokens = test::random_ints(rng, 50, 0, 97);
    TokenScore s = score_tokens(model, tokens, 16);
    EXPECT_EQ(s.tokens, 49);
    // The same total as scoring the windows one by one by hand.
    double total = 0;
    for (int64_t start = 0; start < 49; start += 16) {
        int64_t T = std::min<int64_t>(16, 49 - start);
        std::vector<int32_t> in(tokens.begin() + start, tokens.begin() + start + T);
        std::vector<int32_t> tg(tokens.begin() + start + 1, tokens.begin() + start + T + 1);
        total += model.forward(in, 1, T, &tg).loss * static_cast<double>(T);
    }
    EXPECT_NEAR(s.total_nats, total, 1e-9 * total);
    // A random model predicts roughly uniformly: loss near ln(V).
    EXPECT_NEAR(s.total_nats / s.tokens, std::log(97.0), 0.2);
}

}  // namespace
}  // namespace tmx

// Whole-model gradients and one AdamW step against PyTorch in fp64
// (tests/fixtures/torch/*/grads and test-tiny/adamw_step, made by make_fixtures.sh).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "backends/registry.h"
#include "engine/core/file_io.h"
#include "engine/model/checkpoint.h"
#include "engine/model/safetensors.h"
#include "engine/train/trainer.h"
#include "tests/test_util.h"

namespace tmx {
namespace {

std::string fixture(const std::string& name) {
    return test::source_dir() + "/tests/fixtures/torch/" + name;
}

std::vector<int32_t> fixture_tokens(const std::string& dir) {
    return test::read_token_file(dir + "/tokens.txt");
}

// Forward + backward of the fixture's tokens (inputs tokens[:-1], targets tokens[1:]).
ForwardResult forward_backward(Model& model, const std::vector<int32_t>& tokens) {
    std::vector<int32_t> in(tokens.begin(), tokens.end() - 1), tg(tokens.begin() + 1, tokens.end());
    model.zero_grads();
    ForwardResult r = model.forward(in, 1, static_cast<int64_t>(in.size()), &tg, true);
    model.backward();
    return r;
}

struct TensorError {
    double max_err = 0, max_ref = 0;
};

TensorError compare(const float* got, const std::vector<float>& ref) {
    TensorError e;
    for (size_t i = 0; i < ref.size(); ++i) {
        e.max_ref = std::max(e.max_ref, static_cast<double>(std::abs(ref[i])));
        e.max_err = std::max(e.max_err, static_cast<double>(std::abs(ref[i] - got[i])));
    }
    return e;
}

class GradsVsTorch : public ::testing::TestWithParam<const char*> {};

TEST_P(GradsVsTorch, EveryParameterGradientMatchesFp64) {
    const std::string dir = fixture(GetParam());
    auto be = make_backend("cpu");
    auto model = load_model(dir, *be);
    ASSERT_GT(static_cast<int64_t>(fixture_tokens(dir).size()) - 1, model->config().sliding_window);
    ForwardResult r = forward_backward(*model, fixture_tokens(dir));

    nlohmann::json ref_loss = read_json_file(dir + "/grads/loss.json");
    EXPECT_NEAR(r.loss, ref_loss["ce"].get<double>(), 1e-5);
    EXPECT_NEAR(r.aux, ref_loss["aux"].get<double>(), 1e-5);

    SafetensorsFile ref(dir + "/grads/grads.safetensors");
    std::vector<float> grads(static_cast<size_t>(model->num_params()));
    be->download(model->grads(), grads.data());
    double global_max = 0;
    for (const auto& [name, entry] : ref.entries()) {
        std::vector<float> v(static_cast<size_t>(shape_numel(entry.shape)));
        ref.read_f32(name, v.data());
        global_max = std::max(global_max, compare(v.data(), std::vector<float>(v.size())).max_ref);
    }
    for (const auto& s : model->layout().specs) {
        SCOPED_TRACE(s.name);
        std::vector<float> want(static_cast<size_t>(s.numel()), 0.0f);
        // PyTorch leaves the gradient of an expert that received no token as None: zero here.
        if (ref.entries().count(s.name))
            ref.read_f32(s.name, want.data());
        else
            EXPECT_NE(s.name.find(".experts."), std::string::npos) << "missing in the fixture";
        TensorError e = compare(grads.data() + s.offset, want);
        // fp32 against fp64: errors sit near 1e-7 of the largest gradient; allow 1e-4 of the
        // tensor's own scale plus 1e-5 of the model's, which any wrong term exceeds by far.
        EXPECT_LE(e.max_err, 1e-4 * e.max_ref + 1e-5 * global_max)
            << "max |ref| " << e.max_ref << ", global " << global_max;
    }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GradsVsTorch,
                         ::testing::Values("test-tiny", "test-tiny-swiglu", "test-tiny-dense"));

TEST(AdamWVsTorch, OneStepFromZeroStateMatchesFp64) {
    const std::string dir = fixture("test-tiny");
    auto be = make_backend("cpu");
    auto model = load_model(dir, *be);
    forward_backward(*model, fixture_tokens(dir));
    const int64_t P = model->num_params();
    Tensor m = be->alloc({P}), v = be->alloc({P});
    be->fill(m, 0.0f);
    be->fill(v, 0.0f);
    const std::vector<float> before = model->params_to_host();
    // The trainer's step: decay on the layout's decayed tensors only (PyTorch's param groups).
    adamw_step(*model, m, v,
               {.lr = 1e-3f,
                .beta1 = 0.9f,
                .beta2 = 0.95f,
                .eps = 1e-8f,
                .weight_decay = 0.1f,
                .step = 1});
    const std::vector<float> after = model->params_to_host();
    std::vector<float> grads(static_cast<size_t>(P));
    be->download(model->grads(), grads.data());

    SafetensorsFile ref(dir + "/adamw_step/model.safetensors");
    SafetensorsFile ref_grads(dir + "/grads/grads.safetensors");
    for (const auto& s : model->layout().specs) {
        SCOPED_TRACE(s.name);
        std::vector<float> want(static_cast<size_t>(s.numel()));
        ref.read_f32(s.name, want.data());
        if (!ref_grads.entries().count(s.name)) {
            // An expert that received no token: PyTorch skips it (gradient None); the engine
            // treats the gradient as the zero it is, so only the decoupled decay moves it.
            for (int64_t i = 0; i < s.numel(); ++i) {
                const size_t at = static_cast<size_t>(s.offset + i);
                ASSERT_EQ(want[i], static_cast<float>(before[at]));
                ASSERT_NEAR(after[at], before[at] * (1.0f - (s.decay ? 1e-3f * 0.1f : 0.0f)), 1e-9);
            }
            continue;
        }
        for (int64_t i = 0; i < s.numel(); ++i) {
            const size_t at = static_cast<size_t>(s.offset + i);
            // The first Adam step moves each weight by about lr * sign(g); where |g| is within
            // a few eps of 0 the fp32 and fp64 gradients may round to different steps.
            const bool tiny_grad = std::abs(grads[at]) < 1e-6f;
            ASSERT_NEAR(after[at], want[i], tiny_grad ? 1.1e-3 : 2e-6)
                << "element " << i << " before " << before[at] << " grad " << grads[at];
        }
    }
}

// The training classifier runs in chunks of rows; any chunking gives the gradients and loss of
// one chunk, up to the order of the LM head's weight-gradient sums (fp32, a few rows each).
TEST(ClassifierChunks, ChunkedGradientsEqualOneChunk) {
    const std::string dir = fixture("test-tiny");
    auto be = make_backend("cpu");
    auto whole = load_model(dir, *be);
    const std::vector<int32_t> tokens = fixture_tokens(dir);
    const ForwardResult r_whole = forward_backward(*whole, tokens);
    std::vector<float> g_whole(static_cast<size_t>(whole->num_params()));
    be->download(whole->grads(), g_whole.data());
    const int64_t V = whole->config().vocab_size;
    for (int64_t rows : {1, 3, 7}) {
        SCOPED_TRACE("rows per chunk " + std::to_string(rows));
        auto chunked = load_model(dir, *be);
        chunked->set_classifier_chunk_values(rows * V);
        const ForwardResult r = forward_backward(*chunked, tokens);
        EXPECT_NEAR(r.loss, r_whole.loss, 1e-6 * r_whole.loss);
        std::vector<float> g(g_whole.size());
        be->download(chunked->grads(), g.data());
        const TensorError e = compare(g.data(), g_whole);
        EXPECT_LE(e.max_err, 1e-5 * std::max(1.0, e.max_ref));
    }
}

// A data-parallel trainer sums gradients the backward pass reports finished while the pass goes
// on: what it reports at each call must be what the pass ends with, bit for bit.
class FinishedGrads : public ::testing::TestWithParam<const char*> {};

TEST_P(FinishedGrads, AreReportedAsThePassGoesAndNeverWrittenAgain) {
    const std::string dir = fixture(GetParam());
    auto be = make_backend("cpu");
    auto model = load_model(dir, *be);
    const std::vector<int32_t> tokens = fixture_tokens(dir);
    std::vector<int32_t> in(tokens.begin(), tokens.end() - 1), tg(tokens.begin() + 1, tokens.end());
    const int64_t P = model->num_params();
    // Two passes accumulated, as in a step of two micro-batches: the second one reports.
    model->zero_grads();
    model->forward(in, 1, static_cast<int64_t>(in.size()), &tg, true);
    model->backward(0.5f);
    model->forward(in, 1, static_cast<int64_t>(in.size()), &tg, true);
    std::vector<std::pair<int64_t, std::vector<float>>> reported;
    model->backward(0.5f, [&](int64_t offset) {
        std::vector<float> g(static_cast<size_t>(P - offset));
        be->download(model->grads().slice(offset, {P - offset}), g.data());
        reported.emplace_back(offset, std::move(g));
    });
    std::vector<float> final_grads(static_cast<size_t>(P));
    be->download(model->grads(), final_grads.data());
    // The head and final norm, each layer, the embedding: lower offsets each time, 0 last.
    ASSERT_EQ(reported.size(), static_cast<size_t>(model->config().n_layers + 2));
    EXPECT_EQ(reported.back().first, 0);
    for (size_t i = 0; i < reported.size(); ++i) {
        const auto& [offset, g] = reported[i];
        if (i > 0) {
            EXPECT_LT(offset, reported[i - 1].first);
        }
        EXPECT_EQ(std::memcmp(g.data(), final_grads.data() + offset, g.size() * sizeof(float)), 0)
            << "gradients from offset " << offset << " changed after they were reported";
    }
    // The layer boundaries: each layer's first parameter.
    EXPECT_EQ(reported[1].first,
              model->layout()
                  .find("model.layers." + std::to_string(model->config().n_layers - 1) +
                        ".input_layernorm.weight")
                  ->offset);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FinishedGrads,
                         ::testing::Values("test-tiny", "test-tiny-swiglu", "test-tiny-dense"));

}  // namespace
}  // namespace tmx

// Model::forward_loss on every backend: the evaluation loss computed with the classifier in
// chunks of rows (no [B*T, V] logits) is the loss of the whole logits that forward() gives,
// with the same target count and aux loss, whatever the chunk.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "engine/model/model.h"
#include "tests/backends/backend_pair_fixture.h"
#include "tests/model_scenarios.h"

namespace tmx::test {
namespace {

class ModelLoss : public BackendPairTest {};

TEST_P(ModelLoss, ChunkedEvaluationLossIsTheLossOfTheWholeLogits) {
    SCOPED_TRACE(trace());
    for (const char* name : {"test-tiny", "test-tiny-swiglu", "test-tiny-dense"}) {
        const ModelConfig c = test_config(name);
        const int64_t V = c.vocab_size;
        for (const int64_t chunk_rows : {int64_t{1}, int64_t{3}, int64_t{1} << 20}) {
            const int64_t B = 1 + ints(1, 0, 3)[0], T = 5 + ints(1, 0, 40)[0];
            SCOPED_TRACE(std::string(name) + " B " + std::to_string(B) + " T " + std::to_string(T) +
                         ", chunks of " + std::to_string(chunk_rows) + " rows");
            auto model = spread_model(c, be(), seed_);
            model->set_classifier_chunk_values(chunk_rows * V);
            const std::vector<int32_t> tokens = ints(B * T, 0, static_cast<int32_t>(V));
            // Some positions unscored (-1), as at the end of a document.
            std::vector<int32_t> targets = ints(B * T, 0, static_cast<int32_t>(V));
            for (size_t i = 0; i < targets.size(); i += 7) targets[i] = -1;
            const ForwardResult whole = model->forward(tokens, B, T, &targets);
            const ForwardResult chunked = model->forward_loss(tokens, B, T, targets);
            EXPECT_FALSE(chunked.logits.defined());
            EXPECT_EQ(chunked.n_targets, whole.n_targets);
            EXPECT_GT(whole.n_targets, 0);
            // Each row's cross-entropy comes from the same matmul and reduction ops, on fewer
            // rows: the same to fp32 summation noise over d_model and V terms.
            EXPECT_NEAR(chunked.loss, whole.loss, reduction_tol(V) * std::abs(whole.loss));
            EXPECT_EQ(chunked.aux, whole.aux);
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Backends, ModelLoss, ::testing::ValuesIn(backend_names()),
                         backend_param_name);

}  // namespace
}  // namespace tmx::test

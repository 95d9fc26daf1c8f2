// Backend::run_recorded on every backend: a step run many times on the same tensors with new
// contents gives the result of its ops every time, whether the backend runs it afresh (CPU) or
// replays a recording of it made on the second run (CUDA: a CUDA graph; Vulkan: a secondary
// command buffer), and
// the memory the step allocated for itself stays reserved for the recording while other
// tensors come and go between the steps.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/model/kv_cache.h"
#include "engine/model/model.h"
#include "tests/backends/backend_pair_fixture.h"
#include "tests/model_scenarios.h"

namespace tmx::test {
namespace {

class RecordedStep : public BackendPairTest {};

TEST_P(RecordedStep, EveryRunComputesItsInputsAndKeepsItsOwnMemory) {
    SCOPED_TRACE(trace());
    constexpr int64_t n = 3000;  // no multiple of a block
    constexpr int kRuns = 6;
    Tensor a = be().alloc({n}), b = be().alloc({n}), out = be().alloc({n});
    Backend::StepRecording rec;
    int body_calls = 0;
    std::vector<Tensor> bystanders;
    for (int run = 0; run < kRuns; ++run) {
        const std::vector<float> ha = normal(n), hb = normal(n);
        be().upload(a, ha.data());
        be().upload(b, hb.data());
        be().run_recorded(rec, [&] {
            ++body_calls;
            Tensor sum = be().alloc({n});  // the step's own memory: rec keeps it
            be().add(a, b, sum);
            be().add(sum, a, out);
        });
        const std::vector<float> got = down(be(), out);
        for (int64_t i = 0; i < n; ++i) {
            const float want = (ha[i] + hb[i]) + ha[i];  // the same fp32 additions
            ASSERT_EQ(got[i], want) << "run " << run + 1 << ", element " << i;
        }
        // A tensor made between steps must not share the step's memory: the next run would
        // overwrite it.
        bystanders.push_back(be().alloc({n}));
        be().fill(bystanders.back(), static_cast<float>(run));
    }
    for (size_t k = 0; k < bystanders.size(); ++k)
        for (float x : down(be(), bystanders[k]))
            ASSERT_EQ(x, static_cast<float>(k)) << "a tensor made after run " << k + 1;
    // CUDA and Vulkan record on the second run and replay after that; the CPU runs the body
    // each time.
    EXPECT_EQ(body_calls, backend_name() == "cpu" ? kRuns : 2);
    EXPECT_EQ(rec.runs, body_calls);
}

// A cache whose decode steps one model recorded, then used by another model of the same
// config: the other model's step is its own, bit for bit the step it takes on a fresh view of
// the same cache (which starts without a recording).
TEST_P(RecordedStep, ACacheServesAnotherModelWithItsOwnWeights) {
    SCOPED_TRACE(trace());
    const ModelConfig c = test_config("test-tiny");
    auto first = spread_model(c, be(), seed_), second = spread_model(c, be(), seed_ + 1);
    KvCache cache(c, be(), 1);
    const std::vector<int32_t> tokens = ints(6, 0, static_cast<int32_t>(c.vocab_size));
    first->forward_cached({tokens[0], tokens[1]}, 1, 2, {0}, cache);
    int32_t pos = 2;
    for (; pos < 5; ++pos)  // a plain run, the recorded one, a replay
        first->forward_cached({tokens[pos]}, 1, 1, {pos}, cache);
    const std::vector<float> fresh =
        down(be(), second->forward_cached({tokens[pos]}, 1, 1, {pos}, cache.sequence(0)));
    const std::vector<float> reused =
        down(be(), second->forward_cached({tokens[pos]}, 1, 1, {pos}, cache));
    EXPECT_TRUE(BitwiseEqual(reused, fresh));
}

INSTANTIATE_TEST_SUITE_P(Backends, RecordedStep, ::testing::ValuesIn(backend_names()),
                         backend_param_name);

}  // namespace
}  // namespace tmx::test

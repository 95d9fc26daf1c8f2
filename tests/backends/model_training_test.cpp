// Training on every backend other than the CPU, against the CPU (tests/model_scenarios.h), in
// fp32: a model's logits, losses and every parameter gradient for the three small configs; 30
// training steps whose per-step losses follow the CPU's; a stopped and resumed run that ends
// bit-identical to an uninterrupted one. A backend that cannot be made here (no device)
// skips, saying why. The ops one by one are in backward_ops_test.cpp; each backend's own
// files add its precisions (CUDA's bf16).
#include <gtest/gtest.h>

#include <string>

#include "tests/backends/backend_pair_fixture.h"
#include "tests/model_scenarios.h"

namespace tmx::test {
namespace {

class ModelTraining : public BackendPairTest {
  protected:
    bool needs_training() const override { return true; }
};

TEST_P(ModelTraining, LogitsLossesAndEveryGradientMatchCpu) {
    SCOPED_TRACE(trace());
    for (const char* config : {"test-tiny", "test-tiny-swiglu", "test-tiny-dense"}) {
        SCOPED_TRACE(config);
        expect_model_matches_cpu(cpu(), be(), config, kFp32ModelTol);
    }
}

TEST_P(ModelTraining, LossesFollowTheCpuFor30Steps) {
    SCOPED_TRACE(trace());
    for (const char* config : {"test-tiny-dense", "test-tiny"}) {
        SCOPED_TRACE(config);
        expect_losses_follow_the_cpu(cpu(), be(), seed_, config, Precision::F32, 1e-3);
    }
}

TEST_P(ModelTraining, StoppedAndResumedRunEndsBitIdenticalToAnUninterruptedOne) {
    SCOPED_TRACE(trace());
    expect_resumed_run_matches_uninterrupted(be(), seed_);
}

// Not "Backends/...": gpu-check.sh's compute-sanitizer runs select Backends/*/cuda, the ops.
INSTANTIATE_TEST_SUITE_P(Training, ModelTraining, ::testing::ValuesIn(non_cpu_backend_names()),
                         backend_param_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(ModelTraining);

}  // namespace
}  // namespace tmx::test

// run_bench (engine/report/bench.h) with CPU backends standing in for GPUs, so that these run
// without one:
// - precision: each backend measures in --precision, else in its own default (bf16 on CUDA),
//   and is checked against the CPU's results in that same precision. A CPU backend whose default
//   is bf16 stands in for CUDA: its results equal the CPU's in bf16 (the same code) and would
//   miss the CPU's fp32 ones by bf16 rounding.
// - an op a backend cannot run at its shape (a Vulkan device that cannot bind --gemm's
//   operands) is reported as skipped, with the reason, and the rest of the bench goes on.
#include "engine/report/bench.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "engine/core/errors.h"
#include "tests/model_scenarios.h"

namespace tmx {
namespace {

class Bf16DefaultCpu : public CpuBackend {
  public:
    std::string name() const override { return "cpu-bf16"; }
    Precision default_precision() const override { return Precision::BF16; }
    // A published peak, as CUDA gives for the GPUs it knows (a different one per precision).
    double spec_peak_tflops(Precision p) const override {
        return p == Precision::BF16 ? 2e-3 : 1e-3;
    }
};

// Refuses square matmuls of `refused` rows, as a device refuses operands it cannot bind.
class CpuWithoutLargeMatmuls : public CpuBackend {
  public:
    explicit CpuWithoutLargeMatmuls(int64_t refused) : refused_(refused) {}
    std::string name() const override { return "cpu-small"; }

  protected:
    void matmul_impl(const Tensor& a, const Tensor& b, const Tensor& out, MatmulOptions opts,
                     const Tensor& bias) override {
        if (a.dim(0) == refused_ && a.dim(1) == refused_)
            throw Error("matmul: operands of " + std::to_string(refused_) +
                        " rows exceed this device");
        CpuBackend::matmul_impl(a, b, out, opts, bias);
    }

  private:
    int64_t refused_;
};

BenchOptions tiny_bench(std::vector<std::string> backends) {
    BenchOptions o;
    o.backends = std::move(backends);
    o.prompt_tokens = 12;
    o.decode_tokens = 4;
    o.batch = 2;
    o.warmup = 0;
    o.warm_seconds = 0;  // BenchWarmUp's own
    o.repeats = 1;
    o.gemm = 9;
    o.train_batch = 2;
    o.train_seq = 8;
    o.seed = 7;
    o.open_backend = [](const std::string& name) -> std::unique_ptr<Backend> {
        if (name == "cpu") return std::make_unique<CpuBackend>();
        if (name == "cpu-bf16") return std::make_unique<Bf16DefaultCpu>();
        if (name == "cpu-small") return std::make_unique<CpuWithoutLargeMatmuls>(9);
        throw UsageError("no backend " + name);
    };
    return o;
}

// Results of one backend against the CPU's in the same precision: the same code, so equal
// (1e-6 allows for nothing but summation order; a reference in the other precision misses by
// bf16's rounding, ~1e-3 and more).
void expect_equal_to_its_reference(const BackendBench& r) {
    SCOPED_TRACE(r.description);
    ASSERT_FALSE(r.ops.empty());
    for (const OpBench& op : r.ops) EXPECT_LT(op.max_error, 1e-6) << op.op;
    EXPECT_EQ(r.ops.back().op, "gemm (fp32)");
    EXPECT_LT(r.model.logits_error, 1e-6);
    EXPECT_EQ(r.model.greedy_steps, 4);
    EXPECT_EQ(r.model.greedy_matching, 4);
    ASSERT_TRUE(r.train.measured);
    EXPECT_EQ(r.train.precision, r.precision);
    ASSERT_TRUE(r.train.cpu_loss.has_value());
    EXPECT_NEAR(r.train.loss, *r.train.cpu_loss, 1e-6 * *r.train.cpu_loss);
}

TEST(BenchPrecision, EachBackendRunsInItsDefaultAndIsCheckedAgainstTheCpuInIt) {
    const std::vector<BackendBench> results =
        run_bench(test::test_config("test-tiny"), {}, tiny_bench({"cpu", "cpu-bf16"}));
    ASSERT_EQ(results.size(), 2u);
    EXPECT_EQ(results[0].precision, Precision::F32);
    EXPECT_EQ(results[0].description, "cpu, fp32 matmuls");
    EXPECT_EQ(results[1].precision, Precision::BF16);
    EXPECT_EQ(results[1].description, "cpu, bf16 matmuls");
    for (const BackendBench& r : results) expect_equal_to_its_reference(r);
    // The two precisions' runs are different computations: the bf16 loss is not the fp32 one.
    EXPECT_NE(results[0].train.loss, results[1].train.loss);
}

// In q8_0 the reference is the CPU on the weights' values in fp32: the CPU's own q8_0 row then
// shows the rounding of its int8 activations (small, not 0), while in bf16 (no activation
// rounding) its row is its own reference exactly.
TEST(BenchWeights, Q8_0IsCheckedAgainstTheDecodedWeightsAnd16BitsAgainstThemselves) {
    BenchOptions o = tiny_bench({"cpu"});
    o.train_batch = o.train_seq = 0;
    o.weight_format = DType::Q8_0;
    const ModelConfig c = test::test_config("test-tiny-swiglu");
    const BackendBench q8 = run_bench(c, {}, o).at(0);
    EXPECT_GT(q8.model.logits_error, 0.0);
    EXPECT_LT(q8.model.logits_error, 0.05);
    o.weight_format = DType::BF16;
    EXPECT_EQ(run_bench(c, {}, o).at(0).model.logits_error, 0.0);
}

// Without the check the step is timed as before and no CPU step is taken: no CPU loss.
TEST(BenchPrecision, WithoutTheTrainingCheckTheStepHasNoCpuLoss) {
    BenchOptions o = tiny_bench({"cpu-bf16"});
    o.train_check = false;
    const std::vector<BackendBench> results = run_bench(test::test_config("test-tiny"), {}, o);
    ASSERT_EQ(results.size(), 1u);
    ASSERT_TRUE(results[0].train.measured);
    EXPECT_GT(results[0].train.tokens_per_s, 0);
    EXPECT_TRUE(std::isfinite(results[0].train.loss));
    EXPECT_FALSE(results[0].train.cpu_loss.has_value());
}

TEST(BenchPrecision, AGivenPrecisionAppliesToEveryBackend) {
    BenchOptions o = tiny_bench({"cpu-bf16", "cpu"});
    o.precision = Precision::F32;
    const std::vector<BackendBench> fp32 = run_bench(test::test_config("test-tiny"), {}, o);
    ASSERT_EQ(fp32.size(), 2u);
    for (const BackendBench& r : fp32) {
        EXPECT_EQ(r.precision, Precision::F32);
        EXPECT_EQ(r.description, "cpu, fp32 matmuls");
        expect_equal_to_its_reference(r);
    }
    o.precision = Precision::BF16;
    o.train_batch = o.train_seq = 0;
    const std::vector<BackendBench> bf16 = run_bench(test::test_config("test-tiny"), {}, o);
    ASSERT_EQ(bf16.size(), 2u);
    for (const BackendBench& r : bf16) {
        EXPECT_EQ(r.precision, Precision::BF16);
        EXPECT_LT(r.model.logits_error, 1e-6) << r.backend;
        EXPECT_FALSE(r.train.measured);
    }
}

// --gemm 9 is the one square matmul of 9 rows: refused on cpu-small, which reports it as skipped,
// with the device's reason, and measures and checks everything else; the CPU measures it.
TEST(BenchOps, AnOpABackendCannotRunIsSkippedWithItsReasonAndTheRestIsMeasured) {
    BenchOptions o = tiny_bench({"cpu-small", "cpu"});
    std::vector<std::string> progress;
    o.progress = [&](const std::string& what) { progress.push_back(what); };
    const std::vector<BackendBench> results = run_bench(test::test_config("test-tiny"), {}, o);
    ASSERT_EQ(results.size(), 2u);
    const BackendBench& small = results[0];
    ASSERT_EQ(small.backend, "cpu-small");
    ASSERT_GT(small.ops.size(), 2u);
    const OpBench& gemm = small.ops.back();
    EXPECT_EQ(gemm.op, "gemm (fp32)");
    EXPECT_EQ(gemm.shape, "9x9x9");
    EXPECT_EQ(gemm.skipped, "matmul: operands of 9 rows exceed this device");
    EXPECT_EQ(gemm.ms, 0.0);
    EXPECT_EQ(std::count_if(progress.begin(), progress.end(),
                            [](const std::string& p) {
                                return p ==
                                       "cpu-small: gemm (fp32) skipped: matmul: operands of "
                                       "9 rows exceed this device";
                            }),
              1);
    for (size_t i = 0; i + 1 < small.ops.size(); ++i) {
        EXPECT_EQ(small.ops[i].skipped, "") << small.ops[i].op;
        EXPECT_GT(small.ops[i].ms, 0.0) << small.ops[i].op;
        EXPECT_LT(small.ops[i].max_error, 1e-6) << small.ops[i].op;
    }
    EXPECT_GT(small.model.decode_tokens_per_s, 0.0);
    EXPECT_EQ(small.model.greedy_matching, 4);
    EXPECT_TRUE(small.train.measured);
    EXPECT_EQ(results[1].ops.back().skipped, "");
    EXPECT_GT(results[1].ops.back().ms, 0.0);
}

// A backend other than the CPU is kept busy for warm_seconds before its first measurement (an
// idle GPU's clocks are lowered); the CPU backend, which has no such clocks, is not.
TEST(BenchWarmUp, OtherBackendsAreWarmedBeforeTheirFirstMeasurementAndTheCpuIsNot) {
    BenchOptions o = tiny_bench({"cpu", "cpu-bf16"});
    o.train_batch = o.train_seq = 0;
    o.warm_seconds = 0.25;
    std::vector<std::pair<std::string, std::chrono::steady_clock::time_point>> progress;
    o.progress = [&](const std::string& what) {
        progress.emplace_back(what, std::chrono::steady_clock::now());
    };
    run_bench(test::test_config("test-tiny"), {}, o);
    std::vector<std::string> lines;
    for (const auto& [line, at] : progress) lines.push_back(line);
    const auto warm = std::find(lines.begin(), lines.end(), "cpu-bf16: warming the device up");
    ASSERT_NE(warm, lines.end());
    EXPECT_EQ(std::count(lines.begin(), lines.end(), "cpu: warming the device up"), 0);
    const auto first = std::find_if(lines.begin(), lines.end(), [](const std::string& l) {
        return l.starts_with("cpu-bf16:") && l != "cpu-bf16: warming the device up";
    });
    ASSERT_NE(first, lines.end());
    EXPECT_EQ(first - warm, 1) << "the warm-up comes right before the backend's first op";
    const size_t w = static_cast<size_t>(warm - lines.begin());
    EXPECT_GE(std::chrono::duration<double>(progress[w + 1].second - progress[w].second).count(),
              0.25);
}

// The training step's MFU: against --peak-tflops where given, else the backend's published peak
// in the step's precision, else none (the CPU knows no peak).
TEST(BenchTraining, MfuIsAgainstTheGivenPeakElseThePublishedOne) {
    BenchOptions o = tiny_bench({"cpu", "cpu-bf16"});
    o.gemm = 0;
    std::vector<BackendBench> r = run_bench(test::test_config("test-tiny"), {}, o);
    ASSERT_EQ(r.size(), 2u);
    EXPECT_EQ(r[0].train.peak_tflops, 0.0);
    EXPECT_EQ(r[0].train.mfu, 0.0);
    const TrainBench& t = r[1].train;
    EXPECT_EQ(t.precision, Precision::BF16);
    EXPECT_EQ(t.peak_tflops, 2e-3);
    EXPECT_TRUE(t.peak_from_spec);
    ASSERT_GT(t.model_tflops, 0.0);
    EXPECT_DOUBLE_EQ(t.mfu, t.model_tflops / 2e-3);

    o.precision = Precision::F32;  // the fp32 peak
    r = run_bench(test::test_config("test-tiny"), {}, o);
    EXPECT_EQ(r[1].train.peak_tflops, 1e-3);
    EXPECT_DOUBLE_EQ(r[1].train.mfu, r[1].train.model_tflops / 1e-3);

    o.peak_tflops = 5e-3;  // the flag wins, on every backend
    r = run_bench(test::test_config("test-tiny"), {}, o);
    for (const BackendBench& b : r) {
        EXPECT_EQ(b.train.peak_tflops, 5e-3) << b.backend;
        EXPECT_FALSE(b.train.peak_from_spec) << b.backend;
        EXPECT_DOUBLE_EQ(b.train.mfu, b.train.model_tflops / 5e-3) << b.backend;
    }
}

}  // namespace
}  // namespace tmx

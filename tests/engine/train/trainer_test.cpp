#include "engine/train/trainer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "backends/cpu/cpu_backend.h"
#include "backends/registry.h"
#include "engine/core/errors.h"
#include "engine/core/file_io.h"
#include "engine/dist/communicator.h"
#include "engine/model/checkpoint.h"
#include "engine/train/metrics_plot.h"
#include "tests/model_scenarios.h"
#include "tests/test_util.h"

namespace tmx {
namespace {

namespace fs = std::filesystem;
using test::write_counting_dataset;

ModelConfig tiny_config() {
    return load_config(test::source_dir() + "/assets/configs/test-tiny.json");
}

// test::small_train_options for 60 steps (data order 0), evaluating every 20 and reporting
// every 5.
TrainOptions small_options(const std::string& data) {
    TrainOptions o = test::small_train_options(data, 0);
    o.max_steps = 60;
    o.eval_every = 20;
    o.log_every = 5;
    return o;
}

// Each test's setting: a temporary directory, the CPU backend, and a fresh seed for its random
// inputs (printed when the test fails; TMX_TEST_SEED=N replays it).
class TrainerRun : public ::testing::Test {
  protected:
    void TearDown() override {
        if (HasFailure()) std::cout << "[   SEED   ] TMX_TEST_SEED=" << seed << "\n";
    }
    // A counting dataset from `data_seed` in tmp/data, and small_options on it.
    TrainOptions data_and_options(uint64_t data_seed) {
        write_counting_dataset(tmp / "data", data_seed);
        return small_options(tmp / "data");
    }

    const uint64_t seed = test::fresh_seed();
    test::TempDir tmp;
    std::unique_ptr<Backend> be = make_backend("cpu");
};

TEST_F(TrainerRun, LossDecreasesOnATinyConfig) {
    TrainOptions o = data_and_options(seed);
    o.seed = seed;
    auto t = Trainer::start(tiny_config(), o, tmp / "run", seed, *be);
    const double before = t->evaluate();
    std::vector<TrainReport> reports;
    t->run([&](const TrainReport& r) { reports.push_back(r); });
    ASSERT_FALSE(reports.empty());
    EXPECT_NEAR(before, std::log(97.0), 0.3);  // a fresh model is close to uniform
    ASSERT_TRUE(reports.back().val_loss.has_value());
    EXPECT_LT(*reports.back().val_loss, before - 1.5) << "validation loss barely moved";
    EXPECT_LT(reports.back().loss, reports.front().loss - 1.0);
    // metrics.jsonl has one line per report, and the expert load sums to 1 per layer.
    std::string metrics = read_file(tmp / "run/metrics.jsonl");
    EXPECT_EQ(std::count(metrics.begin(), metrics.end(), '\n'), static_cast<long>(reports.size()));
    for (const auto& layer : reports.back().expert_load) {
        double sum = 0;
        for (double s : layer) sum += s;
        EXPECT_NEAR(sum, 1.0, 1e-9);
    }
    EXPECT_TRUE(fs::exists(tmp / "run/best/model.safetensors"));
    EXPECT_TRUE(fs::exists(tmp / "run/step_00000060/optimizer.safetensors"));
}

TEST_F(TrainerRun, StoppedAndResumedRunEndsBitIdenticalToAnUninterruptedOne) {
    TrainOptions o = data_and_options(seed);
    o.max_steps = 14;
    o.grad_accum = 2;
    o.log_every = 1;
    o.eval_every = 4;
    o.keep_last = 1;
    o.seed = seed;

    auto whole = Trainer::start(tiny_config(), o, tmp / "whole", seed, *be);
    whole->run([](const TrainReport&) {});

    std::atomic<bool> stop{false};
    auto first = Trainer::start(tiny_config(), o, tmp / "parts", seed, *be);
    first->run([&](const TrainReport& r) { stop = r.step >= 5; }, &stop);
    ASSERT_EQ(first->step(), 5);
    first.reset();
    // Resumed on a backend that stands at bf16, as CUDA's default puts it: the fp32 run stays
    // fp32 (the bit-identical result below shows it).
    Backend::ModeScope bf16(*be, {.precision = Precision::BF16});
    auto second = Trainer::resume(tmp / "parts", *be, nlohmann::json::object());
    EXPECT_EQ(be->matmul_precision(), Precision::F32);
    EXPECT_EQ(second->step(), 5);
    second->run([](const TrainReport&) {});

    EXPECT_EQ(second->model().params_to_host(), whole->model().params_to_host());
    // The optimizer state of the final checkpoints is identical too.
    EXPECT_EQ(read_file(tmp / "parts/step_00000014/optimizer.safetensors"),
              read_file(tmp / "whole/step_00000014/optimizer.safetensors"));
    EXPECT_EQ(read_file(tmp / "parts/step_00000014/model.safetensors"),
              read_file(tmp / "whole/step_00000014/model.safetensors"));
    // keep_last 1: the interruption's checkpoint is gone.
    EXPECT_FALSE(fs::exists(tmp / "parts/step_00000005"));
}

// A one-rank communicator that records the gradient sums a trainer makes, and checks the rule of
// started sums: nothing writes a started tensor until finish_sums() (it compares each with its
// bytes at the start).
class RecordingCommunicator final : public Communicator {
  public:
    struct Started {
        Tensor t;
        std::vector<float> at_start;
    };
    int rank() const override { return 0; }
    int size() const override { return 1; }
    std::string description() const override { return "recording, 1 rank"; }
    void all_reduce_sum(std::vector<double>&) override {}
    void broadcast(std::string&, int) override {}
    void barrier() override {}
    void all_reduce_sum(Backend&, const Tensor& t) override { summed.push_back(t.numel()); }
    void reduce_scatter_sum(Backend& be, const Tensor& t, const Tensor& shard) override {
        solo_.reduce_scatter_sum(be, t, shard);
    }
    void all_gather(Backend& be, const Tensor& shard, const Tensor& t) override {
        solo_.all_gather(be, shard, t);
    }
    void broadcast(Backend&, const Tensor&, int) override {}
    void start_all_reduce_sum(Backend& be, const Tensor& t) override {
        backend = &be;
        Started s{t, std::vector<float>(static_cast<size_t>(t.numel()))};
        be.download(t, s.at_start.data());
        in_flight.push_back(std::move(s));
    }
    void progress_sums() override { ++progress_calls; }
    void finish_sums() override {
        for (const Started& s : in_flight) {
            std::vector<float> now(s.at_start.size());
            backend->download(s.t, now.data());
            if (now != s.at_start) ++written_while_started;
            started.push_back({s.t.offset(), s.t.numel()});
        }
        in_flight.clear();
        ++finishes;
    }
    [[noreturn]] void abort(const std::string& message, int code) override {
        solo_.abort(message, code);
    }

    std::vector<int64_t> summed;                       // all_reduce_sum's sizes
    std::vector<std::pair<int64_t, int64_t>> started;  // (offset, numel), in start order
    std::vector<Started> in_flight;
    Backend* backend = nullptr;
    int finishes = 0, progress_calls = 0, written_while_started = 0;

  private:
    SoloCommunicator solo_;
};

// The last backward pass of each step starts the gradients' sums in buckets as it finishes them:
// from the top of the flat gradients down to 0, each exactly once, each bucket (but the last)
// at least the bucket size, none written after its start; and finished once per step. With no
// bucket size, one sum after the pass. The same weights either way.
TEST_F(TrainerRun, GradientSumsStartInBucketsAsTheBackwardPassFinishesThem) {
    TrainOptions o = data_and_options(seed);
    o.max_steps = 3;
    o.grad_accum = 2;
    o.seed = seed;
    const int64_t bucket = 1000;  // elements: test-tiny's layers hold more, its head less
    RecordingCommunicator bucketed, after;
    auto a = Trainer::start(tiny_config(), o, tmp / "bucketed", seed, *be,
                            {.comm = &bucketed, .bucket_bytes = bucket * 4});
    a->run([](const TrainReport&) {});
    auto b = Trainer::start(tiny_config(), o, tmp / "after", seed, *be,
                            {.comm = &after, .bucket_bytes = 0});
    b->run([](const TrainReport&) {});
    const int64_t P = a->model().num_params();

    EXPECT_EQ(bucketed.finishes, 3);
    EXPECT_EQ(bucketed.written_while_started, 0);
    EXPECT_TRUE(bucketed.summed.empty());
    EXPECT_GT(bucketed.progress_calls, 0);
    ASSERT_EQ(bucketed.started.size() % 3, 0u);
    const size_t per_step = bucketed.started.size() / 3;
    EXPECT_GE(per_step, 3u) << "test-tiny's pass should give several buckets";
    for (size_t step = 0; step < 3; ++step) {
        int64_t top = P;
        for (size_t i = 0; i < per_step; ++i) {
            const auto [offset, numel] = bucketed.started[step * per_step + i];
            EXPECT_EQ(offset + numel, top) << "bucket " << i << " of step " << step;
            if (i + 1 < per_step) {
                EXPECT_GE(numel, bucket);
            }
            top = offset;
        }
        EXPECT_EQ(top, 0);
    }
    EXPECT_EQ(after.summed, std::vector<int64_t>(3, P));
    EXPECT_TRUE(after.started.empty());
    EXPECT_EQ(a->model().params_to_host(), b->model().params_to_host());
}

// bf16 matmuls on the CPU (its emulation of the GPU's mixed precision): the run learns, its
// checkpoint records the precision, and a resume on a fresh backend (fp32 until told) picks it
// up from there and ends bit-identical to the uninterrupted run.
TEST_F(TrainerRun, Bf16MatmulsLearnAndResumeBitIdenticallyInTheRunsPrecision) {
    TrainOptions o = data_and_options(seed);
    o.precision = Precision::BF16;
    o.max_steps = 40;
    o.eval_every = 40;
    o.log_every = 1;
    o.keep_last = 1;
    o.seed = seed;

    auto whole = Trainer::start(tiny_config(), o, tmp / "whole", seed, *be);
    EXPECT_EQ(be->matmul_precision(), Precision::BF16);
    const double before = whole->evaluate();
    std::vector<TrainReport> reports;
    whole->run([&](const TrainReport& r) { reports.push_back(r); });
    ASSERT_TRUE(reports.back().val_loss.has_value());
    EXPECT_LT(*reports.back().val_loss, before - 1.0) << "validation loss barely moved in bf16";
    const auto state =
        nlohmann::json::parse(read_file(tmp / "whole/step_00000040/trainer_state.json"));
    EXPECT_EQ(state["options"]["precision"], "bf16");

    std::atomic<bool> stop{false};
    auto first = Trainer::start(tiny_config(), o, tmp / "parts", seed, *be);
    first->run([&](const TrainReport& r) { stop = r.step >= 7; }, &stop);
    ASSERT_EQ(first->step(), 7);
    first.reset();
    auto fresh = make_backend("cpu");
    ASSERT_EQ(fresh->matmul_precision(), Precision::F32);
    auto second = Trainer::resume(tmp / "parts", *fresh, nlohmann::json::object());
    EXPECT_EQ(fresh->matmul_precision(), Precision::BF16);
    second->run([](const TrainReport&) {});
    EXPECT_EQ(second->model().params_to_host(), whole->model().params_to_host());
    second.reset();  // releases the run

    // Resuming in the other precision is refused, naming the flag and the run's precision.
    try {
        Trainer::resume(tmp / "parts", *fresh, nlohmann::json{{"precision", "fp32"}});
        ADD_FAILURE() << "a resume in fp32 of a bf16 run was accepted";
    } catch (const UsageError& e) {
        EXPECT_NE(std::string(e.what()).find("precision cannot change"), std::string::npos)
            << e.what();
        EXPECT_NE(std::string(e.what()).find("bf16"), std::string::npos) << e.what();
    }

    // A backend without bf16 (a CUDA GPU older than Ampere) cannot resume it: the error says
    // where the run can go on (--precision fp32 would be refused as above), and leaves the run
    // as it was.
    struct CpuWithoutBf16 : CpuBackend {
        std::string name() const override { return "no-bf16"; }
        bool supports_precision(Precision p) const override { return p == Precision::F32; }
    } no_bf16;
    const std::string metrics = read_file(tmp / "parts/metrics.jsonl");
    try {
        Trainer::resume(tmp / "parts", no_bf16, nlohmann::json::object());
        ADD_FAILURE() << "a backend without bf16 resumed a bf16 run";
    } catch (const UsageError& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("trainer_state.json"), std::string::npos) << what;
        EXPECT_NE(what.find("bf16 matmuls, which the no-bf16 backend has not"), std::string::npos)
            << what;
        EXPECT_NE(what.find("backend cpu"), std::string::npos) << what;
    }
    EXPECT_EQ(read_file(tmp / "parts/metrics.jsonl"), metrics);
    EXPECT_EQ(no_bf16.memory_stats().peak_bytes, 0u);  // refused before allocating
}

TEST_F(TrainerRun, BadOptionsAndMismatchedDataGiveClearErrors) {
    write_counting_dataset(tmp / "data", 1);
    write_counting_dataset(tmp / "data300", 1, 300);
    auto error_of = [&](TrainOptions o, const std::string& run) -> std::string {
        try {
            Trainer::start(tiny_config(), o, tmp / run, 0, *be);
        } catch (const Error& e) {
            return e.what();
        }
        return "";
    };
    TrainOptions o = small_options(tmp / "data");
    TrainOptions bad = o;
    bad.batch_size = 0;
    EXPECT_NE(error_of(bad, "r1").find("batch_size"), std::string::npos);
    bad = o;
    bad.max_tokens = 1000;
    EXPECT_NE(error_of(bad, "r2").find("exactly one budget"), std::string::npos);
    bad = o;
    bad.seq_len = 33;
    EXPECT_NE(error_of(bad, "r3").find("seq_len"), std::string::npos);
    bad = o;
    bad.min_lr = 1.0;
    EXPECT_NE(error_of(bad, "r4").find("min_lr"), std::string::npos);
    bad = o;
    bad.data_dir = tmp / "data300";
    std::string e = error_of(bad, "r5");
    EXPECT_NE(e.find("vocabulary of 300"), std::string::npos) << e;
    EXPECT_NE(e.find("vocab_size is 97"), std::string::npos) << e;
    bad = o;
    bad.data_dir = tmp / "nothing";
    EXPECT_NE(error_of(bad, "r6").find("nothing"), std::string::npos);
    // An existing run is not overwritten by a new one.
    fs::create_directories(tmp / "r7");
    test::write_text(tmp / "r7/metrics.jsonl", "{}\n");
    EXPECT_NE(error_of(o, "r7").find("resume"), std::string::npos);
    // Resuming may not change the math.
    auto t = Trainer::start(tiny_config(), o, tmp / "r8", 0, *be);
    std::atomic<bool> stop{true};
    t->run([](const TrainReport&) {}, &stop);
    // No step was taken, so there is no checkpoint to resume from.
    EXPECT_THROW(Trainer::resume(tmp / "r8", *be, nlohmann::json::object()), Error);
}

// metrics.jsonl's lines without their timing, which differs between runs.
std::vector<nlohmann::json> metrics_without_timing(const std::string& run) {
    std::vector<nlohmann::json> lines;
    std::istringstream in(read_file(run + "/metrics.jsonl"));
    for (std::string line; std::getline(in, line);) {
        nlohmann::json j = nlohmann::json::parse(line);
        j.erase("tokens_per_s");
        j.erase("elapsed_s");
        lines.push_back(std::move(j));
    }
    return lines;
}

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "(no error)";
}

bool weights_are_finite(const std::string& checkpoint) {
    auto be = make_backend("cpu");
    for (float v : load_model(checkpoint, *be)->params_to_host())
        if (!std::isfinite(v)) return false;
    return true;
}

// Stops, as a signal does, in the middle of an optimizer step (its second micro-batch), in the
// middle of an evaluation, and between two steps; each resumed run ends as the uninterrupted
// one does: weights, optimizer state, best/ and every metrics line (the first after the resume
// averages the same steps).
TEST_F(TrainerRun, AStopInsideAStepOrAnEvaluationResumesExactlyAsTheUninterruptedRun) {
    TrainOptions o = data_and_options(seed);
    o.max_steps = 10;
    o.grad_accum = 2;
    o.log_every = 4;
    o.eval_every = 5;
    o.eval_batches = 3;  // 3 evaluation batches, each a chance to stop
    o.keep_last = 1;
    o.seed = seed;
    auto whole = Trainer::start(tiny_config(), o, tmp / "whole", seed, *be);
    whole->run([](const TrainReport&) {});

    struct Case {
        int64_t at_step, at_poll;  // stop at this poll while step() == at_step
        const char* where;
    };
    for (const Case c :
         {Case{6, 2, "in step 7's second micro-batch"}, Case{5, 2, "in step 5's evaluation"},
          Case{8, 1, "between steps 8 and 9"}}) {
        SCOPED_TRACE(c.where);
        const std::string run = tmp / ("stop" + std::to_string(c.at_step));
        auto first = Trainer::start(tiny_config(), o, run, seed, *be);
        int64_t polls = 0;
        first->run([](const TrainReport&) {},
                   [&] { return first->step() == c.at_step && ++polls == c.at_poll; });
        ASSERT_EQ(first->step(), c.at_step);
        EXPECT_EQ(first->last_checkpoint(), run + "/step_0000000" + std::to_string(c.at_step));
        first.reset();
        auto second = Trainer::resume(run, *be, nlohmann::json::object());
        ASSERT_EQ(second->step(), c.at_step);
        second->run([](const TrainReport&) {});
        EXPECT_EQ(second->model().params_to_host(), whole->model().params_to_host());
        for (const char* file : {"step_00000010/optimizer.safetensors", "best/model.safetensors",
                                 "best/trainer_state.json"})
            EXPECT_EQ(read_file(run + "/" + file), read_file(tmp / "whole" + "/" + file)) << file;
        EXPECT_EQ(metrics_without_timing(run), metrics_without_timing(tmp / "whole"));
    }
}

TEST_F(TrainerRun, NonFiniteOrOutOfRangeHyperparametersAreUsageErrorsNamingTheFlag) {
    write_counting_dataset(tmp / "data", 1);
    const double nan = std::nan(""), inf = INFINITY;
    struct Case {
        const char* flag;
        double TrainOptions::*field;
        double value;
    };
    for (const Case c : {Case{"lr", &TrainOptions::lr, inf},
                         {"lr", &TrainOptions::lr, nan},
                         {"min_lr", &TrainOptions::min_lr, nan},
                         {"min_lr", &TrainOptions::min_lr, -inf},
                         {"grad_clip", &TrainOptions::grad_clip, nan},
                         {"grad_clip", &TrainOptions::grad_clip, inf},
                         {"eps", &TrainOptions::eps, inf},
                         {"eps", &TrainOptions::eps, 0.0},
                         {"weight_decay", &TrainOptions::weight_decay, nan},
                         {"weight_decay", &TrainOptions::weight_decay, inf},
                         {"beta1", &TrainOptions::beta1, nan},
                         {"beta2", &TrainOptions::beta2, 1.0}}) {
        TrainOptions o = small_options(tmp / "data");
        o.*c.field = c.value;
        SCOPED_TRACE(std::string(c.flag) + " " + std::to_string(c.value));
        try {
            Trainer::start(tiny_config(), o, tmp / "run", 0, *be);
            ADD_FAILURE() << "accepted";
        } catch (const UsageError& e) {
            EXPECT_EQ(std::string(e.what()).rfind(std::string(c.flag) + ":", 0), 0u) << e.what();
        }
    }
    // Token counts that overflow are refused too, naming the flags.
    TrainOptions o = small_options(tmp / "data");
    o.batch_size = int64_t{1} << 40;
    o.grad_accum = int64_t{1} << 40;
    EXPECT_NE(error_of([&] {
                  Trainer::start(tiny_config(), o, tmp / "run", 0, *be);
              }).find("batch_size x grad_accum x seq_len"),
              std::string::npos);
}

// A learning rate of 1e30 is finite but makes the weights explode after the first step: the run
// stops with an error at the first non-finite value, and no checkpoint holds one.
TEST_F(TrainerRun, ADivergingRunStopsAndNeverCheckpointsNonFiniteWeights) {
    TrainOptions o = data_and_options(3);
    o.lr = o.min_lr = 1e30;
    o.warmup_steps = 0;
    o.max_steps = 6;
    o.eval_every = 1;
    o.checkpoint_every = 1;
    o.log_every = 1;
    auto t = Trainer::start(tiny_config(), o, tmp / "run", 3, *be);
    const std::string e = error_of([&] { t->run([](const TrainReport&) {}); });
    EXPECT_NE(e.find("NaN"), std::string::npos) << e;
    EXPECT_NE(e.find("no checkpoint was written"), std::string::npos) << e;
    EXPECT_LT(t->step(), 6);
    for (const auto& entry : fs::directory_iterator(tmp / "run")) {
        if (entry.is_directory()) {
            EXPECT_TRUE(weights_are_finite(entry.path())) << entry.path();
        }
    }
    // The non-finite value is logged as valid JSON that the plot reads.
    const std::string metrics = read_file(tmp / "run/metrics.jsonl");
    EXPECT_NE(metrics.find("\"nonfinite\""), std::string::npos) << metrics;
    EXPECT_NE(render_metrics_svg(metrics, "run", "metrics.jsonl").find("non-finite"),
              std::string::npos);
}

TEST_F(TrainerRun, SkipNonfiniteSkipsUpToItsLimitWithoutTouchingTheWeights) {
    TrainOptions o = data_and_options(4);
    o.lr = o.min_lr = 1e30;
    o.warmup_steps = 0;
    o.max_steps = 8;
    o.eval_every = 0;
    o.log_every = 1;
    o.skip_nonfinite = 2;
    auto t = Trainer::start(tiny_config(), o, tmp / "run", 4, *be);
    std::vector<float> after_first_step;
    const std::string e = error_of([&] {
        t->run([&](const TrainReport& r) {
            if (r.step == 1) after_first_step = t->model().params_to_host();
        });
    });
    // Step 1 applies (its loss was computed before the update); steps 2 and 3 are skipped;
    // step 4 is one too many.
    EXPECT_NE(e.find("step 4:"), std::string::npos) << e;
    EXPECT_NE(e.find("more than skip_nonfinite 2"), std::string::npos) << e;
    EXPECT_EQ(t->step(), 3);
    EXPECT_EQ(t->model().params_to_host(), after_first_step);
    // A rejected step keeps none of its activations: what stays is the weights, gradients and
    // AdamW moments (fp32, 16 B/param).
    EXPECT_EQ(be->memory_stats().live_bytes, 16 * static_cast<size_t>(t->model().num_params()));
    int skipped = 0, fatal = 0;
    for (const nlohmann::json& line : metrics_without_timing(tmp / "run")) {
        if (!line.contains("nonfinite")) continue;
        EXPECT_EQ(line["loss"], "NaN");
        (line["skipped"].get<bool>() ? skipped : fatal)++;
    }
    EXPECT_EQ(skipped, 2);
    EXPECT_EQ(fatal, 1);
}

// The file is a link to /dev/full, where every write fails with ENOSPC (a full disk).
TEST_F(TrainerRun, AFailedMetricsWriteStopsTheRunAfterALastCheckpoint) {
    if (!fs::exists("/dev/full")) GTEST_SKIP() << "needs /dev/full";
    TrainOptions o = data_and_options(seed);
    o.max_steps = 12;
    o.seed = seed;
    auto whole = Trainer::start(tiny_config(), o, tmp / "whole", seed, *be);
    whole->run([](const TrainReport&) {});

    auto t = Trainer::start(tiny_config(), o, tmp / "run", seed, *be);
    fs::remove(tmp / "run/metrics.jsonl");
    fs::create_symlink("/dev/full", tmp / "run/metrics.jsonl");
    const std::string e = error_of([&] { t->run([](const TrainReport&) {}); });
    EXPECT_NE(e.find("metrics.jsonl: cannot append a line: No space left on device"),
              std::string::npos)
        << e;
    EXPECT_NE(e.find("step_00000005"), std::string::npos) << e;  // the first line, at step 5
    EXPECT_EQ(t->step(), 5);
    t.reset();
    // Once the file can be written, the run resumes and logs step 5's line it could not.
    fs::remove(tmp / "run/metrics.jsonl");
    auto resumed = Trainer::resume(tmp / "run", *be, nlohmann::json::object());
    resumed->run([](const TrainReport&) {});
    EXPECT_EQ(metrics_without_timing(tmp / "run"), metrics_without_timing(tmp / "whole"));
    EXPECT_EQ(resumed->model().params_to_host(), whole->model().params_to_host());
}

// What a checkpoint write killed part way leaves: the writer's temporary sibling directory
// (here one of a later step, with a complete trainer_state.json), and write_file_atomic's
// temporary file.
TEST_F(TrainerRun, LeftoversOfAKilledCheckpointWriteAreNeverTakenForCheckpointsAndAreRemoved) {
    TrainOptions o = data_and_options(5);
    o.max_steps = 4;
    o.checkpoint_every = 1;
    o.keep_last = 2;
    Trainer::start(tiny_config(), o, tmp / "run", 5, *be)->run([](const TrainReport&) {});
    const std::string leftover = tmp / "run/step_00000009.tmp-4242";
    fs::copy(tmp / "run/step_00000004", leftover);
    nlohmann::json state = read_json_file(leftover + "/trainer_state.json");
    state["step"] = 9;
    test::write_text(leftover + "/trainer_state.json", state.dump());
    fs::create_directory(tmp / "run/best.tmp-4242");
    test::write_text(tmp / "run/metrics.jsonl.tmp.4242", "{\"step\": 9");

    EXPECT_NE(resolve_run_checkpoint(tmp / "run"), leftover);
    EXPECT_NE(error_of([&] { resolve_run_checkpoint(leftover); }).find("unfinished checkpoint"),
              std::string::npos);
    auto t = Trainer::resume(tmp / "run", *be, {{"max_steps", 6}});
    EXPECT_EQ(t->step(), 4);
    t->run([](const TrainReport&) {});
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(tmp / "run"))
        names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    // --keep-last 2 kept the two newest real checkpoints; the leftovers are gone.
    EXPECT_EQ(names, (std::vector<std::string>{"best", "metrics.jsonl", "step_00000005",
                                               "step_00000006", "train.lock"}));
}

TEST_F(TrainerRun, ASecondTrainerOfARunIsRefusedNamingTheHolder) {
    TrainOptions o = data_and_options(6);
    o.max_steps = 2;
    auto holder = Trainer::start(tiny_config(), o, tmp / "run", 6, *be);
    holder->run([](const TrainReport&) {});
    const std::string e = error_of([&] { Trainer::resume(tmp / "run", *be, {{"max_steps", 4}}); });
    EXPECT_NE(
        e.find("in use by another tmx train (pid " + std::to_string(::getpid()) + " on host "),
        std::string::npos)
        << e;
    holder.reset();  // its lock goes with it
    EXPECT_EQ(Trainer::resume(tmp / "run", *be, {{"max_steps", 4}})->step(), 2);
}

TEST_F(TrainerRun, AMissingOrMistypedTrainerStateFieldIsAnErrorNamingFileAndField) {
    TrainOptions o = data_and_options(7);
    o.max_steps = 1;
    Trainer::start(tiny_config(), o, tmp / "run", 7, *be)->run([](const TrainReport&) {});
    const std::string path = tmp / "run/step_00000001/trainer_state.json";
    const nlohmann::json good = read_json_file(path);
    const auto error_with = [&](const std::function<void(nlohmann::json&)>& edit) {
        nlohmann::json state = good;
        edit(state);
        test::write_text(path, state.dump());
        return error_of([&] { Trainer::resume(tmp / "run", *be, nlohmann::json::object()); });
    };
    EXPECT_EQ(error_with([](nlohmann::json& s) { s.erase("step"); }),
              path + ": field 'step': missing (expected an integer >= 0)");
    EXPECT_EQ(error_with([](nlohmann::json& s) { s["step"] = -3; }),
              path + ": field 'step': expected an integer >= 0, got -3");
    EXPECT_EQ(error_with([](nlohmann::json& s) { s["options"].erase("lr"); }),
              path + ": options: field 'lr': missing (expected a number)");
    EXPECT_EQ(error_with([](nlohmann::json& s) { s["options"]["seq_len"] = "16"; }),
              path + ": options: field 'seq_len': expected an integer, got \"16\"");
    EXPECT_EQ(error_with([](nlohmann::json& s) { s["since_report"]["expert_slots"] = 3; }),
              path +
                  ": since_report: field 'expert_slots': expected an array (per layer) of "
                  "arrays of integers >= 0, got 3");
}

// Resuming from optimizer moments that hold NaN or infinity would make every weight NaN at the
// first step: an error naming the file and the tensor, as for weights. The same checkpoint,
// restored, resumes.
TEST_F(TrainerRun, NonFiniteOptimizerMomentsOnResumeAreAnErrorNamingFileAndTensor) {
    Rng rng(seed);
    TrainOptions o = data_and_options(8);
    o.max_steps = 1;
    Trainer::start(tiny_config(), o, tmp / "run", 8, *be)->run([](const TrainReport&) {});
    const std::string path = tmp / "run/step_00000001/optimizer.safetensors";
    const std::string good = read_file(path);
    std::map<std::string, std::vector<float>> moments;
    Shape shape;
    {
        const SafetensorsFile file(path);
        for (const auto& [name, entry] : file.entries()) {
            moments[name].resize(static_cast<size_t>(shape_numel(entry.shape)));
            file.read_f32(name, moments[name].data());
            shape = entry.shape;
        }
    }
    ASSERT_EQ(moments.size(), 2u);
    const float bad[] = {std::nanf(""), INFINITY, -INFINITY};
    for (int round = 0; round < 4; ++round) {
        const std::string name = rng.below(2) ? "exp_avg" : "exp_avg_sq";
        const size_t at = static_cast<size_t>(rng.below(moments[name].size()));
        const float value = bad[rng.below(3)];
        auto edited = moments;
        edited[name][at] = value;
        std::vector<HostTensorRef> refs;
        for (const auto& [n, values] : edited) refs.push_back({n, shape, values.data()});
        test::write_text(path, encode_safetensors(refs, StorageType::F32));
        EXPECT_EQ(error_of([&] { Trainer::resume(tmp / "run", *be, nlohmann::json::object()); }),
                  path + ": tensor '" + name + "' holds " +
                      (std::isnan(value) ? "NaN" : "infinity") + " at element " +
                      std::to_string(at) + " of " + shape_string(shape) +
                      " (optimizer moments must be finite)");
    }
    test::write_text(path, good);
    EXPECT_EQ(Trainer::resume(tmp / "run", *be, nlohmann::json::object())->step(), 1);
}

// What a run allocates at its peak is training_memory(), to the byte: the engine's estimate is
// its own accounting, not a bound. Three small models (MoE gelu, MoE swiglu, dense), fp32 and
// bf16, steps with validation passes between them; the second step frees the first's
// activations before making its own.
TEST_F(TrainerRun, PeakMemoryOfARunIsTheTrainingMemoryEstimate) {
    Rng rng(seed);
    write_counting_dataset(tmp / "data", seed);
    int run = 0;
    for (const char* name : {"test-tiny", "test-tiny-swiglu", "test-tiny-dense"}) {
        for (const Precision precision : {Precision::F32, Precision::BF16}) {
            const ModelConfig c = test::test_config(name);
            TrainOptions o = small_options(tmp / "data");
            o.precision = precision;
            o.batch_size = 1 + static_cast<int64_t>(rng.below(4));
            o.seq_len = 5 + static_cast<int64_t>(rng.below(20));
            o.max_steps = 3;
            o.eval_every = 1 + static_cast<int64_t>(rng.below(2));
            SCOPED_TRACE(std::string(name) + " " + to_string(precision) + " batch " +
                         std::to_string(o.batch_size) + " seq " + std::to_string(o.seq_len));
            auto measured = make_backend("cpu");  // its peak is this run's alone
            auto t = Trainer::start(c, o, tmp / ("run" + std::to_string(run++)), seed, *measured);
            t->run([](const TrainReport&) {});
            const TrainingMemory m = training_memory(c, o.batch_size, o.seq_len, precision);
            EXPECT_EQ(static_cast<double>(measured->memory_stats().peak_bytes), m.total());
            const double P = static_cast<double>(t->model().num_params());
            EXPECT_EQ(m.weights + m.gradients + m.optimizer + m.bf16_weights,
                      (precision == Precision::BF16 ? 18 : 16) * P);
            EXPECT_GT(m.activations, 0);
            EXPECT_GT(m.step_scratch, 0);
        }
    }
}

// adamw_step gives each parameter exactly the update of its kind: AdamW with weight decay for
// the tensors the layout marks, without for the others (norms, biases, the token embedding),
// bit for bit as one adamw call of that kind over the whole flat tensors would. The model has
// biases everywhere, so decayed and undecayed tensors alternate; the moments start non-zero.
TEST(AdamWStep, DecaysExactlyTheTensorsTheLayoutMarks) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("TMX_TEST_SEED=" + std::to_string(seed));
    Rng rng(seed);
    ModelConfig c = tiny_config();
    c.attn_bias = c.ffn_bias = true;
    c.norm_type = NormType::LayerNorm;
    auto be = make_backend("cpu");
    Model model(c, *be);
    model.init_random(seed);
    const int64_t P = model.num_params();
    const size_t n = static_cast<size_t>(P);
    const std::vector<float> p0 = model.params_to_host(), g = test::random_normal(rng, n, 0.3);
    std::vector<float> m0 = test::random_normal(rng, n, 0.1), v0 = test::random_normal(rng, n);
    for (float& x : v0) x *= x;
    be->upload(model.grads(), g.data());
    const Backend::AdamWParams hp{.lr = 1e-2f,
                                  .beta1 = 0.9f,
                                  .beta2 = 0.95f,
                                  .eps = 1e-8f,
                                  .weight_decay = 0.5f,
                                  .step = 3,
                                  .grad_scale = 0.7f};
    // The update of each kind over every element: the reference.
    struct State {
        std::vector<float> p, m, v;
    };
    const auto whole = [&](float weight_decay) {
        Tensor tp = be->alloc({P}), tg = be->alloc({P}), tm = be->alloc({P}), tv = be->alloc({P});
        for (const auto& [t, host] : {std::pair{&tp, &p0}, {&tg, &g}, {&tm, &m0}, {&tv, &v0}})
            be->upload(*t, host->data());
        Backend::AdamWParams h = hp;
        h.weight_decay = weight_decay;
        be->adamw(tp, tg, tm, tv, h);
        State s{std::vector<float>(n), std::vector<float>(n), std::vector<float>(n)};
        for (const auto& [t, host] : {std::pair{&tp, &s.p}, {&tm, &s.m}, {&tv, &s.v}})
            be->download(*t, host->data());
        return s;
    };
    const State decayed = whole(hp.weight_decay), plain = whole(0.0f);

    Tensor m = be->alloc({P}), v = be->alloc({P});
    be->upload(m, m0.data());
    be->upload(v, v0.data());
    adamw_step(model, m, v, hp);
    State got{model.params_to_host(), std::vector<float>(n), std::vector<float>(n)};
    be->download(m, got.m.data());
    be->download(v, got.v.data());
    int64_t with_decay = 0, without = 0;
    for (const ParamSpec& s : model.layout().specs) {
        SCOPED_TRACE(s.name + (s.decay ? " (decayed)" : " (no decay)"));
        (s.decay ? with_decay : without) += 1;
        const State& want = s.decay ? decayed : plain;
        for (int64_t i = s.offset; i < s.offset + s.numel(); ++i) {
            ASSERT_EQ(got.p[i], want.p[i]) << "params element " << i - s.offset;
            ASSERT_EQ(got.m[i], want.m[i]) << "m element " << i - s.offset;
            ASSERT_EQ(got.v[i], want.v[i]) << "v element " << i - s.offset;
        }
    }
    EXPECT_GT(with_decay, 4);
    EXPECT_GT(without, 4);
    EXPECT_NE(decayed.p, plain.p) << "the weight decay made no difference the test could see";
}

// A batch whose memory estimate passes the parameter report's 1 EiB bound, or whose
// training_memory() exceeds the backend's memory, is a usage error naming the flags,
// before the run directory or any tensor is made.
TEST_F(TrainerRun, ABatchBeyondTheMemoryEstimateIsRefusedBeforeAnythingIsAllocated) {
    Rng rng(seed);
    TrainOptions o = data_and_options(9);
    o.max_steps = 1;
    // More than any machine's memory (2^30 x 16 tokens, ~1 KB each: > 16 TiB), and more than
    // 1 EiB; both fit the token-count arithmetic.
    for (const int64_t batch : {(int64_t{1} << 30) + static_cast<int64_t>(rng.below(1 << 30)),
                                (int64_t{1} << 52) + static_cast<int64_t>(rng.below(1 << 30))}) {
        SCOPED_TRACE("batch_size " + std::to_string(batch));
        ASSERT_GT(be->memory_capacity(), 0u);
        o.batch_size = batch;
        std::string e;
        try {
            Trainer::start(tiny_config(), o, tmp / "run", 9, *be);
        } catch (const UsageError& u) {
            e = u.what();
        }
        EXPECT_NE(e.find("batch_size"), std::string::npos) << e;
        EXPECT_NE(e.find("seq_len"), std::string::npos) << e;
        EXPECT_TRUE(e.find("more than the cpu backend's") != std::string::npos ||
                    e.find("more than the limit of 1 EiB") != std::string::npos)
            << e;
        EXPECT_EQ(be->memory_stats().peak_bytes, 0u);
        EXPECT_FALSE(fs::exists(tmp / "run"));
    }
    // The same model and sequence at a batch that fits trains.
    o.batch_size = 1 + static_cast<int64_t>(rng.below(4));
    EXPECT_EQ(
        Trainer::start(tiny_config(), o, tmp / "run", 9, *be)->run([](const TrainReport&) {}).step,
        1);
}

}  // namespace
}  // namespace tmx

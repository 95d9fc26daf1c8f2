#include "engine/trainer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "engine/checkpoint.h"
#include "engine/errors.h"
#include "engine/file_io.h"
#include "tests/test_util.h"

namespace tmx {
namespace {

namespace fs = std::filesystem;

ModelConfig tiny_config() {
    return load_config(test::source_dir() + "/assets/configs/test-tiny.json");
}

// A dataset of learnable documents: BOS, then a random start and a random stride, counting
// modulo the vocabulary, so that the next token follows from the previous two.
void write_counting_dataset(const std::string& dir, uint64_t seed, int32_t vocab = 97) {
    Rng rng(seed);
    DatasetWriter w(dir, static_cast<uint64_t>(vocab));
    for (int doc = 0; doc < 120; ++doc) {
        std::vector<int32_t> tokens = {1};
        int32_t x = 3 + static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab - 3)));
        const int32_t stride = 1 + static_cast<int32_t>(rng.below(3));
        for (int i = 0; i < 40; ++i) {
            tokens.push_back(x);
            x = 3 + (x - 3 + stride) % (vocab - 3);
        }
        w.add_document(doc % 10 == 9 ? Split::Val : Split::Train, tokens.data(), tokens.size());
    }
    w.commit({{"bos_id", 1}, {"eos_id", 2}});
}

TrainOptions small_options(const std::string& data) {
    TrainOptions o;
    o.data_dir = data;
    o.batch_size = 4;
    o.seq_len = 16;
    o.max_steps = 60;
    o.lr = 1e-2;
    o.min_lr = 1e-3;
    o.warmup_steps = 5;
    o.eval_every = 20;
    o.eval_batches = 2;
    o.checkpoint_every = 0;
    o.log_every = 5;
    return o;
}

TEST(Trainer, LossDecreasesOnATinyConfig) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    test::TempDir tmp;
    write_counting_dataset(tmp / "data", seed);
    auto be = make_backend("cpu");
    TrainOptions o = small_options(tmp / "data");
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

TEST(Trainer, StoppedAndResumedRunEndsBitIdenticalToAnUninterruptedOne) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    test::TempDir tmp;
    write_counting_dataset(tmp / "data", seed);
    auto be = make_backend("cpu");
    TrainOptions o = small_options(tmp / "data");
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
    auto second = Trainer::resume(tmp / "parts", *be, nlohmann::json::object());
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

TEST(Trainer, LearningRateWarmsUpThenDecaysToTheFloor) {
    TrainOptions o;
    o.lr = 1e-3;
    o.min_lr = 1e-4;
    o.warmup_steps = 10;
    EXPECT_DOUBLE_EQ(Trainer::learning_rate(o, 0, 100), 1e-4);
    EXPECT_DOUBLE_EQ(Trainer::learning_rate(o, 9, 100), 1e-3);
    EXPECT_NEAR(Trainer::learning_rate(o, 55, 100), 5.5e-4, 1e-12);  // half way: the mean
    EXPECT_NEAR(Trainer::learning_rate(o, 100, 100), 1e-4, 1e-12);
    for (int s = 10; s < 100; ++s)
        EXPECT_LE(Trainer::learning_rate(o, s + 1, 100), Trainer::learning_rate(o, s, 100));
}

TEST(Trainer, BadOptionsAndMismatchedDataGiveClearErrors) {
    test::TempDir tmp;
    write_counting_dataset(tmp / "data", 1);
    write_counting_dataset(tmp / "data300", 1, 300);
    auto be = make_backend("cpu");
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
    EXPECT_NE(error_of(bad, "r1").find("--batch-size"), std::string::npos);
    bad = o;
    bad.max_tokens = 1000;
    EXPECT_NE(error_of(bad, "r2").find("exactly one budget"), std::string::npos);
    bad = o;
    bad.seq_len = 33;
    EXPECT_NE(error_of(bad, "r3").find("--seq-len"), std::string::npos);
    bad = o;
    bad.min_lr = 1.0;
    EXPECT_NE(error_of(bad, "r4").find("--min-lr"), std::string::npos);
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
    EXPECT_NE(error_of(o, "r7").find("--resume"), std::string::npos);
    // Resuming may not change the math.
    auto t = Trainer::start(tiny_config(), o, tmp / "r8", 0, *be);
    std::atomic<bool> stop{true};
    t->run([](const TrainReport&) {}, &stop);
    // No step was taken, so there is no checkpoint to resume from.
    EXPECT_THROW(Trainer::resume(tmp / "r8", *be, nlohmann::json::object()), Error);
}

}  // namespace
}  // namespace tmx

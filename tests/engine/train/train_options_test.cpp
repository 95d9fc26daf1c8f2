// A run's options alone: their JSON form (what every checkpoint carries) both ways, the fields
// older checkpoints lack, which options a resume may change, and the checks that name an option
// (by its field: tmx prints its flag, apps/option_flags.h).
#include "engine/train/train_options.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>

#include "engine/core/errors.h"
#include "tests/test_util.h"

namespace tmx {
namespace {

using nlohmann::json;

ModelConfig tiny_config() {
    return load_config(test::source_dir() + "/assets/configs/test-tiny.json");
}

TrainOptions random_options(Rng& rng) {
    TrainOptions o;
    o.data_dir = "data" + std::to_string(rng.below(100));
    o.val_dir = rng.below(2) ? "" : "val" + std::to_string(rng.below(100));
    o.batch_size = 1 + static_cast<int64_t>(rng.below(64));
    o.seq_len = static_cast<int64_t>(rng.below(33));
    o.grad_accum = 1 + static_cast<int64_t>(rng.below(8));
    (rng.below(2) ? o.max_steps : o.max_tokens) = 1 + static_cast<int64_t>(rng.below(1 << 20));
    o.lr = rng.uniform() * 1e-2 + 1e-6;
    o.min_lr = o.lr * rng.uniform();
    o.warmup_steps = static_cast<int64_t>(rng.below(1000));
    o.beta1 = rng.uniform() * 0.99;
    o.beta2 = rng.uniform() * 0.999;
    o.eps = 1e-9 + rng.uniform() * 1e-6;
    o.weight_decay = rng.uniform();
    o.grad_clip = rng.uniform() * 2;
    o.eval_every = static_cast<int64_t>(rng.below(500));
    o.eval_batches = 1 + static_cast<int64_t>(rng.below(16));
    o.checkpoint_every = static_cast<int64_t>(rng.below(1000));
    o.keep_last = 1 + static_cast<int64_t>(rng.below(5));
    o.log_every = 1 + static_cast<int64_t>(rng.below(50));
    o.seed = rng.next_u64();
    o.skip_nonfinite = static_cast<int64_t>(rng.below(4));
    o.precision = rng.below(2) ? Precision::BF16 : Precision::F32;
    o.backend = rng.below(2) ? "cpu" : "vulkan:" + std::to_string(rng.below(4));
    return o;
}

TEST(TrainOptions, TheJsonFormReadsBackToTheSameOptions) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("TMX_TEST_SEED=" + std::to_string(seed));
    Rng rng(seed);
    for (int i = 0; i < 50; ++i) {
        const TrainOptions o = random_options(rng);
        // Through text, as a checkpoint stores it.
        const json j = json::parse(train_options_to_json(o).dump(2));
        const TrainOptions r = train_options_from_json(j, "state");
        EXPECT_EQ(train_options_to_json(r), train_options_to_json(o));
        EXPECT_EQ(r.lr, o.lr);  // doubles exactly
        EXPECT_EQ(r.seed, o.seed);
        EXPECT_EQ(r.precision, o.precision);
        EXPECT_EQ(r.backend, o.backend);
    }
}

// Checkpoints of versions before a field existed: their runs skipped nothing, trained in fp32,
// and did not record their backend (a resume chooses one afresh).
TEST(TrainOptions, FieldsOlderCheckpointsLackTakeTheValuesOfThoseRuns) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("TMX_TEST_SEED=" + std::to_string(seed));
    Rng rng(seed);
    json j = train_options_to_json(random_options(rng));
    for (const char* field : {"skip_nonfinite", "precision", "backend"}) j.erase(field);
    const TrainOptions r = train_options_from_json(j, "old");
    EXPECT_EQ(r.skip_nonfinite, 0);
    EXPECT_EQ(r.precision, Precision::F32);
    EXPECT_EQ(r.backend, "");
}

TEST(TrainOptions, AMissingOrMistypedFieldIsAnErrorNamingSourceAndField) {
    const json good = train_options_to_json(TrainOptions{});
    const auto error_with = [&](const std::function<void(json&)>& edit) {
        json j = good;
        edit(j);
        return test::error_of([&] { train_options_from_json(j, "ckpt/trainer_state.json"); });
    };
    EXPECT_EQ(error_with([](json& j) { j.erase("batch_size"); }),
              "ckpt/trainer_state.json: field 'batch_size': missing (expected an integer)");
    EXPECT_EQ(error_with([](json& j) { j["lr"] = "fast"; }),
              "ckpt/trainer_state.json: field 'lr': expected a number, got \"fast\"");
    EXPECT_EQ(error_with([](json& j) { j["backend"] = 3; }),
              "ckpt/trainer_state.json: field 'backend': expected a string, got 3");
    EXPECT_NE(error_with([](json& j) { j["precision"] = "fp16"; }).find("fp16"), std::string::npos);
}

TEST(TrainOptions, ResumeMayChangeTheCadenceBudgetAndBackendButNotTheMath) {
    const std::set<std::string> may = {"max_steps",    "max_tokens", "eval_every",
                                       "eval_batches", "keep_last",  "checkpoint_every",
                                       "log_every",    "backend",    "skip_nonfinite"};
    const std::set<std::string> may_not = {"data_dir",   "val_dir", "batch_size", "seq_len",
                                           "grad_accum", "lr",      "min_lr",     "warmup_steps",
                                           "beta1",      "beta2",   "eps",        "weight_decay",
                                           "grad_clip",  "seed",    "precision"};
    // Every option has its verdict here: a new one must be given one.
    std::set<std::string> keys;
    const json all = train_options_to_json(TrainOptions{});
    for (const auto& [key, value] : all.items()) keys.insert(key);
    std::set<std::string> listed = may;
    listed.insert(may_not.begin(), may_not.end());
    EXPECT_EQ(keys, listed);
    for (const std::string& key : may) EXPECT_TRUE(resume_may_override(key)) << key;
    for (const std::string& key : may_not) EXPECT_FALSE(resume_may_override(key)) << key;
    EXPECT_FALSE(resume_may_override("no_such_option"));
}

// Each check names its flag, first in the message; options in range pass.
TEST(TrainOptions, ValidationNamesTheFlagOfTheFirstOptionOutOfRange) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("TMX_TEST_SEED=" + std::to_string(seed));
    Rng rng(seed);
    const ModelConfig c = tiny_config();
    TrainOptions ok;
    ok.data_dir = "data";
    ok.max_steps = 1 + static_cast<int64_t>(rng.below(1000));
    EXPECT_NO_THROW(validate_train_options(ok, c));
    const auto flag_of = [&](const std::function<void(TrainOptions&)>& edit) -> std::string {
        TrainOptions o = ok;
        edit(o);
        try {
            validate_train_options(o, c);
        } catch (const UsageError& e) {
            return e.what();
        }
        return "(accepted)";
    };
    const int64_t negative = -1 - static_cast<int64_t>(rng.below(100));
    struct Case {
        const char* flag;
        std::function<void(TrainOptions&)> edit;
    };
    const Case cases[] = {
        {"data_dir", [](TrainOptions& o) { o.data_dir.clear(); }},
        {"batch_size", [](TrainOptions& o) { o.batch_size = 0; }},
        {"grad_accum", [&](TrainOptions& o) { o.grad_accum = negative; }},
        {"seq_len", [&](TrainOptions& o) { o.seq_len = c.max_seq_len + 1; }},
        {"max_steps", [&](TrainOptions& o) { o.max_steps = negative; }},
        {"lr", [](TrainOptions& o) { o.lr = 0.0; }},
        {"min_lr", [](TrainOptions& o) { o.min_lr = 2 * o.lr; }},
        {"warmup_steps", [&](TrainOptions& o) { o.warmup_steps = negative; }},
        {"beta1", [](TrainOptions& o) { o.beta1 = 1.0; }},
        {"beta2", [](TrainOptions& o) { o.beta2 = std::nan(""); }},
        {"eps", [](TrainOptions& o) { o.eps = -1e-8; }},
        {"weight_decay", [](TrainOptions& o) { o.weight_decay = -0.1; }},
        {"grad_clip", [](TrainOptions& o) { o.grad_clip = INFINITY; }},
        {"eval_every", [&](TrainOptions& o) { o.eval_every = negative; }},
        {"eval_batches", [](TrainOptions& o) { o.eval_batches = 0; }},
        {"checkpoint_every", [&](TrainOptions& o) { o.checkpoint_every = negative; }},
        {"keep_last", [](TrainOptions& o) { o.keep_last = 0; }},
        {"log_every", [](TrainOptions& o) { o.log_every = 0; }},
        {"skip_nonfinite", [&](TrainOptions& o) { o.skip_nonfinite = negative; }},
    };
    for (const Case& k : cases) {
        const std::string e = flag_of(k.edit);
        EXPECT_EQ(e.rfind(std::string(k.flag) + ":", 0), 0u) << k.flag << ": " << e;
    }
    EXPECT_EQ(flag_of([](TrainOptions& o) { o.max_tokens = 100; }),
              "give exactly one budget: max_steps N or max_tokens N");
    EXPECT_NE(flag_of([](TrainOptions& o) {
                  o.batch_size = int64_t{1} << 40;
                  o.grad_accum = int64_t{1} << 40;
              }).find("batch_size x grad_accum x seq_len"),
              std::string::npos);
}

TEST(TrainOptions, LearningRateWarmsUpThenDecaysToTheFloor) {
    TrainOptions o;
    o.lr = 1e-3;
    o.min_lr = 1e-4;
    o.warmup_steps = 10;
    EXPECT_DOUBLE_EQ(learning_rate(o, 0, 100), 1e-4);
    EXPECT_DOUBLE_EQ(learning_rate(o, 9, 100), 1e-3);
    EXPECT_NEAR(learning_rate(o, 55, 100), 5.5e-4, 1e-12);  // half way: the mean
    EXPECT_NEAR(learning_rate(o, 100, 100), 1e-4, 1e-12);
    for (int s = 10; s < 100; ++s)
        EXPECT_LE(learning_rate(o, s + 1, 100), learning_rate(o, s, 100));
}

// The optimizer's settings at a step: the options' betas, epsilon and decay, the schedule's rate,
// AdamW's 1-based step, and gradients scaled to the clip norm only when their norm exceeds it.
TEST(TrainOptions, AdamWParamsAtAStepClipOnlyGradientsAboveTheClipNorm) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("TMX_TEST_SEED=" + std::to_string(seed));
    Rng rng(seed);
    TrainOptions o;
    o.grad_clip = 0.5 + rng.uniform();
    o.weight_decay = rng.uniform();
    const int64_t step = static_cast<int64_t>(rng.below(200)), max_steps = 200;
    const double above = o.grad_clip * (1 + rng.uniform()), below = o.grad_clip * rng.uniform();
    const Backend::AdamWParams clipped = adamw_params(o, step, max_steps, above);
    EXPECT_EQ(clipped.lr, static_cast<float>(learning_rate(o, step, max_steps)));
    EXPECT_EQ(clipped.step, step + 1);
    EXPECT_EQ(clipped.beta1, static_cast<float>(o.beta1));
    EXPECT_EQ(clipped.beta2, static_cast<float>(o.beta2));
    EXPECT_EQ(clipped.eps, static_cast<float>(o.eps));
    EXPECT_EQ(clipped.weight_decay, static_cast<float>(o.weight_decay));
    // The scale is clip / (norm + 1e-6) in float: within 1e-6 / norm (norm >= 0.5 here) and a
    // float's rounding of the clip.
    EXPECT_NEAR(clipped.grad_scale * above, o.grad_clip, 3e-6 * o.grad_clip);
    EXPECT_EQ(adamw_params(o, step, max_steps, below).grad_scale, 1.0f);
    o.grad_clip = 0;  // off
    EXPECT_EQ(adamw_params(o, step, max_steps, above).grad_scale, 1.0f);
}

}  // namespace
}  // namespace tmx

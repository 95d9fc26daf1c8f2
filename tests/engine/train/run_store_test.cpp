// A run's files without a trainer: its state written into a checkpoint and read back, the
// checkpoints pruned, the options a resume continues with, the backend it recorded, and the
// metrics log appended to and trimmed.
#include "engine/train/run_store.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "backends/registry.h"
#include "engine/core/file_io.h"
#include "engine/model/checkpoint.h"
#include "tests/test_util.h"

namespace tmx {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

ModelConfig tiny_config() {
    return load_config(test::source_dir() + "/assets/configs/test-tiny.json");
}

RunState random_state(Rng& rng, size_t layers, size_t experts) {
    RunState s;
    s.step = 1 + static_cast<int64_t>(rng.below(1000));
    s.max_steps = s.step + static_cast<int64_t>(rng.below(1000));
    s.tokens = s.step * 64;
    if (rng.below(2)) s.best_val_loss = 1 + rng.uniform();
    s.nonfinite_skipped = static_cast<int64_t>(rng.below(3));
    s.finish_pending = rng.below(2) != 0;
    s.since_report = {.applied = static_cast<int64_t>(rng.below(10)),
                      .skipped = static_cast<int64_t>(rng.below(3)),
                      .loss_sum = 10 * rng.uniform(),
                      .aux_sum = rng.uniform(),
                      .grad_norm_sum = 3 * rng.uniform(),
                      .expert_slots = {}};
    for (size_t l = 0; l < layers; ++l) {
        s.since_report.expert_slots.emplace_back();
        for (size_t e = 0; e < experts; ++e)
            s.since_report.expert_slots[l].push_back(static_cast<int64_t>(rng.below(5000)));
    }
    return s;
}

// A checkpoint holds the weights, the moments and the state as given: the state and the
// options read back the same (doubles exactly), the moments bit for bit, and the weights load.
TEST(RunStore, ACheckpointReadsBackItsStateOptionsMomentsAndWeights) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("TMX_TEST_SEED=" + std::to_string(seed));
    Rng rng(seed);
    test::TempDir tmp;
    auto be = make_backend("cpu");
    Model model(tiny_config(), *be);
    model.init_random(seed);
    const size_t P = static_cast<size_t>(model.num_params());
    const std::vector<float> m = test::random_normal(rng, P), v = test::random_normal(rng, P);
    const RunState state = random_state(rng, 2, 4);
    TrainOptions options = test::small_train_options("data", rng.next_u64());
    options.backend = "vulkan:1";
    options.precision = Precision::BF16;
    const std::string dir = tmp / "run/step_00000007";
    write_run_checkpoint(model, dir, {.state = state, .options = options, .m = m, .v = v}, "-");

    const std::string state_path = dir + "/" + kStateFile;
    const json j = read_json_file(state_path);
    const RunState back = read_run_state(j, state_path, 64);
    EXPECT_EQ(back.step, state.step);
    EXPECT_EQ(back.tokens, state.step * 64);
    EXPECT_EQ(back.best_val_loss, state.best_val_loss);
    EXPECT_EQ(back.nonfinite_skipped, state.nonfinite_skipped);
    EXPECT_EQ(back.finish_pending, state.finish_pending);
    EXPECT_EQ(back.since_report.applied, state.since_report.applied);
    EXPECT_EQ(back.since_report.skipped, state.since_report.skipped);
    EXPECT_EQ(back.since_report.loss_sum, state.since_report.loss_sum);
    EXPECT_EQ(back.since_report.aux_sum, state.since_report.aux_sum);
    EXPECT_EQ(back.since_report.grad_norm_sum, state.since_report.grad_norm_sum);
    EXPECT_EQ(back.since_report.expert_slots, state.since_report.expert_slots);
    EXPECT_EQ(j["max_steps"], state.max_steps);  // for the reader
    EXPECT_EQ(train_options_to_json(resumed_options(j, state_path, json::object())),
              train_options_to_json(options));
    EXPECT_EQ(recorded_backend(tmp / "run"), "vulkan:1");

    std::vector<float> m_back, v_back;
    read_optimizer_moments(dir, model.num_params(), m_back, v_back);
    EXPECT_EQ(m_back, m);
    EXPECT_EQ(v_back, v);
    EXPECT_EQ(load_model(dir, *be)->params_to_host(), model.params_to_host());
    // A step whose tokens overflow is refused, naming the file.
    EXPECT_NE(test::error_of([&] {
                  read_run_state(j, state_path, int64_t{1} << 62);
              }).find(state_path + ": \"step\" x tokens per step"),
              std::string::npos);
}

// No checkpoint holds a value that is not finite: the write is refused before anything is
// written, naming the tensor, the step and where the run can go on.
TEST(RunStore, ACheckpointOfNonFiniteWeightsOrMomentsIsRefused) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("TMX_TEST_SEED=" + std::to_string(seed));
    Rng rng(seed);
    test::TempDir tmp;
    auto be = make_backend("cpu");
    Model model(tiny_config(), *be);
    model.init_random(seed);
    const size_t P = static_cast<size_t>(model.num_params());
    const std::vector<float> finite = test::random_normal(rng, P);
    RunState state;
    state.step = 12;
    const TrainOptions options = test::small_train_options("data", 0);
    const size_t at = static_cast<size_t>(rng.below(P));
    const ParamSpec* tensor = nullptr;
    for (const ParamSpec& s : model.layout().specs)
        if (static_cast<int64_t>(at) >= s.offset && static_cast<int64_t>(at) < s.offset + s.numel())
            tensor = &s;
    ASSERT_NE(tensor, nullptr);
    std::vector<float> bad = finite;
    bad[at] = rng.below(2) ? NAN : -INFINITY;
    const std::string dir = tmp / "run/step_00000012";
    EXPECT_EQ(test::error_of([&] {
                  write_run_checkpoint(model, dir,
                                       {.state = state, .options = options, .m = finite, .v = bad},
                                       "the last checkpoint is run/step_00000010");
              }),
              "step 12: the optimizer moments (exp_avg_sq) of " + tensor->name +
                  " are no longer finite; not writing " + dir +
                  " (the last checkpoint is run/step_00000010); lower lr");
    std::vector<float> weights = model.params_to_host();
    weights[at] = NAN;
    be->upload(model.params(), weights.data());
    EXPECT_NE(test::error_of([&] {
                  write_run_checkpoint(
                      model, dir, {.state = state, .options = options, .m = finite, .v = finite},
                      "-");
              }).find("the weights of " + tensor->name + " are no longer finite"),
              std::string::npos);
    EXPECT_FALSE(fs::exists(dir));
}

TEST(RunStore, PruningKeepsTheNewestStepCheckpointsAndNothingElseGoes) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("TMX_TEST_SEED=" + std::to_string(seed));
    Rng rng(seed);
    test::TempDir tmp;
    std::vector<int64_t> steps;
    for (int i = 0; i < 6; ++i) {
        steps.push_back(static_cast<int64_t>(rng.below(100000)) * 10 + i);  // distinct
        const std::string dir = tmp / ("run/" + step_dir_name(steps.back()));
        fs::create_directories(dir);
        test::write_text(dir + "/" + kStateFile, "{}");
    }
    fs::create_directories(tmp / "run/best");
    test::write_text(tmp / "run/best/" + std::string(kStateFile), "{}");
    fs::create_directories(tmp / "run/step_00000001");  // unfinished: not a checkpoint
    const int64_t keep = 1 + static_cast<int64_t>(rng.below(4));
    prune_step_checkpoints(tmp / "run", keep);
    std::sort(steps.begin(), steps.end());
    for (size_t i = 0; i < steps.size(); ++i)
        EXPECT_EQ(fs::exists(tmp / ("run/" + step_dir_name(steps[i]))),
                  static_cast<int64_t>(i) >= static_cast<int64_t>(steps.size()) - keep)
            << steps[i];
    EXPECT_TRUE(fs::exists(tmp / "run/best"));
    EXPECT_TRUE(fs::exists(tmp / "run/step_00000001"));
}

// What a resume continues with: the run's options, the budget and cadence changed as asked (a new
// budget of one kind replaces the other), the backend too; the math refused, naming the flag and
// the run's value; a value equal to the run's own is no change.
TEST(RunStore, AResumeOverridesTheCadenceBudgetAndBackendButNotTheMath) {
    TrainOptions o = test::small_train_options("data", 3);
    o.max_steps = 0;
    o.max_tokens = 5000;
    o.backend = "vulkan";
    const json state = {{"step", 4}, {"options", train_options_to_json(o)}};
    const TrainOptions r = resumed_options(
        state, "s.json", {{"max_steps", 9}, {"log_every", 3}, {"backend", "cpu"}, {"lr", o.lr}});
    EXPECT_EQ(r.max_steps, 9);
    EXPECT_EQ(r.max_tokens, 0);
    EXPECT_EQ(r.log_every, 3);
    EXPECT_EQ(r.backend, "cpu");
    EXPECT_EQ(r.lr, o.lr);
    try {
        resumed_options(state, "s.json", {{"batch_size", 8}});
        ADD_FAILURE() << "batch_size changed on resume";
    } catch (const UsageError& e) {
        EXPECT_EQ(std::string(e.what()),
                  "batch_size cannot change when resuming (it would change the run's math); "
                  "the run uses 4");
    }
    // A run from before "precision" existed trained in fp32: fp32 is no change to it.
    json old = state;
    old["options"].erase("precision");
    old["options"].erase("backend");
    EXPECT_EQ(resumed_options(old, "s.json", {{"precision", "fp32"}}).precision, Precision::F32);
    EXPECT_THROW(resumed_options(old, "s.json", {{"precision", "bf16"}}), UsageError);
    EXPECT_EQ(test::error_of([&] {
                  resumed_options({{"step", 1}}, "s.json", json::object());
              }),
              "s.json: field 'options': missing (expected an object of training options)");
}

TEST(RunStore, TheRecordedBackendIsTheLatestCheckpointsAndAbsentInOlderRuns) {
    test::TempDir tmp;
    const auto write_state = [&](int64_t step, const json& options) {
        const std::string dir = tmp / ("run/" + step_dir_name(step));
        fs::create_directories(dir);
        test::write_text(dir + "/" + kStateFile, json{{"step", step}, {"options", options}}.dump());
    };
    TrainOptions o = test::small_train_options("data", 0);
    o.backend = "vulkan:1";
    write_state(3, train_options_to_json(o));
    EXPECT_EQ(recorded_backend(tmp / "run"), "vulkan:1");
    o.backend = "cpu";  // resumed on the CPU since
    write_state(5, train_options_to_json(o));
    EXPECT_EQ(recorded_backend(tmp / "run"), "cpu");
    EXPECT_EQ(recorded_backend(tmp / "run/step_00000003"), "vulkan:1");
    json older = train_options_to_json(o);
    older.erase("backend");
    write_state(8, older);
    EXPECT_EQ(recorded_backend(tmp / "run"), std::nullopt);
    EXPECT_NE(test::error_of([&] {
                  recorded_backend(tmp / "nowhere");
              }).find("no such run directory or checkpoint"),
              std::string::npos);
}

// metrics.jsonl: lines appended whole; a resume at step S drops the lines after S and a line
// torn by a kill, and keeps everything else (for tmx plot to report).
TEST(RunStore, MetricsAreAppendedAndTrimmedToTheResumedStep) {
    test::TempDir tmp;
    fs::create_directories(tmp / "run");
    for (int step = 1; step <= 6; ++step) append_metrics(tmp / "run", {{"step", step}});
    const std::string path = tmp / ("run/" + std::string(kMetricsFile));
    test::write_text(path, read_file(path) + "not json\n{\"step\": 7, \"lo");
    trim_metrics(tmp / "run", 4);
    EXPECT_EQ(read_file(path),
              "{\"step\":1}\n{\"step\":2}\n{\"step\":3}\n{\"step\":4}\nnot json\n");
    trim_metrics(tmp / "run", 4);  // nothing more to drop
    const std::string kept = read_file(path);
    EXPECT_EQ(std::count(kept.begin(), kept.end(), '\n'), 5);
    trim_metrics(tmp / "elsewhere", 1);  // no log yet: appending makes it
    EXPECT_FALSE(fs::exists(tmp / ("elsewhere/" + std::string(kMetricsFile))));
}

TEST(RunStore, AMetricsLineThatCannotBeWrittenIsAMetricsWriteError) {
    if (!fs::exists("/dev/full")) GTEST_SKIP() << "needs /dev/full";
    test::TempDir tmp;
    fs::create_directories(tmp / "run");
    fs::create_symlink("/dev/full", tmp / ("run/" + std::string(kMetricsFile)));
    EXPECT_THROW(append_metrics(tmp / "run", {{"step", 1}}), MetricsWriteError);
    EXPECT_EQ(append_metrics_before_error(tmp / "run", {{"step", 1}}),
              " (and it could not be logged: " + (tmp / "run/metrics.jsonl") +
                  ": cannot append a line: No space left on device)");
    fs::remove(tmp / ("run/" + std::string(kMetricsFile)));
    EXPECT_EQ(append_metrics_before_error(tmp / "run", {{"step", 2}}), "");
    EXPECT_EQ(read_file(tmp / "run/metrics.jsonl"), "{\"step\":2}\n");
}

// A new run's directory: made, locked and started with an empty log; one that holds a run (or
// is no directory) refused naming --out and --resume; one holding only a lock file (a start
// that failed after making it) taken.
TEST(RunStore, ANewRunTakesAnEmptyDirectoryAndRefusesOneThatHoldsARun) {
    test::TempDir tmp;
    const std::string run = tmp / "run";
    refuse_existing_run(run);  // nothing there
    {
        const auto lock = create_run_dir(run);
        EXPECT_EQ(read_file(run + "/metrics.jsonl"), "");
        EXPECT_EQ(test::error_of([&] { refuse_existing_run(run); }),
                  run + ": exists and is not empty (continue a run with resume " + run +
                      ", or choose another out)");
    }
    fs::remove(run + "/metrics.jsonl");
    EXPECT_EQ(test::error_of([&] { refuse_existing_run(run); }), "");  // a lock file alone
    test::write_text(tmp / "file", "");
    EXPECT_EQ(test::error_of([&] { refuse_existing_run(tmp / "file"); }),
              "out " + (tmp / "file") + ": exists and is not a directory");
}

}  // namespace
}  // namespace tmx

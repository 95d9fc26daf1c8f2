// A run directory's names, its leftovers, its lock and the checkpoint a path names, without a
// trainer: directories made by hand as a run leaves them.
#include "engine/train/run_dir.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <vector>

#include "engine/core/errors.h"
#include "tests/test_util.h"

namespace tmx {
namespace {

namespace fs = std::filesystem;

// A finished step checkpoint: its directory with a trainer state in it.
void make_step_dir(const test::TempDir& tmp, const std::string& run, int64_t step) {
    const std::string dir = tmp / (run + "/" + step_dir_name(step));
    fs::create_directories(dir);
    test::write_text(dir + "/" + kStateFile, "{}");
}

std::vector<std::string> names_in(const std::string& dir) {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir))
        names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
}

TEST(RunDir, StepDirectoryNamesRoundTripAndNothingElseIsOne) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("TMX_TEST_SEED=" + std::to_string(seed));
    Rng rng(seed);
    EXPECT_EQ(step_dir_name(42), "step_00000042");
    EXPECT_EQ(step_dir_name(123456789), "step_123456789");  // wider than the padding
    for (int i = 0; i < 100; ++i) {
        const int64_t step = static_cast<int64_t>(rng.below(uint64_t{1} << (1 + rng.below(50))));
        EXPECT_EQ(step_of_dir_name(step_dir_name(step)), step) << step;
    }
    EXPECT_EQ(step_of_dir_name("step_7"), 7);
    for (const char* name : {"step_", "step_12a", "step_-3", "step_00000005.tmp-4242", "best",
                             "Step_5", "step_1234567890123456789", "metrics.jsonl"})
        EXPECT_EQ(step_of_dir_name(name), std::nullopt) << name;
}

TEST(RunDir, AStepDirectoryIsOneOnlyWithItsTrainerState) {
    test::TempDir tmp;
    make_step_dir(tmp, "run", 3);
    fs::create_directories(tmp / "run/step_00000004");  // a state not yet written
    fs::create_directories(tmp / "run/notes");
    test::write_text(tmp / "run/notes/" + std::string(kStateFile), "{}");
    EXPECT_TRUE(is_step_dir(tmp / "run/step_00000003"));
    EXPECT_FALSE(is_step_dir(tmp / "run/step_00000004"));
    EXPECT_FALSE(is_step_dir(tmp / "run/notes"));
}

// What an interrupted write leaves: the checkpoint writer's step_N.tmp-PID and best.tmp-PID, and
// write_file_atomic's metrics.jsonl.tmp.PID. Anything else, alike in name or not, stays.
TEST(RunDir, RemovingLeftoversRemovesWhatInterruptedWritesLeaveAndNothingElse) {
    test::TempDir tmp;
    make_step_dir(tmp, "run", 3);
    make_step_dir(tmp, "run", 9);
    fs::rename(tmp / "run/step_00000009", tmp / "run/step_00000009.tmp-4242");
    fs::create_directories(tmp / "run/best.tmp-17");
    fs::create_directories(tmp / "run/best");
    test::write_text(tmp / "run/metrics.jsonl", "{\"step\": 1}\n");
    test::write_text(tmp / "run/metrics.jsonl.tmp.99", "{\"step\": 2");
    test::write_text(tmp / "run/notes.tmp-12", "the user's");   // not a run's file
    fs::create_directories(tmp / "run/step_00000003.tmp-abc");  // not a process id
    fs::create_directories(tmp / "run/.tmp-5");                 // no base name
    remove_leftovers(tmp / "run");
    EXPECT_EQ(names_in(tmp / "run"),
              (std::vector<std::string>{".tmp-5", "best", "metrics.jsonl", "notes.tmp-12",
                                        "step_00000003", "step_00000003.tmp-abc"}));
}

TEST(RunDir, APathResolvesToItsCheckpointOrTheRunsLatestFinishedOne) {
    test::TempDir tmp;
    for (int64_t step : {5, 40, 12}) make_step_dir(tmp, "run", step);
    fs::create_directories(tmp / "run/step_00000099");  // no state: unfinished
    make_step_dir(tmp, "run", 77);
    fs::rename(tmp / "run/step_00000077", tmp / "run/step_00000077.tmp-8");  // a leftover
    fs::create_directories(tmp / "run/best");
    test::write_text(tmp / "run/best/" + std::string(kStateFile), "{}");

    const std::string latest = tmp / "run/step_00000040";
    EXPECT_EQ(resolve_run_checkpoint(tmp / "run"), latest);
    EXPECT_EQ(resolve_run_checkpoint(tmp / "run/"), latest);
    EXPECT_EQ(resolve_run_checkpoint(tmp / "run/step_00000012/"), tmp / "run/step_00000012");
    EXPECT_EQ(resolve_run_checkpoint(tmp / "run/best"), tmp / "run/best");

    EXPECT_NE(test::error_of([&] { resolve_run_checkpoint(tmp / "run/step_00000077.tmp-8"); })
                  .find("an unfinished checkpoint left by an interrupted write (resume the run "
                        "directory " +
                        (tmp / "run") + ", whose next run removes it)"),
              std::string::npos);
    EXPECT_EQ(test::error_of([&] { resolve_run_checkpoint(tmp / "nowhere"); }),
              (tmp / "nowhere") + ": no such run directory or checkpoint");
    fs::create_directories(tmp / "empty/step_00000001");
    EXPECT_EQ(
        test::error_of([&] { resolve_run_checkpoint(tmp / "empty"); }),
        (tmp / "empty") + ": not a training run (no step_* checkpoint with " + kStateFile + ")");
}

// flock() locks belong to an open file, so a second lock in this process is refused as one in
// another process would be, naming the holder; the holder's end releases it.
TEST(RunDir, TheLockKeepsASecondHolderOutUntilTheFirstIsGone) {
    test::TempDir tmp;
    fs::create_directories(tmp / "run");
    auto first = std::make_unique<RunDirLock>(tmp / "run");
    char host[256] = {};
    ASSERT_EQ(::gethostname(host, sizeof host - 1), 0);
    EXPECT_EQ(test::error_of([&] { RunDirLock second(tmp / "run"); }),
              (tmp / "run") + ": the run is in use by another tmx train (pid " +
                  std::to_string(::getpid()) + " on host " + host +
                  "); wait for it to end or stop it first");
    first.reset();
    EXPECT_EQ(test::error_of([&] { RunDirLock second(tmp / "run"); }), "");
    EXPECT_TRUE(fs::exists(tmp / "run/" + std::string(kLockFile)));
    // A lock file that cannot be made is an error naming it.
    EXPECT_NE(test::error_of([&] {
                  RunDirLock lock(tmp / "nowhere");
              }).find("nowhere/train.lock: cannot open the run's lock file"),
              std::string::npos);
}

}  // namespace
}  // namespace tmx

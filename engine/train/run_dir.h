// A training run's directory: the files in it, its step_N checkpoint directories, the leftovers
// of interrupted writes, the lock that keeps a second trainer out, and resolving a path given by
// the user to the checkpoint it means.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "engine/core/errors.h"

namespace tmx {

inline constexpr const char* kStateFile = "trainer_state.json";
inline constexpr const char* kOptimizerFile = "optimizer.safetensors";
inline constexpr const char* kMetricsFile = "metrics.jsonl";
inline constexpr const char* kBestDir = "best";
inline constexpr const char* kLockFile = "train.lock";
inline constexpr const char* kStepPrefix = "step_";

// "step_00000042".
std::string step_dir_name(int64_t step);
// The step of a checkpoint directory name "step_N" (digits only: "step_N.tmp-PID" is not one).
std::optional<int64_t> step_of_dir_name(const std::string& name);
// A finished checkpoint directory: named step_N, holding its trainer state.
bool is_step_dir(const std::filesystem::path& p);
// Removes the leftovers of interrupted writes; the caller holds the run's lock, so none of them
// is being written. One that cannot be removed stays ignored.
void remove_leftovers(const std::filesystem::path& run_dir);
std::filesystem::path parent_or_dot(const std::filesystem::path& p);

// std::filesystem reports a refused permission or a full disk as std::filesystem_error, which
// the CLI would call an internal error; they are the user's environment, so they become
// tmx::Error (its message names the operation and the path).
template <class F>
auto filesystem_errors_as_errors(F&& body) -> decltype(body()) {
    try {
        return body();
    } catch (const std::filesystem::filesystem_error& e) {
        throw Error(e.what());
    }
}

// An exclusive flock() on RUN/train.lock while a trainer lives. The kernel drops it when the
// process ends however it ends, so a killed run leaves no stale lock; the file's text names the
// holder for the error a second trainer gets.
class RunDirLock {
  public:
    explicit RunDirLock(const std::filesystem::path& run_dir);
    ~RunDirLock();
    RunDirLock(const RunDirLock&) = delete;
    RunDirLock& operator=(const RunDirLock&) = delete;

  private:
    int fd_ = -1;
};

// The checkpoint directory a path names: itself when it holds trainer_state.json, else the
// run directory's latest step checkpoint (step_N; never a leftover step_N.tmp-PID).
std::string resolve_run_checkpoint(const std::string& path);

}  // namespace tmx

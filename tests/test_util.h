// Helpers shared by the tests: fresh random inputs (seeded, printed on failure), temporary
// directories, running the tmx binary, and where the shared development data lives.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "engine/core/rng.h"
#include "engine/train/train_options.h"

namespace tmx::test {

// A seed that differs from run to run unless TMX_TEST_SEED is set; tests print it via
// SCOPED_TRACE so a failure can be replayed.
uint64_t fresh_seed();

std::vector<float> random_normal(Rng& rng, size_t n, double scale = 1.0);
std::vector<int32_t> random_ints(Rng& rng, size_t n, int32_t lo, int32_t hi);  // [lo, hi)

// A temporary directory removed at scope exit.
class TempDir {
  public:
    TempDir();
    ~TempDir();
    const std::filesystem::path& path() const { return path_; }
    std::string operator/(const std::string& name) const { return (path_ / name).string(); }

  private:
    std::filesystem::path path_;
};

// For its lifetime, points XDG_CACHE_HOME at a fresh directory, so that tmx's cache files (the
// Vulkan tuning file, the pipeline cache) start empty. Mesa's shader cache, which follows
// XDG_CACHE_HOME too, is pinned where it was (MESA_SHADER_CACHE_DIR): its entries are the
// driver's compiled pipelines, the same for every test, and without them lavapipe spends tens of
// seconds compiling again what the other tests compiled already. Restores both on destruction.
class CacheHome {
  public:
    CacheHome();
    ~CacheHome();
    CacheHome(const CacheHome&) = delete;
    CacheHome& operator=(const CacheHome&) = delete;
    const std::filesystem::path& path() const { return dir_.path(); }
    std::string operator/(const std::string& name) const { return dir_ / name; }

  private:
    TempDir dir_;
    std::optional<std::string> old_xdg_, old_mesa_;
};

struct CommandResult {
    int exit_code = 0;
    std::string out, err;
};
// The message of the tmx::Error that f throws, or "" when it throws none.
std::string error_of(const std::function<void()>& f);

// Short synthetic stories from a small vocabulary (words drawn at random, a blank line between
// documents), enough to train a few-hundred-piece tokenizer on.
std::string synthetic_stories(Rng& rng, int documents);

// A checkpoint made as a user makes one: a tokenizer trained by `tmx tokenizer train` (300
// pieces) on synthetic_stories, and `tmx init --seed SEED` of assets/configs/test-tiny-swiglu.json
// with that vocabulary and `overrides` (JSON object text, e.g. "{\"d_model\": 64}"). Writes
// DIR/tok.model and DIR/ckpt; returns "" after a failed command (with a test failure added).
std::string make_cli_checkpoint(const TempDir& dir, Rng& rng, const std::string& overrides,
                                uint64_t seed);

// Runs the built tmx with the given arguments (a shell-quoted string).
CommandResult run_tmx(const std::string& args);

// Whether TMX_REQUIRE_BACKENDS (comma-separated backend names, e.g. "cuda,vulkan"; set by
// scripts/gpu-check.sh) names this backend ("vulkan:1" counts as "vulkan"). On a GPU machine a
// test that skips because its backend cannot be opened checked nothing, so there it fails.
bool backend_required(const std::string& name);

// Whether the backend opens on this machine; one that does not is a test failure where
// TMX_REQUIRE_BACKENDS names it.
bool backend_opens(const std::string& name);

// Skips the test when `backend` cannot be opened on this machine, saying why, or fails it when
// TMX_REQUIRE_BACKENDS names that backend. Returns from the calling function either way, so a
// fixture's SetUp() that calls a helper using it checks IsSkipped() || HasFatalFailure().
#define TMX_SKIP_UNAVAILABLE(backend, why)                                                   \
    do {                                                                                     \
        if (::tmx::test::backend_required(backend))                                          \
            GTEST_FAIL() << "backend " << (backend) << " is required (TMX_REQUIRE_BACKENDS)" \
                         << " but unavailable: " << why;                                     \
        GTEST_SKIP() << "backend " << (backend) << " unavailable here: " << why;             \
    } while (0)

// Training options for a test config's short run (assets/configs/test-tiny*.json: vocabulary 97,
// max_seq_len 32) on `data` (a dataset such as model_scenarios.h's write_counting_dataset):
// batches of 4 sequences of 16 tokens, 30 steps at a learning rate that learns in them (1e-2,
// warming up over 5 steps, decaying to 1e-3), data order `seed`, a report at every step, an
// evaluation (2 batches) and a checkpoint only at the end.
TrainOptions small_train_options(const std::string& data, uint64_t seed);

std::string source_dir();
// ../shared next to the source tree, or "" when absent (a user's clone).
std::string shared_dir();

void write_text(const std::string& path, const std::string& text);

// The text with every run of spaces and newlines as one space: a phrase of a report is found
// wherever the report wraps its lines.
std::string flat(const std::string& text);

// Token ids from a file of comma- or newline-separated integers (the fixtures' tokens.txt).
std::vector<int32_t> read_token_file(const std::string& path);

}  // namespace tmx::test

// The tmx subcommands. Each apps/cmd_*.cpp adds one subcommand (flags, help, callback) to the
// app; callbacks parse flags, call the engine and print, nothing else. Errors are thrown as
// tmx::Error / tmx::UsageError and turned into a message and exit code by main().
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "engine/compute/backend.h"
#include "engine/model/model.h"

namespace tmx::cli {

// Options every subcommand has.
struct CommonOptions {
    int threads = 0;  // 0: all cores
};

// Adds `--threads N` to a subcommand and applies it before the callback runs.
void add_common_options(CLI::App& sub, CommonOptions& common);

void add_params_command(CLI::App& app, CommonOptions& common);
void add_init_command(CLI::App& app, CommonOptions& common);
void add_eval_command(CLI::App& app, CommonOptions& common);
void add_tokenizer_command(CLI::App& app, CommonOptions& common);
void add_prepare_command(CLI::App& app, CommonOptions& common);
void add_train_command(CLI::App& app, CommonOptions& common);
void add_plot_command(CLI::App& app, CommonOptions& common);
void add_convert_command(CLI::App& app, CommonOptions& common);
void add_export_command(CLI::App& app, CommonOptions& common);
void add_import_command(CLI::App& app, CommonOptions& common);
void add_serve_command(CLI::App& app, CommonOptions& common);
void add_devices_command(CLI::App& app, CommonOptions& common);
void add_generate_command(CLI::App& app, CommonOptions& common);
void add_bench_command(CLI::App& app, CommonOptions& common);
void add_tune_command(CLI::App& app, CommonOptions& common);

// --input FILE... and --format of the commands that read a text corpus (prepare, tokenizer
// train).
struct CorpusOptions {
    std::vector<std::string> inputs;
    std::string format = "auto";
};
void add_corpus_options(CLI::App& sub, CorpusOptions& corpus);

// --out DIR, --dtype f32|bf16 and --force of the commands that write a checkpoint directory.
struct CheckpointOutOptions {
    std::string out;
    std::string dtype;  // the command's default
    bool force = false;
};
void add_checkpoint_out_options(CLI::App& sub, CheckpointOutOptions& o);

// A backend a command opened, in the command's mode (its precision; training or not) for as long
// as the command holds it: a Backend::ModeScope over its life. Used as a pointer to the backend.
class OpenedBackend {
  public:
    OpenedBackend(std::unique_ptr<Backend> backend, Backend::Mode mode)
        : backend_(std::move(backend)),
          mode_(std::make_unique<Backend::ModeScope>(*backend_, mode)) {}
    Backend& operator*() const { return *backend_; }
    Backend* operator->() const { return backend_.get(); }

  private:
    std::unique_ptr<Backend> backend_;
    std::unique_ptr<Backend::ModeScope> mode_;  // ends before the backend does
};

// --backend NAME (auto: the best present) and --device N (a GPU, as `tmx devices` lists
// them) of the commands that run a model; for training, only backends that train.
struct BackendChoice {
    std::string backend = "auto";
    int device = -1;
    // The GPU a GPU backend opens when --device is not given (a data-parallel job's node-local
    // rank); -1: the backend's default.
    int default_device = -1;
    bool training = false;
    std::string precision = "auto";  // --precision: auto, fp32 or bf16
    // Creates the backend in the mode the flags ask for (--precision; training for the
    // commands that train) and, with announce, says on stderr which one runs (announce()
    // later, once the precision is final: a resumed run's own).
    OpenedBackend open(bool announce = true) const;
    // "backend: DESCRIPTION", "backend (auto): ..." after --backend auto, or
    // "backend (WHY): ..." with `why` (where a resumed run's backend came from).
    void announce(const Backend& be, const std::string& why = "") const;
    // --precision for `backend`: fp32 or bf16 as given; auto is the backend's
    // default_precision() (bf16 on CUDA, fp32 elsewhere), for training and inference alike.
    Precision resolve_precision(const Backend& backend) const;
    bool precision_given() const { return precision != "auto"; }
};
void add_backend_options(CLI::App& sub, BackendChoice& choice, bool training = false);
// --weights FORMAT of the commands that run a trained model (generate, eval, serve): the format
// its weights are held in while it runs. "auto" (the default) keeps the checkpoint's own where
// the backend can hold it, else f32.
struct WeightsChoice {
    std::string format = "auto";
    // Loads the checkpoint in `dir` so, and says on stderr which format its weights run in.
    std::unique_ptr<Model> load(const std::string& dir, Backend& backend) const;
};
void add_weights_option(CLI::App& sub, WeightsChoice& choice);

// `name` with --device applied: "vulkan" becomes "vulkan:N", "cuda" "cuda:N" (a backend with
// devices, backend_takes_device()); a UsageError for other backends.
std::string with_device(const std::string& name, int device);

// Parses "1,2,3" (spaces allowed) into token ids below `vocab_size`; a UsageError names `flag`
// and the offending id otherwise.
std::vector<int32_t> parse_id_list(const std::string& text, const char* flag, int64_t vocab_size);

// An integer flag's check: a plain decimal integer from `min` to `max` (max >= 0). The error
// gives the range in words ("--threads: expected an integer from 0 to 2^31 - 1, got -1"), and a
// value outside it is an error, never saturated.
CLI::Validator integer_range(int64_t min, uint64_t max);
// The same with the bounds of the option's type T by default: in_range<int>(0) for --threads.
template <typename T>
CLI::Validator in_range(T min, T max = std::numeric_limits<T>::max()) {
    static_assert(std::is_integral_v<T>);
    return integer_range(static_cast<int64_t>(min), static_cast<uint64_t>(max));
}
// Makes every integer option of `app` and its subcommands read decimal (CLI11 would read "010"
// as octal) and checks it against the range of a 64-bit integer after its own checks, so that
// no value is silently saturated (CLI11 clamps an int64_t at 2^63 - 1 and wraps "-1" into an
// unsigned one). Give flags their real range with in_range<T>; this is the net under the ones
// that have none. Call it once all commands are added.
void check_integer_options(CLI::App& app);

// Thrown when a signal stopped a command after it saved its work: main() exits with the code.
struct Interrupted {
    int exit_code;
};

}  // namespace tmx::cli

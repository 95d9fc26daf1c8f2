// The tmx subcommands. Each apps/cmd_*.cpp adds one subcommand (flags, help, callback) to the
// app; callbacks parse flags, call the engine and print, nothing else. Errors are thrown as
// tmx::Error / tmx::UsageError and turned into a message and exit code by main().
#pragma once

#include <CLI/CLI.hpp>

#include <memory>
#include <string>

#include "engine/backend.h"

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
void add_devices_command(CLI::App& app, CommonOptions& common);
void add_generate_command(CLI::App& app, CommonOptions& common);
void add_bench_command(CLI::App& app, CommonOptions& common);

// --backend NAME (auto: the best present) and --device N (a GPU, as `tmx devices` lists
// them) of the commands that run a model; for training, only backends that train.
struct BackendChoice {
    std::string backend = "auto";
    int device = -1;
    bool training = false;
    // Creates the backend and says on stderr which one runs.
    std::unique_ptr<Backend> open() const;
};
void add_backend_options(CLI::App& sub, BackendChoice& choice, bool training = false);
// `name` with --device applied: "vulkan" becomes "vulkan:N", "cuda" "cuda:N"; a UsageError for
// other backends.
std::string with_device(const std::string& name, int device);

// Parses "1,2,3" (spaces allowed) into token ids; a UsageError names `flag` otherwise.
std::vector<int32_t> parse_id_list(const std::string& text, const char* flag);

// Thrown when a signal stopped a command after it saved its work: main() exits with the code.
struct Interrupted {
    int exit_code;
};

}  // namespace tmx::cli

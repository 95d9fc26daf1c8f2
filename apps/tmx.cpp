// tmx: the tiny-mixtral command-line tool.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include "apps/commands.h"
#include "apps/option_flags.h"
#include "engine/core/errors.h"
#include "engine/core/threads.h"

namespace {

// OpenMP threads that finish a parallel loop early spin while they wait for the next one
// (libgomp's default). When other programs keep the cores busy, the spinning takes the time the
// working threads need: decoding, which runs many short loops, measured 4-20x slower on a busy
// 2-core machine, and barely faster when idle. So tmx asks for passive waiting unless the user
// chose a policy. libgomp reads the setting in its constructor, before main(); a function in
// the executable's .preinit_array runs before any shared library's constructors.
void default_to_passive_openmp_waiting(int, char**, char**) {
    if (!std::getenv("OMP_WAIT_POLICY") && !std::getenv("GOMP_SPINCOUNT"))
        setenv("OMP_WAIT_POLICY", "passive", 0);
}
[[gnu::section(".preinit_array"),
  gnu::used]] void (*const preinit_openmp)(int, char**, char**) = default_to_passive_openmp_waiting;

}  // namespace

namespace tmx::cli {

// More threads than any machine has cores only costs memory and time (OpenMP starts them all).
constexpr int kMaxThreads = 4096;

void add_common_options(CLI::App& sub, CommonOptions& common) {
    sub.add_option("--threads", common.threads, "CPU threads (default: all cores)")
        ->check(in_range(0, kMaxThreads));
    sub.parse_complete_callback([&common]() { set_num_threads(common.threads); });
}

}  // namespace tmx::cli

int main(int argc, char** argv) {
    using namespace tmx;
    CLI::App app{"tmx: train, run and size tiny-mixtral sparse mixture-of-experts models"};
    app.set_version_flag("--version", std::string("tmx ") + TMX_VERSION);
    app.require_subcommand(1);
    cli::CommonOptions common;
    cli::add_params_command(app, common);
    cli::add_init_command(app, common);
    cli::add_eval_command(app, common);
    cli::add_generate_command(app, common);
    cli::add_serve_command(app, common);
    cli::add_bench_command(app, common);
    cli::add_tune_command(app, common);
    cli::add_tokenizer_command(app, common);
    cli::add_prepare_command(app, common);
    cli::add_train_command(app, common);
    cli::add_plot_command(app, common);
    cli::add_convert_command(app, common);
    cli::add_export_command(app, common);
    cli::add_import_command(app, common);
    cli::add_devices_command(app, common);
    cli::check_integer_options(app);
    // An unknown command word: CLI11 would only say that a subcommand is required.
    if (argc > 1 && argv[1][0] != '-') {
        std::string names;
        bool known = false;
        for (const CLI::App* sub : app.get_subcommands({})) {
            names += (names.empty() ? "" : ", ") + sub->get_name();
            known = known || sub->check_name(argv[1]);
        }
        if (!known) {
            std::cerr << "tmx: unknown command '" << argv[1] << "' (commands: " << names
                      << "; run 'tmx --help')\n";
            return 2;
        }
    }
    try {
        app.parse(argc, argv);
    } catch (const CLI::Success& e) {  // --help, --version
        return app.exit(e);
    } catch (const CLI::ParseError& e) {
        std::cerr << "tmx: " << e.what() << "\n(run 'tmx --help' or 'tmx COMMAND --help')\n";
        return 2;
    } catch (const cli::Interrupted& e) {
        return e.exit_code;
    } catch (const UsageError& e) {  // the options it names as the flags that set them
        std::cerr << "tmx: " << e.message(cli::flag_of) << "\n";
        return 2;
    } catch (const Error& e) {
        std::cerr << "tmx: error: " << e.message(cli::flag_of) << "\n";
        return 1;
    } catch (const std::bad_alloc&) {
        std::cerr << "tmx: error: out of memory\n";
        return 1;
    } catch (const std::exception& e) {
        std::cerr << "tmx: internal error: " << e.what() << "\n";
        return 1;
    }
    return 0;
}

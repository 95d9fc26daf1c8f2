// tmx plot: draw a training run's metrics (loss, learning rate, expert load) as an SVG.
#include <cstdio>
#include <filesystem>

#include "apps/commands.h"
#include "engine/core/errors.h"
#include "engine/core/file_io.h"
#include "engine/train/metrics_plot.h"

namespace tmx::cli {

void add_plot_command(CLI::App& app, CommonOptions& common) {
    struct Options {
        std::string run, out;
    };
    auto o = std::make_shared<Options>();
    CLI::App* sub = app.add_subcommand(
        "plot", "Draw a run's loss and learning-rate curves and expert load to an SVG file");
    sub->add_option("RUN_DIR", o->run, "Run directory (tmx train --out)")->required();
    sub->add_option("--out", o->out, "SVG file to write (default: RUN_DIR/metrics.svg)");
    add_common_options(*sub, common);
    sub->callback([o]() {
        const std::string metrics = (std::filesystem::path(o->run) / "metrics.jsonl").string();
        std::error_code unreadable;  // e.g. no permission: read_file below names the cause
        if (!std::filesystem::exists(metrics, unreadable) && !unreadable)
            throw Error(o->run + ": no metrics.jsonl (is it a tmx train run directory?)");
        const std::string out =
            o->out.empty() ? (std::filesystem::path(o->run) / "metrics.svg").string() : o->out;
        write_file_atomic(out, render_metrics_svg(read_file(metrics), o->run, metrics));
        std::printf("wrote %s\n", out.c_str());
    });
}

}  // namespace tmx::cli

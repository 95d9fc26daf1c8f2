// tmx devices: the GPUs on this machine, as each backend of the build lists them
// (backends/registry.h: DeviceListing), one table per backend, or one JSON object with --json.
// A backend the build lacks says so, and how to build it.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "apps/commands.h"
#include "backends/registry.h"

namespace tmx::cli {

namespace {

// The row's cells, each padded to its column's width but the last, one space apart.
std::string table_line(const DeviceListing& l, const std::vector<std::string>& cells) {
    std::string line;
    for (size_t i = 0; i < cells.size(); ++i) {
        line += cells[i];
        if (i + 1 == cells.size()) break;
        const size_t width = static_cast<size_t>(l.columns[i].width);
        if (cells[i].size() < width) line.append(width - cells[i].size(), ' ');
        line += ' ';
    }
    return line;
}

void print_table(const DeviceListing& l) {
    if (l.rows.empty()) {
        std::printf("%s: %s\n", l.title.c_str(), l.none.c_str());
        return;
    }
    std::vector<std::string> headings;
    for (const DeviceListing::Column& c : l.columns) headings.push_back(c.heading);
    std::printf("%s\n  %s\n", l.title.c_str(), table_line(l, headings).c_str());
    for (const DeviceListing::Row& r : l.rows)
        std::printf("%c %s\n", r.marked ? '*' : ' ', table_line(l, r.cells).c_str());
    for (const std::string& note : l.notes) std::printf("%s\n", note.c_str());
}

void add_json(const DeviceListing& l, nlohmann::json& out) {
    if (!l.json_key.empty()) {
        nlohmann::json& rows = out[l.json_key] = nlohmann::json::array();
        for (const DeviceListing::Row& r : l.rows) rows.push_back(r.fields);
    }
    out.update(l.json_extra);
}

}  // namespace

void add_devices_command(CLI::App& app, CommonOptions& common) {
    auto json = std::make_shared<bool>(false);
    CLI::App* sub = app.add_subcommand(
        "devices",
        "List the GPUs: CUDA devices (compute capability, SMs, memory) and Vulkan devices "
        "(type, memory, subgroup size, shared memory, fp16, cooperative matrix)");
    sub->add_flag("--json", *json, "Print one JSON object instead of a table");
    add_common_options(*sub, common);
    sub->callback([json]() {
        nlohmann::json out = nlohmann::json::object();
        const auto listings = device_listings();
        for (size_t i = 0; i < listings.size(); ++i) {
            const DeviceListing l = listings[i]();
            if (*json) {
                add_json(l, out);
                continue;
            }
            print_table(l);
            if (i + 1 < listings.size()) std::printf("\n");  // a blank line between backends
        }
        if (*json) std::printf("%s\n", out.dump().c_str());
    });
}

}  // namespace tmx::cli

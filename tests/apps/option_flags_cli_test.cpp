// The flags tmx prints for the options the engine names (apps/option_flags.h): every field the
// engine names with opt("...") has a row, every row is a field the engine names, and every
// row's flag is one that a tmx command takes, as its --help lists it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "apps/option_flags.h"
#include "engine/core/errors.h"
#include "tests/test_util.h"

namespace tmx {
namespace {

namespace fs = std::filesystem;

// Each field the engine's sources name with opt("field"), with the first place that names it.
std::map<std::string, std::string> fields_the_engine_names() {
    std::map<std::string, std::string> fields;
    const std::regex named(R"re(\bopt\("([^"]*)"\))re");
    for (const auto& e :
         fs::recursive_directory_iterator(fs::path(test::source_dir()) / "engine")) {
        const std::string ext = e.path().extension().string();
        if (!e.is_regular_file() || (ext != ".h" && ext != ".cpp")) continue;
        std::ifstream in(e.path());
        std::string line;
        for (int n = 1; std::getline(in, line); ++n)
            for (std::sregex_iterator m(line.begin(), line.end(), named), end; m != end; ++m)
                fields.emplace((*m)[1].str(), e.path().string() + ":" + std::to_string(n));
    }
    return fields;
}

// The flags of `command` ("" for tmx itself) and of its subcommands, from their --help, into
// `flags` as flag -> the command that takes it.
void collect_flags(const std::string& command, std::map<std::string, std::string>& flags) {
    const test::CommandResult help = test::run_tmx(command + " --help");
    ASSERT_EQ(help.exit_code, 0) << "tmx " << command << " --help: " << help.err;
    std::istringstream lines(help.out);
    // CLI11 lists an option as "  --name TYPE ..." (or "  -h,--help") under "Options:", and each
    // subcommand as "  name  description" under "Subcommands:".
    const std::regex option(R"(^\s+(?:-[a-zA-Z],)?(--[a-z0-9-]+)\b)");
    const std::regex subcommand(R"(^  ([a-z]+)\s)");
    bool in_subcommands = false;
    std::vector<std::string> subcommands;
    for (std::string line; std::getline(lines, line);) {
        if (line.rfind("Subcommands:", 0) == 0) in_subcommands = true;
        if (line.rfind("Options:", 0) == 0) in_subcommands = false;
        std::smatch m;
        if (in_subcommands && std::regex_search(line, m, subcommand))
            subcommands.push_back(m[1]);
        else if (!in_subcommands && std::regex_search(line, m, option))
            flags.emplace(m[1], command);
    }
    for (const std::string& sub : subcommands)
        collect_flags(command.empty() ? sub : command + " " + sub, flags);
}

TEST(OptionFlagsCli, EveryFieldTheEngineNamesHasAFlagAndEveryRowIsUsed) {
    const std::map<std::string, std::string> named = fields_the_engine_names();
    ASSERT_GT(named.size(), 10u) << "opt(\"...\") not found in engine/: the scan is broken";
    std::set<std::string> rows;
    for (const cli::OptionFlag& row : cli::kOptionFlags) {
        EXPECT_TRUE(rows.insert(std::string(row.field)).second) << row.field << " twice";
        EXPECT_TRUE(named.count(std::string(row.field)))
            << "apps/option_flags.h maps " << row.field << ", which the engine never names";
    }
    for (const auto& [field, where] : named)
        EXPECT_TRUE(rows.count(field))
            << where << " names the option " << field << ", which apps/option_flags.h lacks";
}

TEST(OptionFlagsCli, EveryFlagIsOneACommandTakes) {
    std::map<std::string, std::string> flags;  // flag -> a command that takes it
    collect_flags("", flags);
    ASSERT_TRUE(flags.count("--threads") && flags.count("--train-batch"))
        << "the --help scan found " << flags.size() << " flags";
    for (const cli::OptionFlag& row : cli::kOptionFlags)
        EXPECT_TRUE(flags.count(std::string(row.flag)))
            << row.field << " -> " << row.flag << ": no tmx command takes that flag";
}

TEST(OptionFlagsCli, ErrorsPrintWithTheFlags) {
    const UsageError e(opt("train_batch") + " and " + opt("train_seq") + " go together");
    EXPECT_EQ(e.message(cli::flag_of), "--train-batch and --train-seq go together");
    EXPECT_EQ(cli::flag_of("overwrite"), "--force");
    EXPECT_EQ(cli::flag_of("not_an_option"), "not_an_option");  // as the engine names it
}

// The same end to end: tmx prints an engine message with the flag the user gave.
TEST(OptionFlagsCli, AnEngineErrorPrintsTheFlag) {
    const test::CommandResult r = test::run_tmx(
        "bench --config " + test::source_dir() +
        "/assets/configs/test-tiny.json --backends cpu --train-batch 2 --train-seq 100000");
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find("tmx: tmx bench: --train-seq 100000 exceeds the model's max_seq_len"),
              std::string::npos)
        << r.err;
}

}  // namespace
}  // namespace tmx

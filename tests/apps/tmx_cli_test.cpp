// The tmx executable's top level: an unknown or missing command is a usage error (exit 2) that
// says what was wrong and which commands exist; --version names the version.
#include <gtest/gtest.h>

#include <string>

#include "tests/test_util.h"

namespace tmx {
namespace {

TEST(TmxCli, AnUnknownCommandIsAUsageErrorListingTheCommands) {
    auto r = test::run_tmx("genrate --model x");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("unknown command 'genrate'"), std::string::npos) << r.err;
    for (const char* command : {"params", "generate", "train", "bench", "devices"})
        EXPECT_NE(r.err.find(command), std::string::npos) << command << " not listed: " << r.err;
    EXPECT_EQ(r.out, "");
}

TEST(TmxCli, NoCommandIsAUsageError) {
    auto r = test::run_tmx("");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("subcommand is required"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("tmx --help"), std::string::npos) << r.err;
}

TEST(TmxCli, AKnownCommandAndVersionStillWork) {
    auto r = test::run_tmx("--version");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out.rfind("tmx ", 0), 0u) << r.out;
    r = test::run_tmx("params --config " + test::source_dir() + "/assets/configs/test-tiny.json");
    EXPECT_EQ(r.exit_code, 0) << r.err;
}

}  // namespace
}  // namespace tmx

// Every integer flag of the commands that take sizes, counts and seeds states its range in
// --help, and a value just outside it, at either end, is a usage error giving that range in
// words: never saturated, wrapped or left to a later, vaguer check.
#include <gtest/gtest.h>

#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace tmx {
namespace {

// |v| <= 2^64: the values just outside the ranges of 64-bit flags.
std::string to_decimal(__int128 v) {
    const __int128 magnitude = v < 0 ? -v : v;
    const std::string digits = magnitude == static_cast<__int128>(1) << 64
                                   ? "18446744073709551616"
                                   : std::to_string(static_cast<uint64_t>(magnitude));
    return v < 0 ? "-" + digits : digits;
}

// A bound as --help and the errors write it: "4,096", "2^31 - 1", "-2^63", "0".
__int128 parse_bound(const std::string& text) {
    std::smatch m;
    if (std::regex_match(text, m, std::regex(R"((-?)2\^(\d+)( - 1)?)"))) {
        const __int128 power = static_cast<__int128>(1) << std::stoi(m[2]);
        return (m[1].length() ? -power : power) - (m[3].length() ? 1 : 0);
    }
    EXPECT_TRUE(std::regex_match(text, std::regex(R"(-?\d{1,3}(,\d{3})*)"))) << text;
    __int128 v = 0;
    for (char c : text)
        if (c >= '0' && c <= '9') v = v * 10 + (c - '0');
    return text[0] == '-' ? -v : v;
}

struct IntegerFlag {
    std::string name, range;  // "--batch-size", "[1, 2^63 - 1]"
    std::string low, high;    // the bounds as written
};

// The integer options (CLI11 types INT and UINT) of `command`'s --help.
std::vector<IntegerFlag> integer_flags(const std::string& command) {
    const test::CommandResult help = test::run_tmx(command + " --help");
    EXPECT_EQ(help.exit_code, 0) << help.err;
    std::vector<IntegerFlag> flags;
    std::istringstream lines(help.out);
    // The type, then its validators' annotation: ":[LOW, HIGH]" for a range (its bounds may
    // hold spaces, "2^63 - 1", and commas, "4,096"), then "=DEFAULT" when one is shown.
    const std::regex option(R"(^\s+(--[a-z0-9-]+) U?INT(:\[([^\]]*)\]|\S*))");
    for (std::string line; std::getline(lines, line);) {
        std::smatch m;
        if (!std::regex_search(line, m, option)) continue;
        IntegerFlag f{m[1], m[2], "", ""};
        const std::string inside = m[3];
        const size_t comma = inside.find(", ");
        if (comma != std::string::npos)
            f.low = inside.substr(0, comma), f.high = inside.substr(comma + 2);
        flags.push_back(f);
    }
    return flags;
}

TEST(IntegerFlagsCli, EveryIntegerFlagStatesItsRangeAndRefusesValuesOutsideIt) {
    // Each command with what it requires, so that only the flag under test can be wrong.
    const std::string demo = test::source_dir() + "/assets/demo";
    const std::vector<std::string> commands = {
        "train",
        "generate --model " + demo + " --prompt hi",
        "bench",
        "eval --model " + demo + " --tokens 1,2",
        "prepare --input in.txt --tokenizer " + demo + " --out out",
        "params --config " + demo + "/config.json",
        "init --config " + demo + "/config.json --out out",
        "tokenizer train --input in.txt --vocab-size 512 --out tok.model",
    };
    int checked = 0;
    for (const std::string& command : commands) {
        // The command's words before its first flag.
        const std::string name = command.substr(0, command.find(" --"));
        const std::vector<IntegerFlag> flags = integer_flags(name);
        EXPECT_FALSE(flags.empty()) << name;  // --threads at least
        for (const IntegerFlag& f : flags) {
            SCOPED_TRACE(name + " " + f.name);
            ASSERT_FALSE(f.low.empty()) << "no range in --help: '" << f.range << "'";
            const __int128 low = parse_bound(f.low), high = parse_bound(f.high);
            ASSERT_LE(low, high);
            for (const __int128 outside : {low - 1, high + 1}) {
                const std::string value = to_decimal(outside);
                const test::CommandResult r = test::run_tmx(command + " " + f.name + " " + value);
                EXPECT_EQ(r.exit_code, 2) << r.err;
                EXPECT_NE(r.err.find("tmx: " + f.name + ": expected an integer from " + f.low +
                                     " to " + f.high + ", got " + value),
                          std::string::npos)
                    << r.err;
                ++checked;
            }
        }
    }
    EXPECT_GE(checked, 2 * 30);  // the commands' integer flags, both ends
}

}  // namespace
}  // namespace tmx

// The direction of dependencies (docs/architecture.md), checked over every #include of the
// source tree: apps -> dist -> backends -> engine, and inside engine/ each room uses only itself
// and the rooms before it: core, compute, model, data, dist, train, infer, report, interop. A
// file that breaks the order fails this test, which prints each offending line.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <regex>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace tmx::test {
namespace {

namespace fs = std::filesystem;

// The rooms of engine/, each allowed to include itself and those before it.
const std::vector<std::string> kEngineRooms = {"core",  "compute", "model",  "data",   "dist",
                                               "train", "infer",   "report", "interop"};
// The top-level layers, each allowed to include itself and those before it.
const std::vector<std::string> kLayers = {"engine", "backends", "dist", "apps"};

int index_of(const std::vector<std::string>& list, const std::string& name) {
    auto it = std::find(list.begin(), list.end(), name);
    return it == list.end() ? -1 : static_cast<int>(it - list.begin());
}

// The first one or two path components of a path relative to the source tree.
std::vector<std::string> parts(const std::string& rel) {
    std::vector<std::string> out;
    for (const auto& p : fs::path(rel)) out.push_back(p.string());
    return out;
}

struct Include {
    std::string file;  // relative to the source tree
    int line;
    std::string target;
};

std::vector<Include> project_includes(const std::string& root) {
    std::vector<Include> out;
    const std::regex include_re(R"re(^\s*#\s*include\s+"([^"]+)")re");
    for (const char* top : {"engine", "backends", "dist", "apps"}) {
        for (const auto& e : fs::recursive_directory_iterator(fs::path(root) / top)) {
            const std::string ext = e.path().extension().string();
            if (!e.is_regular_file() ||
                (ext != ".h" && ext != ".cpp" && ext != ".cu" && ext != ".cuh"))
                continue;
            std::ifstream in(e.path());
            std::string text;
            int n = 0;
            while (std::getline(in, text)) {
                ++n;
                std::smatch m;
                if (std::regex_search(text, m, include_re))
                    out.push_back({fs::relative(e.path(), root).string(), n, m[1].str()});
            }
        }
    }
    return out;
}

// Why `inc` breaks the order, or "" when it does not.
std::string violation(const Include& inc) {
    const std::vector<std::string> from = parts(inc.file), to = parts(inc.target);
    const int from_layer = index_of(kLayers, from[0]);
    const int to_layer = to.size() > 1 ? index_of(kLayers, to[0]) : -1;
    if (to_layer < 0) return "";  // a file beside it, a generated header or a shader
    if (to_layer > from_layer) return from[0] + "/ may not include " + to[0] + "/";
    if (from[0] != "engine" || to[0] != "engine") return "";
    if (from.size() < 3) return "engine/ holds rooms, not files: " + inc.file;
    if (to.size() < 3) return "includes a file outside engine's rooms: " + inc.target;
    const int from_room = index_of(kEngineRooms, from[1]), to_room = index_of(kEngineRooms, to[1]);
    if (from_room < 0) return "engine/" + from[1] + "/ is not a room in the order";
    if (to_room < 0) return "engine/" + to[1] + "/ is not a room in the order";
    if (to_room > from_room)
        return "engine/" + from[1] + "/ may not include engine/" + to[1] + "/ (it comes later)";
    return "";
}

TEST(Layering, EveryIncludePointsOneWay) {
    const std::vector<Include> includes = project_includes(source_dir());
    ASSERT_GT(includes.size(), 100u) << "found too few #include lines under " << source_dir();
    int bad = 0;
    for (const Include& inc : includes) {
        const std::string why = violation(inc);
        if (why.empty()) continue;
        ++bad;
        ADD_FAILURE() << inc.file << ":" << inc.line << ": #include \"" << inc.target
                      << "\": " << why;
    }
    std::cout
        << "[          ] " << includes.size() << " #include lines checked, " << bad
        << " against the order engine/{core, compute, model, data, dist, train, infer, report,"
        << " interop} -> backends -> dist -> apps\n";
}

// The check itself: includes that break the order are found.
TEST(Layering, TheCheckFindsIncludesAgainstTheOrder) {
    EXPECT_NE(violation({"engine/compute/backend.h", 1, "engine/model/config.h"}), "");
    EXPECT_NE(violation({"engine/train/trainer.cpp", 1, "engine/report/param_report.h"}), "");
    EXPECT_NE(violation({"engine/model/model.cpp", 1, "backends/registry.h"}), "");
    EXPECT_NE(violation({"backends/cpu/norm.cpp", 1, "apps/commands.h"}), "");
    EXPECT_NE(violation({"backends/cuda/nccl_communicator.cpp", 1, "dist/open_communicator.h"}),
              "");
    EXPECT_NE(violation({"engine/dist/communicator.h", 1, "engine/train/trainer.h"}), "");
    EXPECT_NE(violation({"engine/model/x.h", 1, "engine/newroom/y.h"}), "");
    EXPECT_EQ(violation({"engine/report/bench.cpp", 1, "engine/core/rng.h"}), "");
    EXPECT_EQ(violation({"engine/model/model.cpp", 1, "engine/model/model.h"}), "");
    EXPECT_EQ(violation({"backends/cuda/norm.cu", 1, "engine/compute/backend.h"}), "");
    EXPECT_EQ(violation({"apps/cmd_train.cpp", 1, "backends/registry.h"}), "");
    EXPECT_EQ(violation({"dist/open_communicator.cpp", 1, "backends/cuda/nccl_communicator.h"}),
              "");
    EXPECT_EQ(violation({"engine/train/trainer.cpp", 1, "engine/dist/communicator.h"}), "");
    EXPECT_EQ(violation({"backends/cuda/norm.cu", 1, "cuda_common.cuh"}), "");
}

}  // namespace
}  // namespace tmx::test

// tmx tune as a user runs it: it measures a config's shapes on the Vulkan device, writes the
// device's tuning file under XDG_CACHE_HOME, and `tmx devices` then says the device is tuned;
// a corrupt file is reported there and refused, and bad flags are usage errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "tests/test_util.h"

namespace tmx {
namespace {

TEST(TuneCli, TunesAConfigSavesTheDeviceFileAndDevicesSaysSo) {
    if (!test::backend_opens("vulkan")) GTEST_SKIP() << "no Vulkan device here";
    test::CacheHome cache;
    const std::string config = test::source_dir() + "/assets/configs/test-tiny-swiglu.json";
    auto r = test::run_tmx("tune --config " + config +
                           " --prompt 24 --batch 2 --train-batch 2 --train-seq 8 --repeats 1"
                           " --min-ms 0.2 --gemm 37 --json --threads 2");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("tune: [1/"), std::string::npos) << r.err;  // progress
    const nlohmann::json j = nlohmann::json::parse(r.out);
    ASSERT_FALSE(j["shapes"].empty());
    const std::string saved = j["saved_to"];
    EXPECT_EQ(saved.rfind(cache.path().string() + "/tmx/vulkan-tuning-", 0), 0u) << saved;
    EXPECT_TRUE(std::filesystem::exists(saved));
    // --gemm: bench's square fp32 product is one of the tuned shapes.
    EXPECT_TRUE(std::any_of(j["shapes"].begin(), j["shapes"].end(), [](const auto& s) {
        return s["shape"] == "matmul rows<=64 n=37 k=37";
    })) << j["shapes"].dump();
    for (const auto& s : j["shapes"]) {
        EXPECT_GT(s["best_ms"].get<double>(), 0.0) << s["shape"];
        EXPECT_GE(s["speedup"].get<double>(), 1.0) << s["shape"];
        EXPECT_GE(s["tried"].size(), 4u) << s["shape"];
    }

    auto devices = test::run_tmx("devices --json");
    ASSERT_EQ(devices.exit_code, 0) << devices.err;
    const nlohmann::json d = nlohmann::json::parse(devices.out);
    const int def = d["default"];
    const std::string status = d["devices"][def]["tuning"];
    EXPECT_EQ(status.rfind("tuned (" + std::to_string(j["shapes"].size()) + " shapes", 0), 0u)
        << status;
    auto table = test::run_tmx("devices");
    EXPECT_NE(table.out.find(std::to_string(def) + ": matmul shapes tuned ("), std::string::npos)
        << table.out;

    // The table form, not saved.
    auto plain =
        test::run_tmx("tune --config " + config +
                      " --prompt 8 --batch 2 --no-train --repeats 1 --min-ms 0.2 --no-save");
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    EXPECT_NE(plain.out.find("speedup"), std::string::npos) << plain.out;
    EXPECT_NE(plain.out.find("not saved (--no-save)"), std::string::npos) << plain.out;

    // A corrupt file: refused where it is read, never fatal.
    test::write_text(saved, "{\"format\": \"tmx-vulkan-tuning\", \"vers");
    table = test::run_tmx("devices");
    EXPECT_EQ(table.exit_code, 0) << table.err;
    EXPECT_NE(table.out.find(std::to_string(def) + ": matmul shapes untuned (refused " + saved),
              std::string::npos)
        << table.out;
}

TEST(TuneCli, RefusesBadFlags) {
    for (const char* args :
         {"tune --backend cpu", "tune --prompt 0", "tune --repeats 0", "tune --min-ms 0",
          "tune --config /nonexistent.json", "tune --gemm 0"}) {
        auto r = test::run_tmx(args);
        EXPECT_NE(r.exit_code, 0) << args;
        EXPECT_FALSE(r.err.empty()) << args;
    }
}

}  // namespace
}  // namespace tmx

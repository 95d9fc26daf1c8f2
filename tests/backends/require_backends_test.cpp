// TMX_REQUIRE_BACKENDS: on a GPU machine (scripts/gpu-check.sh sets it) a test whose backend
// cannot be opened fails instead of skipping.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "backends/registry.h"
#include "engine/core/errors.h"
#include "engine/core/file_io.h"
#include "tests/test_util.h"

namespace tmx::test {
namespace {

// Sets an environment variable for one scope, restoring what was there.
class ScopedEnv {
  public:
    ScopedEnv(const char* name, const char* value) : name_(name) {
        if (const char* old = std::getenv(name)) old_ = old;
        had_ = std::getenv(name) != nullptr;
        if (value)
            ::setenv(name, value, 1);
        else
            ::unsetenv(name);
    }
    ~ScopedEnv() {
        if (had_)
            ::setenv(name_, old_.c_str(), 1);
        else
            ::unsetenv(name_);
    }

  private:
    const char* name_;
    std::string old_;
    bool had_ = false;
};

TEST(RequireBackends, TheListNamesBackendsWithoutTheirDeviceIndex) {
    {
        ScopedEnv env("TMX_REQUIRE_BACKENDS", nullptr);
        EXPECT_FALSE(backend_required("cuda"));
        EXPECT_FALSE(backend_required("vulkan"));
    }
    ScopedEnv env("TMX_REQUIRE_BACKENDS", "cuda,vulkan");
    EXPECT_TRUE(backend_required("cuda"));
    EXPECT_TRUE(backend_required("vulkan"));
    EXPECT_TRUE(backend_required("vulkan:1"));
    EXPECT_FALSE(backend_required("cpu"));
    EXPECT_FALSE(backend_required("cud"));  // whole names only
    ScopedEnv other("TMX_REQUIRE_BACKENDS", "vulkan");
    EXPECT_FALSE(backend_required("cuda"));
}

// A backend compiled in that cannot be opened (CUDA without a GPU, Vulkan without a driver): its
// op test skips normally and fails when required. Runs this very test binary on one op test of
// that backend. Where every compiled-in backend opens (lavapipe's Vulkan here, a GPU machine's
// CUDA and Vulkan), the child is shown no Vulkan driver: the loader's driver list
// (VK_DRIVER_FILES, VK_ICD_FILENAMES before loader 1.3.207) names a file that does not exist.
TEST(RequireBackends, AnUnavailableRequiredBackendFailsItsTests) {
    const std::vector<std::string> names = backend_names();
    std::string absent;
    for (const std::string& name : names) {
        try {
            make_backend(name);
        } catch (const Error&) {
            absent = name;
            break;
        }
    }
    std::string hide;
    if (absent.empty() && std::find(names.begin(), names.end(), "vulkan") != names.end()) {
        absent = "vulkan";
        const std::string nowhere = "/nonexistent/tmx-no-vulkan-driver.json";
        hide = "VK_DRIVER_FILES=" + nowhere + " VK_ICD_FILENAMES=" + nowhere + " ";
    }
    if (absent.empty()) GTEST_SKIP() << "every compiled-in backend opens, and none is Vulkan";
    const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
    TempDir dir;
    const std::string out = dir / "child.out";
    const std::string run =
        hide + self + " --gtest_filter=Backends/OpTest.GatherRows/" + absent + " >" + out + " 2>&1";
    {
        ScopedEnv env("TMX_REQUIRE_BACKENDS", nullptr);
        EXPECT_EQ(std::system(run.c_str()), 0) << absent << ": a skip is no failure";
        // It skipped, rather than ran: the backend really is unavailable to the child.
        const std::string text = read_file(out);
        EXPECT_NE(text.find("[  SKIPPED ] 1 test"), std::string::npos) << text;
    }
    ScopedEnv env("TMX_REQUIRE_BACKENDS", ("cpu," + absent).c_str());
    EXPECT_NE(std::system(run.c_str()), 0)
        << absent << " is required, yet its test passed: " << read_file(out);
    const std::string text = read_file(out);
    EXPECT_NE(text.find("is required (TMX_REQUIRE_BACKENDS)"), std::string::npos) << text;
}

}  // namespace
}  // namespace tmx::test

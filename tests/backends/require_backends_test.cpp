// TMX_REQUIRE_BACKENDS: on a GPU machine (scripts/gpu-check.sh sets it) a test whose backend
// cannot be opened fails instead of skipping.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "backends/registry.h"
#include "engine/core/errors.h"
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

// A backend compiled in that cannot be opened here (CUDA without a GPU, Vulkan without a
// driver): its op test skips normally and fails when required. Runs this very test binary on
// one op test of that backend. Where every compiled-in backend opens (a GPU machine), there is
// nothing to show.
TEST(RequireBackends, AnUnavailableRequiredBackendFailsItsTests) {
    std::string absent;
    for (const std::string& name : backend_names()) {
        try {
            make_backend(name);
        } catch (const Error&) {
            absent = name;
            break;
        }
    }
    if (absent.empty()) GTEST_SKIP() << "every compiled-in backend opens on this machine";
    const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
    const std::string run =
        self + " --gtest_filter=Backends/OpTest.Embedding/" + absent + " > /dev/null 2>&1";
    {
        ScopedEnv env("TMX_REQUIRE_BACKENDS", nullptr);
        EXPECT_EQ(std::system(run.c_str()), 0) << absent << ": a skip is no failure";
    }
    ScopedEnv env("TMX_REQUIRE_BACKENDS", ("cpu," + absent).c_str());
    EXPECT_NE(std::system(run.c_str()), 0) << absent << " is required, yet its test passed";
}

}  // namespace
}  // namespace tmx::test

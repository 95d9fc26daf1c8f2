// Backend::begin_profile's default: a backend that cannot time its commands (the CPU's; the
// Vulkan backend's profiler has its own tests) says so, naming itself, and ending a profile
// never begun is a programming error.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "backends/registry.h"
#include "engine/compute/backend.h"
#include "engine/core/errors.h"

namespace tmx {
namespace {

TEST(BackendProfile, ABackendThatCannotTimeSaysSo) {
    auto cpu = make_backend("cpu");
    EXPECT_FALSE(cpu->can_profile());
    try {
        cpu->begin_profile();
        FAIL() << "begin_profile() on the CPU backend";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("cpu backend cannot time"), std::string::npos)
            << e.what();
    }
    EXPECT_THROW(cpu->end_profile(), std::logic_error);
    EXPECT_FALSE(cpu->profiled_barriers().has_value()) << "it counts no barriers either";
}

}  // namespace
}  // namespace tmx

// The CPU backend's memory capacity: physical memory, lowered to a container's cgroup limit.
#include <gtest/gtest.h>
#include <unistd.h>

#include "backends/cpu/cpu_backend.h"

namespace tmx {
namespace {

TEST(CpuMemory, CgroupLimitsParseAsBytesAndAnythingElseAsNoLimit) {
    EXPECT_EQ(parse_cgroup_memory_limit("1073741824\n"), 1073741824u);
    EXPECT_EQ(parse_cgroup_memory_limit("536870912"), 536870912u);
    EXPECT_EQ(parse_cgroup_memory_limit("18446744073709551615\n"), 18446744073709551615u);
    for (const char* none : {"max\n", "", "\n", "-1", "12abc", "1.5e9", " 42",
                             "18446744073709551616", "999999999999999999999999"})
        EXPECT_EQ(parse_cgroup_memory_limit(none), 0u) << '"' << none << '"';
}

TEST(CpuMemory, CapacityIsPositiveAndAtMostPhysicalMemory) {
    const uint64_t physical = static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) *
                              static_cast<uint64_t>(::sysconf(_SC_PAGE_SIZE));
    const uint64_t capacity = CpuBackend().memory_capacity();
    EXPECT_GT(capacity, 0u);
    EXPECT_LE(capacity, physical);
}

}  // namespace
}  // namespace tmx

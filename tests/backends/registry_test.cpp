// The build's list of backends (backends/registry.h): every backend registered from its own
// folder, by name; what make_backend() takes and refuses; --backend auto's choice; and the
// device listings `tmx devices` prints (each well formed, whatever this machine has).
#include "backends/registry.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "engine/core/errors.h"

namespace tmx::test {
namespace {

TEST(BackendRegistry, NamesAreSortedAndEachOpensOrSaysWhyNot) {
    const std::vector<std::string> names = backend_names();
    ASSERT_FALSE(names.empty());
    EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
    EXPECT_NE(std::find(names.begin(), names.end(), "cpu"), names.end());
    std::string list;
    for (const std::string& n : names) {
        list += (list.empty() ? "" : ", ") + n;
        try {
            EXPECT_EQ(make_backend(n)->name(), n);
        } catch (const Error& e) {  // a GPU backend on a machine without its device
            EXPECT_NE(n, "cpu") << e.what();
        }
    }
    EXPECT_EQ(backend_list(), list);
    EXPECT_FALSE(backend_takes_device("cpu"));
    EXPECT_FALSE(backend_takes_device("nosuch"));
}

TEST(BackendRegistry, UnknownNamesAndDevicesOfABackendWithoutThemAreRefused) {
    for (const std::string name : {"nosuch", "cpu:0", "auto", "", ":1"}) {
        try {
            make_backend(name);
            ADD_FAILURE() << "'" << name << "' opened";
        } catch (const UsageError& e) {
            EXPECT_EQ(std::string(e.what()),
                      "unknown backend '" + name + "' (available: " + backend_list() + ")");
        }
    }
    // A backend with devices refuses an index that is not one.
    for (const std::string& n : backend_names())
        if (backend_takes_device(n)) {
            EXPECT_THROW(make_backend(n + ":first"), UsageError) << n;
            EXPECT_THROW(make_backend(n + ":-1"), UsageError) << n;
        }
}

TEST(BackendRegistry, AutoIsABackendOfTheBuildThatRunsHere) {
    const std::string chosen = resolve_backend("auto");
    const std::vector<std::string> names = backend_names();
    EXPECT_NE(std::find(names.begin(), names.end(), chosen), names.end()) << chosen;
    EXPECT_NO_THROW(make_backend(chosen)) << chosen;
    EXPECT_EQ(resolve_backend("vulkan:1"), "vulkan:1");  // a name is left as it is
}

TEST(BackendRegistry, DeviceListingsAreWellFormed) {
    const auto listings = device_listings();
    // At least the GPU backends tmx knows, built in or not.
    EXPECT_GE(listings.size(), 2u);
    std::vector<std::string> titles;
    for (const auto& list : listings) {
        const DeviceListing l = list();
        SCOPED_TRACE(l.title);
        EXPECT_FALSE(l.title.empty());
        EXPECT_FALSE(l.none.empty()) << "the line that stands for an empty table";
        titles.push_back(l.title);
        int marked = 0;
        for (const DeviceListing::Row& r : l.rows) {
            EXPECT_EQ(r.cells.size(), l.columns.size());
            EXPECT_TRUE(r.fields.is_object());
            marked += r.marked;
        }
        EXPECT_LE(marked, 1) << "one default device at most";
        EXPECT_TRUE(l.json_extra.is_object());
    }
    EXPECT_NE(std::find(titles.begin(), titles.end(), "CUDA"), titles.end());
    EXPECT_NE(std::find(titles.begin(), titles.end(), "Vulkan"), titles.end());
}

}  // namespace
}  // namespace tmx::test

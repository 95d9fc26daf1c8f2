// The embedded SPIR-V (backends/vulkan/vulkan_shaders.h) against the SPIR-V validator
// (spirv-val, Debian's spirv-tools, which glslang-tools depends on): every module as built, and
// the cooperative-matrix modules (the ".cm" variants, shaders/matmul_tile_coopmat.glsl)
// specialized as the backend creates them for every candidate at both block shapes. No
// Vulkan device here runs those modules (lavapipe has no cooperative matrices), so this is what
// CI can check of them: that each specialization is a valid Vulkan 1.2 module.
#ifdef TMX_HAS_VULKAN

#include "backends/vulkan/vulkan_shaders.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "backends/vulkan/vulkan_tuning.h"
#include "tests/test_util.h"

namespace tmx::test {
namespace {

// The program's path in PATH, or "" when it is not installed.
std::string find_program(const std::string& name) {
    const char* path = std::getenv("PATH");
    std::string dirs = path ? path : "/usr/bin";
    size_t at = 0;
    while (at <= dirs.size()) {
        size_t end = dirs.find(':', at);
        if (end == std::string::npos) end = dirs.size();
        const std::filesystem::path p = std::filesystem::path(dirs.substr(at, end - at)) / name;
        std::error_code ec;
        if (!p.parent_path().empty() && std::filesystem::is_regular_file(p, ec)) return p.string();
        at = end + 1;
    }
    return "";
}

void write_module(const std::string& path, const vk::EmbeddedShader& s) {
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(s.code),
            static_cast<std::streamsize>(s.words * sizeof(uint32_t)));
}

// The command's exit status, its output (both streams) in `out`.
int run_command(const std::string& command, const TempDir& dir, std::string& out) {
    const std::string log = dir / "log";
    const int status = std::system((command + " >" + log + " 2>&1").c_str());
    std::ifstream f(log);
    out.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

const vk::EmbeddedShader* module_named(const std::string& name) {
    for (const vk::EmbeddedShader& s : vk::embedded_shaders())
        if (name == s.name) return &s;
    return nullptr;
}

class SpirvModules : public ::testing::Test {
  protected:
    void SetUp() override {
        validator_ = find_program("spirv-val");
        optimizer_ = find_program("spirv-opt");
        if (validator_.empty() || optimizer_.empty())
            GTEST_SKIP() << "spirv-val and spirv-opt are not installed (Debian: spirv-tools)";
    }
    std::string validator_, optimizer_;
    TempDir dir_;
};

TEST_F(SpirvModules, EveryEmbeddedModuleIsValidVulkan12) {
    ASSERT_FALSE(vk::embedded_shaders().empty());
    for (const vk::EmbeddedShader& s : vk::embedded_shaders()) {
        const std::string path = dir_ / (std::string(s.name) + ".spv");
        write_module(path, s);
        std::string out;
        EXPECT_EQ(run_command(validator_ + " --target-env vulkan1.2 " + path, dir_, out), 0)
            << s.name << ": " << out;
    }
}

// Each ".cm" candidate's specialization constants (vk::tiled_spec) frozen into the module, as
// the driver sees them: on NVIDIA's subgroups of 32, 16 x 16 and 16 x 8 blocks.
TEST_F(SpirvModules, CooperativeMatrixModulesAreValidForEveryCandidate) {
    int checked = 0;
    for (uint32_t columns : {16u, 8u}) {
        vk::DeviceInfo d;
        d.name = "an NVIDIA GPU";
        d.vendor_id = 0x10DE;
        d.subgroup_size = 32;
        d.max_workgroup_invocations = d.max_workgroup_size_x = 1024;
        d.shared_memory_bytes = 48 * 1024;
        d.coopmat_columns = columns;
        for (vk::Kernel k : {vk::Kernel::Matmul, vk::Kernel::GroupedMatmul}) {
            const std::string name = std::string(vk::kernel_name(k)) + "_cm_f16w";
            const vk::EmbeddedShader* s = module_named(name);
            ASSERT_NE(s, nullptr) << name << " is not embedded";
            const std::string path = dir_ / (name + ".spv"), frozen = dir_ / "frozen.spv";
            write_module(path, *s);
            for (const vk::Variant& v : vk::candidates(k, d)) {
                if (v.spec[6] != vk::kTiledCoopmat) continue;
                SCOPED_TRACE(name + " " + v.name(k) + " CN " + std::to_string(columns));
                const std::vector<uint32_t> spec = vk::tiled_spec(v, d, true);
                ASSERT_EQ(spec.size(), 8u);
                std::string values;
                for (size_t i = 0; i < spec.size(); ++i)
                    values += (i ? " " : "") + std::to_string(i) + ":" + std::to_string(spec[i]);
                std::string out;
                ASSERT_EQ(run_command(optimizer_ + " --set-spec-const-default-value \"" + values +
                                          "\" --freeze-spec-const --fold-spec-const-op-composite " +
                                          path + " -o " + frozen,
                                      dir_, out),
                          0)
                    << out;
                EXPECT_EQ(run_command(validator_ + " --target-env vulkan1.2 " + frozen, dir_, out),
                          0)
                    << out;
                ++checked;
            }
        }
    }
    EXPECT_EQ(checked, 2 * 2 * 8);
}

}  // namespace
}  // namespace tmx::test

#endif  // TMX_HAS_VULKAN

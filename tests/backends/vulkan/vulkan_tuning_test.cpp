// The Vulkan backend's tuning (backends/vulkan/vulkan_tuning.h) without a device: the
// candidates and their names, the defaults, the tuning file (written, read back, refused when it
// is corrupt or belongs to another device, driver or build) and the choice per call. On the
// device: vulkan_tuning_device_test.cpp.
#ifdef TMX_HAS_VULKAN

#include <algorithm>

#include "tests/backends/vulkan/vulkan_fixture.h"
#include "tests/backends/vulkan/vulkan_tuning_samples.h"

namespace tmx::test {
namespace {

using vk::Kernel;

// A device of the given limits, as the listing describes one.
vk::DeviceInfo device(uint32_t invocations, uint32_t shared_bytes, uint32_t vendor = 0x1002) {
    vk::DeviceInfo d;
    d.name = "a test device";
    d.max_workgroup_invocations = d.max_workgroup_size_x = invocations;
    d.shared_memory_bytes = shared_bytes;
    d.vendor_id = vendor;
    d.device_id = 0x1234;
    d.driver_version = 77;
    for (size_t i = 0; i < d.pipeline_cache_uuid.size(); ++i)
        d.pipeline_cache_uuid[i] = static_cast<uint8_t>(i * 17 + 3);
    return d;
}

std::vector<Kernel> every_kernel() {
    std::vector<Kernel> all;
    for (int k = 0; k < vk::kKernelCount; ++k) all.push_back(static_cast<Kernel>(k));
    return all;
}

TEST(VulkanTuning, EveryCandidateNameParsesBackAndNonsenseDoesNot) {
    const vk::DeviceInfo big = device(1024, 64 * 1024);
    for (Kernel k : every_kernel()) {
        SCOPED_TRACE(vk::kernel_name(k));
        EXPECT_EQ(vk::kernel_from_name(vk::kernel_name(k)), k);
        const std::vector<vk::Variant> all = vk::candidates(k, big);
        EXPECT_GE(all.size(), 12u);
        for (const vk::Variant& v : all) {
            const std::optional<vk::Variant> back = vk::parse_variant(k, v.name(k));
            ASSERT_TRUE(back) << v.name(k);
            EXPECT_EQ(*back, v);
        }
        for (const char* bad :
             {"", "bm64", "bm64.bn64.bk16.tm4.tnx", "wg64.nr", "wg0.nr4", "bm64.bn64.bk16.tm3.tn4",
              "wg64.nr4.", "bm0.bn64.bk16.tm4.tn4", "bm99999999.bn64.bk16.tm4.tn4"})
            EXPECT_FALSE(vk::parse_variant(k, bad)) << bad;
    }
    EXPECT_FALSE(vk::kernel_from_name("attention"));
}

// The matrix-vector variants that sum through subgroup shuffles: named ".sg1" (a name without
// it, as tuning files wrote before, is the shared-memory tree), offered where the device reports
// shuffles for compute shaders and its subgroups fit the workgroup, refused otherwise saying why;
// never the default.
TEST(VulkanTuning, SubgroupGemvVariantsNeedShufflesAndWholeSubgroups) {
    vk::DeviceInfo with = device(1024, 64 * 1024), without = with;
    with.subgroup_shuffle = true;
    with.subgroup_size = 32;
    const vk::TuningTable table(with);
    for (Kernel k : {Kernel::MatmulGemv, Kernel::GroupedMatmulGemv}) {
        SCOPED_TRACE(vk::kernel_name(k));
        const std::optional<vk::Variant> tree = vk::parse_variant(k, "wg64.nr4"),
                                         sg = vk::parse_variant(k, "wg64.nr4.sg1"),
                                         small = vk::parse_variant(k, "wg32.nr2.sg1");
        ASSERT_TRUE(tree && sg && small);
        EXPECT_EQ(tree->spec, (std::vector<uint32_t>{64, 4, 0}));
        EXPECT_EQ(sg->spec, (std::vector<uint32_t>{64, 4, 1}));
        EXPECT_EQ(sg->name(k), "wg64.nr4.sg1");
        for (const char* bad : {"wg64.nr4.sg2", "wg64.nr4.sg0", "wg64.nr4.sg", "wg64.sg1"})
            EXPECT_FALSE(vk::parse_variant(k, bad)) << bad;
        EXPECT_EQ(table.default_variant(k, 1, 4096, 4096, 2).name(k), "wg64.nr4");

        const std::vector<vk::Variant> all = vk::candidates(k, with);
        EXPECT_EQ(all.size(), 2 * vk::candidates(k, without).size());
        EXPECT_NE(std::find(all.begin(), all.end(), *sg), all.end());
        EXPECT_EQ(vk::invalid_reason(k, *small, with), "");

        EXPECT_NE(vk::invalid_reason(k, *sg, without).find("subgroup shuffles"), std::string::npos);
        vk::DeviceInfo wave64 = with;
        wave64.subgroup_size = 64;
        EXPECT_NE(vk::invalid_reason(k, *small, wave64).find("smaller than a subgroup"),
                  std::string::npos);
        EXPECT_EQ(vk::invalid_reason(k, *sg, wave64), "");
        const std::vector<vk::Variant> wave64_all = vk::candidates(k, wave64);
        EXPECT_EQ(std::count_if(wave64_all.begin(), wave64_all.end(),
                                [](const vk::Variant& v) { return v.spec[2] == 1; }),
                  12);  // workgroups 64, 128, 256 of 4 row counts each
        vk::DeviceInfo odd = with;
        odd.subgroup_size = 24;
        EXPECT_NE(vk::invalid_reason(k, *sg, odd).find("not a power of two"), std::string::npos);
    }
}

TEST(VulkanTuning, CandidatesAndDefaultsFitTheSmallestDeviceVulkanAllows) {
    // Vulkan guarantees 128 invocations and 16 KiB of shared memory per workgroup.
    const vk::DeviceInfo small = device(128, 16 * 1024), big = device(1024, 64 * 1024);
    const vk::TuningTable table(small);
    for (Kernel k : every_kernel()) {
        SCOPED_TRACE(vk::kernel_name(k));
        const std::vector<vk::Variant> fit = vk::candidates(k, small);
        // Decode attention holds a group's queries and the chunk's keys whatever its shape:
        // only its smallest shape fits in 16 KiB.
        EXPECT_GE(fit.size(), k == Kernel::AttentionSplit ? 1u : 4u);
        EXPECT_LT(fit.size(), vk::candidates(k, big).size());
        for (const vk::Variant& v : fit) EXPECT_EQ(vk::invalid_reason(k, v, small), "");
        for (int64_t rows : {1, 16, 40, 300, 5000}) {
            const vk::Variant d = table.default_variant(k, rows, 512, 512, 8);
            EXPECT_EQ(vk::invalid_reason(k, d, small), "") << d.name(k);
            EXPECT_NE(std::find(fit.begin(), fit.end(), d), fit.end()) << d.name(k);
        }
    }
    // The reasons name the limit.
    const vk::Variant wide{{256, 64, 64, 16, 4, 4, 0}};
    EXPECT_NE(vk::invalid_reason(Kernel::Matmul, wide, small).find("invocations"),
              std::string::npos);
    const vk::Variant deep{{256, 64, 64, 128, 4, 4, 0}};
    EXPECT_NE(vk::invalid_reason(Kernel::Matmul, deep, big).find("shared memory"),
              std::string::npos);
}

// The ".cm" variants (shaders/matmul_tile_coopmat.glsl): offered for matmul and grouped_matmul
// on a device with a usable NV cooperative matrix only, whole blocks shared evenly by whole
// subgroups, within shared memory; and the module's specialization constants.
TEST(VulkanTuning, CooperativeMatrixVariantsOnlyWhereTheDeviceHasThem) {
    const auto coop = [](const vk::Variant& v) { return v.name(Kernel::Matmul).ends_with(".cm"); };
    vk::DeviceInfo plain = device(1024, 48 * 1024, 0x10DE);
    plain.subgroup_size = 32;
    vk::DeviceInfo nvidia = plain;
    nvidia.coopmat_columns = 16;
    for (Kernel k : every_kernel()) {
        SCOPED_TRACE(vk::kernel_name(k));
        const std::vector<vk::Variant> without = vk::candidates(k, plain);
        EXPECT_EQ(std::count_if(without.begin(), without.end(), coop), 0);
        const std::vector<vk::Variant> with = vk::candidates(k, nvidia);
        const bool forward = k == Kernel::Matmul || k == Kernel::GroupedMatmul;
        EXPECT_EQ(std::count_if(with.begin(), with.end(), coop), forward ? 8 : 0);
        EXPECT_EQ(with.size() - without.size(), forward ? 8u : 0u);
    }
    const vk::Variant v = *vk::parse_variant(Kernel::Matmul, "bm64.bn64.bk32.tm4.tn4.cm");
    EXPECT_EQ(v.spec, (std::vector<uint32_t>{256, 64, 64, 32, 4, 4, vk::kTiledCoopmat}));
    EXPECT_EQ(v.name(Kernel::Matmul), "bm64.bn64.bk32.tm4.tn4.cm");
    EXPECT_EQ(vk::invalid_reason(Kernel::Matmul, v, nvidia), "");
    EXPECT_EQ(vk::invalid_reason(Kernel::GroupedMatmul, v, nvidia), "");
    EXPECT_NE(vk::invalid_reason(Kernel::Matmul, v, plain).find("VK_NV_cooperative_matrix"),
              std::string::npos);
    EXPECT_NE(vk::invalid_reason(Kernel::GroupedMatmulDx, v, nvidia).find("only matmul"),
              std::string::npos);
    // The fp32 form's constants, and the cooperative module's with SGS and CN after them.
    EXPECT_EQ(vk::tiled_spec(v, nvidia, false), (std::vector<uint32_t>{256, 64, 64, 32, 4, 4}));
    EXPECT_EQ(vk::tiled_spec(v, nvidia, true),
              (std::vector<uint32_t>{256, 64, 64, 32, 4, 4, 32, 16}));
    // 16 x 8 blocks: twice as many, still whole.
    vk::DeviceInfo narrow = nvidia;
    narrow.coopmat_columns = 8;
    EXPECT_EQ(vk::invalid_reason(Kernel::Matmul, v, narrow), "");
    // Refusals name what does not fit.
    vk::DeviceInfo odd = nvidia;
    odd.subgroup_size = 24;
    EXPECT_NE(vk::invalid_reason(Kernel::Matmul, v, odd).find("whole subgroups"),
              std::string::npos);
    const vk::Variant few = *vk::parse_variant(Kernel::Matmul, "bm16.bn64.bk16.tm1.tn4.cm");
    EXPECT_NE(vk::invalid_reason(Kernel::Matmul, few, nvidia).find("do not divide"),
              std::string::npos);
    const vk::Variant shallow = *vk::parse_variant(Kernel::Matmul, "bm64.bn64.bk8.tm4.tn4.cm");
    EXPECT_NE(vk::invalid_reason(Kernel::Matmul, shallow, nvidia).find("16 deep"),
              std::string::npos);
    vk::DeviceInfo small = nvidia;
    small.shared_memory_bytes = 32 * 1024;
    const vk::Variant big = *vk::parse_variant(Kernel::Matmul, "bm128.bn128.bk32.tm8.tn8.cm");
    EXPECT_EQ(vk::invalid_reason(Kernel::Matmul, big, nvidia), "");
    EXPECT_NE(vk::invalid_reason(Kernel::Matmul, big, small).find("shared memory"),
              std::string::npos);
}

// The shape the ".cm" variants run on, from the shapes a device lists.
TEST(VulkanTuning, CooperativeMatrixColumnsFromTheDevicesShapes) {
    using S = vk::CoopmatShape;
    constexpr auto f16 = VK_COMPONENT_TYPE_FLOAT16_NV, f32 = VK_COMPONENT_TYPE_FLOAT32_NV;
    const S wide{16, 16, 16, f16, f16, f32, f32, VK_SCOPE_SUBGROUP_NV};
    const S narrow{16, 8, 16, f16, f16, f32, f32, VK_SCOPE_SUBGROUP_NV};
    S half_acc = wide;
    half_acc.c = half_acc.d = f16;
    S workgroup = wide;
    workgroup.scope = VK_SCOPE_WORKGROUP_NV;
    S deep = wide;
    deep.k = 32;
    EXPECT_EQ(vk::coopmat_columns({}), 0u);
    EXPECT_EQ(vk::coopmat_columns({narrow}), 8u);
    EXPECT_EQ(vk::coopmat_columns({narrow, wide}), 16u);
    EXPECT_EQ(vk::coopmat_columns({wide, narrow}), 16u);
    EXPECT_EQ(vk::coopmat_columns({half_acc, workgroup, deep}), 0u);
}

TEST(VulkanTuning, NvidiaIsNotGivenThe128x128TileByDefault) {
    // docs/gpu-results.md (2026-11-23): its 8x8 register block ran 2-11x slower on an H100.
    const vk::TuningTable nvidia(device(1024, 48 * 1024, 0x10DE));
    const vk::TuningTable other(device(1024, 48 * 1024, 0x1002));
    const vk::Variant n = nvidia.default_variant(Kernel::Matmul, 512, 512, 512, 0);
    EXPECT_EQ(n.name(Kernel::Matmul), "bm64.bn64.bk16.tm4.tn4");
    EXPECT_EQ(other.default_variant(Kernel::Matmul, 512, 512, 512, 0).name(Kernel::Matmul),
              "bm128.bn128.bk16.tm8.tn8");
}

// NVIDIA's other defaults are an H200's tune (docs/gpu-results.md, 2026-11-28): the variants
// nearest each family's best over both models' shapes; other vendors keep the general ones.
TEST(VulkanTuning, NvidiaDefaultsAreTheH200TunesNearestToEveryShapesBest) {
    const vk::TuningTable nvidia(device(1024, 48 * 1024, 0x10DE));
    const vk::TuningTable other(device(1024, 48 * 1024, 0x1002));
    const auto name = [](const vk::TuningTable& t, Kernel k, int64_t rows, int64_t n, int64_t depth,
                         uint32_t layout) {
        return t.default_variant(k, rows, n, depth, layout).name(k);
    };
    EXPECT_EQ(name(nvidia, Kernel::AttentionTiled, 512, 64, 256, 8), "wg256.bq16.bk32");
    EXPECT_EQ(name(nvidia, Kernel::MatmulGemv, 1, 32000, 512, 2), "wg128.nr1");
    EXPECT_EQ(name(nvidia, Kernel::GroupedMatmulGemv, 2, 2048, 512, 8), "wg64.nr2");
    EXPECT_EQ(name(other, Kernel::AttentionTiled, 512, 64, 256, 8), "wg64.bq32.bk32.rb4");
    EXPECT_EQ(name(other, Kernel::MatmulGemv, 1, 32000, 512, 2), "wg64.nr4");
    EXPECT_EQ(name(other, Kernel::GroupedMatmulGemv, 2, 2048, 512, 8), "wg64.nr4");
    // A device whose workgroups hold fewer invocations keeps what it can run.
    const vk::TuningTable narrow(device(128, 48 * 1024, 0x10DE));
    EXPECT_EQ(name(narrow, Kernel::AttentionTiled, 512, 64, 256, 8), "wg64.bq32.bk32.rb4");
    EXPECT_EQ(name(narrow, Kernel::MatmulGemv, 1, 32000, 512, 2), "wg128.nr1");
}

// Prefill attention's register-blocked variants (".rb4"): 4 x 4 blocks, so WG = BQ * BK / 16,
// and BK 32 or 64; names read back; their tiles sized for head_dim 128 must fit the device's
// shared memory. The default where they fit (lavapipe: 8x the shared-memory form's speed);
// elsewhere the forms that fit. Their tiles' head_dim: 32, 64 or 128, at least BK.
TEST(VulkanTuning, BlockedAttentionVariantsAreWholeBlocksThatFit) {
    const Kernel k = Kernel::AttentionTiled;
    const vk::DeviceInfo big = device(1024, 48 * 1024), lavapipe = device(1024, 32 * 1024),
                         minimum = device(128, 16 * 1024);
    const std::optional<vk::Variant> v = vk::parse_variant(k, "wg128.bq32.bk64.rb4");
    ASSERT_TRUE(v);
    EXPECT_EQ(v->spec, (std::vector<uint32_t>{128, 32, 64, vk::kAttentionBlocked}));
    EXPECT_EQ(v->name(k), "wg128.bq32.bk64.rb4");
    EXPECT_EQ(vk::invalid_reason(k, *v, big), "");
    for (const char* name : {"wg64.bq32.bk64.rb4", "wg64.bq16.bk16.rb4", "wg24.bq6.bk64.rb4",
                             "wg128.bq16.bk128.rb4"}) {
        const std::optional<vk::Variant> bad = vk::parse_variant(k, name);
        ASSERT_TRUE(bad) << name;
        EXPECT_NE(vk::invalid_reason(k, *bad, big).find("4 x 4 blocks"), std::string::npos) << name;
    }
    EXPECT_FALSE(vk::parse_variant(k, "wg128.bq32.bk64.rb2"));
    // 128 queries x 32 keys needs about 41 KiB.
    const vk::Variant tall = *vk::parse_variant(k, "wg256.bq128.bk32.rb4");
    EXPECT_EQ(vk::invalid_reason(k, tall, big), "");
    EXPECT_NE(vk::invalid_reason(k, tall, lavapipe).find("shared memory"), std::string::npos);

    for (const auto& [d, expected] : {std::pair{big, 7}, {lavapipe, 5}, {minimum, 1}}) {
        const std::vector<vk::Variant> all = vk::candidates(k, d);
        const auto blocked = std::count_if(all.begin(), all.end(), [](const vk::Variant& c) {
            return c.spec[3] == vk::kAttentionBlocked;
        });
        EXPECT_EQ(blocked, expected) << d.shared_memory_bytes << " bytes of shared memory";
        for (const vk::Variant& c : all) EXPECT_EQ(*vk::parse_variant(k, c.name(k)), c);
    }
    EXPECT_EQ(vk::TuningTable(big).default_variant(k, 512, 64, 256, 8).name(k),
              "wg64.bq32.bk32.rb4");
    EXPECT_EQ(vk::TuningTable(minimum).default_variant(k, 512, 64, 256, 8).name(k),
              "wg32.bq8.bk16");

    const vk::Variant narrow = *vk::parse_variant(k, "wg64.bq32.bk32.rb4");
    EXPECT_EQ(vk::blocked_attention_head_dim(narrow, 24), 32u);
    EXPECT_EQ(vk::blocked_attention_head_dim(narrow, 40), 64u);
    EXPECT_EQ(vk::blocked_attention_head_dim(narrow, 128), 128u);
    EXPECT_EQ(vk::blocked_attention_head_dim(*v, 24), 64u);
}

// A tuning file with a ".cm" choice applies on the same device with cooperative matrices off
// (TMX_VULKAN_COOPMAT=0, or the driver refusing them): the choice runs its tile in fp32.
TEST(VulkanTuning, ACooperativeMatrixChoiceRunsInFp32WhereTheyAreOff) {
    vk::DeviceInfo on = device(1024, 48 * 1024, 0x10DE);
    on.subgroup_size = 32;
    on.coopmat_columns = 16;
    vk::DeviceInfo off = on;
    off.coopmat_columns = 0;
    const vk::Variant coop = *vk::parse_variant(Kernel::Matmul, "bm64.bn64.bk32.tm4.tn4.cm");
    const vk::Variant fp32 = *vk::parse_variant(Kernel::Matmul, "bm64.bn64.bk32.tm4.tn4");
    EXPECT_EQ(vk::runnable_form(Kernel::Matmul, coop, on), coop);
    EXPECT_EQ(vk::runnable_form(Kernel::Matmul, coop, off), fp32);
    EXPECT_EQ(vk::runnable_form(Kernel::Matmul, fp32, off), fp32);
    vk::TuningFile f = sample_file(on);
    f.shapes.push_back({vk::shape_key(Kernel::Matmul, 512, 1536, 512, 2), coop, 0.05, 0.11, 24});
    const vk::TuningFile back = vk::parse_tuning_file(vk::tuning_file_json(f), "t.json");
    ASSERT_EQ(back.shapes.back().best, coop);
    for (const vk::DeviceInfo& d : {on, off}) {
        SCOPED_TRACE(d.coopmat_columns ? "cooperative matrices on" : "off");
        EXPECT_NO_THROW(vk::check_tuning_applies(back, d, "t.json"));
        vk::TuningTable table(d);
        table.set_tuned(back, "t.json");
        EXPECT_EQ(table.choose(Kernel::Matmul, 512, 1536, 512, 2), d.coopmat_columns ? coop : fp32);
    }
}

TEST(VulkanTuning, FileRoundTripsAndIsRefusedOnAnotherDeviceDriverOrBuild) {
    const vk::DeviceInfo here = device(1024, 48 * 1024);
    const vk::TuningFile f = sample_file(here);
    const vk::TuningFile back = vk::parse_tuning_file(vk::tuning_file_json(f), "t.json");
    EXPECT_TRUE(back.device == f.device);
    EXPECT_EQ(back.device.name, f.device.name);
    EXPECT_EQ(back.shaders, f.shaders);
    ASSERT_EQ(back.shapes.size(), f.shapes.size());
    for (size_t i = 0; i < f.shapes.size(); ++i) {
        EXPECT_EQ(back.shapes[i].key, f.shapes[i].key);
        EXPECT_EQ(back.shapes[i].best, f.shapes[i].best);
        EXPECT_EQ(back.shapes[i].best_ms, f.shapes[i].best_ms);
        EXPECT_EQ(back.shapes[i].candidates_tried, 16);
    }
    EXPECT_NO_THROW(vk::check_tuning_applies(back, here, "t.json"));

    auto refusal = [&](const vk::DeviceInfo& other, const vk::TuningFile& file) {
        return error_of([&] { vk::check_tuning_applies(file, other, "t.json"); });
    };
    vk::DeviceInfo other_device = here;
    other_device.device_id = 0x9999;
    EXPECT_NE(refusal(other_device, f).find("another device"), std::string::npos);
    vk::DeviceInfo other_name = here;  // lavapipe at another vector width: the same ids
    other_name.name = "llvmpipe (LLVM 15.0.6, 512 bits)";
    EXPECT_NE(refusal(other_name, f).find("another device"), std::string::npos);
    vk::DeviceInfo other_driver = here;
    other_driver.driver_version = 78;
    EXPECT_NE(refusal(other_driver, f).find("another driver"), std::string::npos);
    vk::DeviceInfo other_uuid = here;
    other_uuid.pipeline_cache_uuid[5] ^= 1;
    EXPECT_NE(refusal(other_uuid, f).find("another driver"), std::string::npos);
    vk::TuningFile other_build = f;
    other_build.shaders[0] = other_build.shaders[0] == 'a' ? 'b' : 'a';
    EXPECT_NE(refusal(here, other_build).find("another tmx build"), std::string::npos);
    // A variant the device cannot run (its shared memory is smaller than where it was tuned).
    vk::DeviceInfo smaller = here;
    smaller.max_workgroup_invocations = smaller.max_workgroup_size_x = 64;
    EXPECT_NE(refusal(smaller, f).find("cannot run here"), std::string::npos);
    for (const std::string& m : {refusal(other_device, f), refusal(here, other_build)}) {
        EXPECT_EQ(m.rfind("t.json: ", 0), 0u) << m;
        EXPECT_NE(m.find("tmx tune"), std::string::npos) << m;
    }
}

// The prefill attention variants holding a query's row in registers: named ".sg1" (a name
// without it is the shared-memory form, as tuning files wrote before), offered where the device
// has shuffles and a query's invocations (WG / BQ) divide its subgroup in whole subgroups,
// refused otherwise saying why; never the default; their key and value tiles side by side where
// the shared memory holds both. A tuning file naming one reads back and applies only where it
// can run.
TEST(VulkanTuning, SubgroupAttentionVariantsNeedShufflesAndQueriesWithinASubgroup) {
    const Kernel k = Kernel::AttentionTiled;
    vk::DeviceInfo with = device(1024, 48 * 1024), without = with;
    with.subgroup_shuffle = true;
    with.subgroup_size = 32;
    const std::optional<vk::Variant> plain = vk::parse_variant(k, "wg64.bq16.bk32"),
                                     sg = vk::parse_variant(k, "wg64.bq16.bk32.sg1"),
                                     deep = vk::parse_variant(k, "wg64.bq16.bk64.sg1"),
                                     eight = vk::parse_variant(k, "wg64.bq8.bk32.sg1"),
                                     small = vk::parse_variant(k, "wg32.bq8.bk32.sg1"),
                                     three = vk::parse_variant(k, "wg48.bq16.bk32.sg1");
    ASSERT_TRUE(plain && sg && deep && eight && small && three);
    EXPECT_EQ(plain->spec, (std::vector<uint32_t>{64, 16, 32, 0}));
    EXPECT_EQ(sg->spec, (std::vector<uint32_t>{64, 16, 32, 1}));
    EXPECT_EQ(sg->name(k), "wg64.bq16.bk32.sg1");
    EXPECT_EQ(plain->name(k), "wg64.bq16.bk32");
    for (const char* bad :
         {"wg64.bq16.bk32.sg2", "wg64.bq16.bk32.sg0", "wg64.bq16.bk32.sg", "wg64.bq16.sg1"})
        EXPECT_FALSE(vk::parse_variant(k, bad)) << bad;
    EXPECT_NE(vk::TuningTable(with).default_variant(k, 512, 64, 256, 8).spec[3], 1u);

    const std::vector<vk::Variant> all = vk::candidates(k, with);
    EXPECT_EQ(all.size(), vk::candidates(k, without).size() + 16);
    for (const vk::Variant& v : all) {
        const std::optional<vk::Variant> back = vk::parse_variant(k, v.name(k));
        ASSERT_TRUE(back) << v.name(k);
        EXPECT_EQ(*back, v);
    }
    EXPECT_NE(std::find(all.begin(), all.end(), *sg), all.end());

    const auto reason = [&](const vk::Variant& v, auto change) {
        vk::DeviceInfo d = with;
        change(d);
        return vk::invalid_reason(k, v, d);
    };
    EXPECT_EQ(vk::invalid_reason(k, *sg, with), "");
    EXPECT_NE(vk::invalid_reason(k, *sg, without).find("subgroup shuffles"), std::string::npos);
    EXPECT_EQ(vk::invalid_reason(k, *plain, without), "");
    // 8 invocations per query: not within lavapipe's subgroups of 4; 4 are.
    EXPECT_NE(reason(*eight, [](vk::DeviceInfo& d) { d.subgroup_size = 4; })
                  .find("do not divide a subgroup"),
              std::string::npos);
    EXPECT_EQ(reason(*sg, [](vk::DeviceInfo& d) { d.subgroup_size = 4; }), "");
    EXPECT_NE(vk::invalid_reason(k, *three, with).find("do not divide a subgroup"),
              std::string::npos);
    EXPECT_NE(
        reason(*small, [](vk::DeviceInfo& d) { d.subgroup_size = 64; }).find("not whole subgroups"),
        std::string::npos);
    EXPECT_NE(reason(*sg, [](vk::DeviceInfo& d) { d.subgroup_size = 24; }).find("power of two"),
              std::string::npos);
    EXPECT_NE(reason(*deep, [](vk::DeviceInfo& d) { d.shared_memory_bytes = 16 * 1024; })
                  .find("shared memory"),
              std::string::npos);
    // Side by side: 2 x BK x 128 floats, 32 KiB at BK 32; BK 64 needs 64 KiB for that.
    EXPECT_TRUE(vk::attention_separate_values(*sg, with));
    EXPECT_FALSE(vk::attention_separate_values(*deep, with));
    EXPECT_EQ(vk::invalid_reason(k, *deep, with), "");
    vk::DeviceInfo roomy = with;
    roomy.shared_memory_bytes = 64 * 1024;
    EXPECT_TRUE(vk::attention_separate_values(*deep, roomy));

    vk::TuningFile f = sample_file(with);
    f.shapes.push_back({vk::shape_key(k, 300, 64, 256, 8), *sg, 0.5, 0.75, 32});
    const vk::TuningFile back = vk::parse_tuning_file(vk::tuning_file_json(f), "t.json");
    ASSERT_EQ(back.shapes.size(), f.shapes.size());
    EXPECT_EQ(back.shapes.back().best, *sg);
    EXPECT_NO_THROW(vk::check_tuning_applies(back, with, "t.json"));
    // The same device without shuffles (another driver would say so first).
    const std::string m = error_of([&] { vk::check_tuning_applies(back, without, "t.json"); });
    EXPECT_NE(m.find("wg64.bq16.bk32.sg1 cannot run here"), std::string::npos) << m;
    vk::TuningTable table(with);
    table.set_tuned(back, "t.json");
    EXPECT_EQ(table.choose(k, 300, 64, 256, 8), *sg);
}

TEST(VulkanTuning, CorruptFilesAreRefusedNamingTheField) {
    const vk::DeviceInfo here = device(1024, 48 * 1024);
    const std::string good = vk::tuning_file_json(sample_file(here));
    auto message = [](const std::string& text) {
        return error_of([&] { vk::parse_tuning_file(text, "t.json"); });
    };
    auto replaced = [&](const std::string& from, const std::string& to) {
        std::string s = good;
        const size_t at = s.find(from);
        EXPECT_NE(at, std::string::npos) << from;
        return s.replace(at, from.size(), to);
    };
    // Every cut of the file is refused with a message, never a crash.
    for (size_t cut = 0; cut + 1 < good.size(); cut += 7) {
        const std::string m = message(good.substr(0, cut));
        EXPECT_EQ(m.rfind("t.json", 0), 0u) << "cut at " << cut << ": " << m;
    }
    EXPECT_NE(message(replaced("tmx-vulkan-tuning", "other")).find("'format'"), std::string::npos);
    EXPECT_NE(message(replaced("\"version\": 1", "\"version\": 2")).find("'version'"),
              std::string::npos);
    EXPECT_NE(message(replaced("bm32.bn64.bk16.tm2.tn4", "bm32.bn64")).find("shapes[0].variant"),
              std::string::npos);
    EXPECT_NE(message(replaced("\"kernel\": \"matmul\"", "\"kernel\": \"conv\""))
                  .find("shapes[0].kernel"),
              std::string::npos);
    EXPECT_NE(message(replaced("\"rows_class\": 512", "\"rows_class\": 500"))
                  .find("shapes[0].rows_class"),
              std::string::npos);
    EXPECT_NE(message(replaced("\"pipeline_cache_uuid\": \"", "\"pipeline_cache_uuid\": \"zz"))
                  .find("device.pipeline_cache_uuid"),
              std::string::npos);
    EXPECT_NE(message(replaced("\"n\": 512,", "\"n\": 512, \"n\": 3,")).find("twice"),
              std::string::npos);
}

TEST(VulkanTuning, ACallTakesTheForcedThenTheTunedThenTheNearestTunedThenTheDefaultChoice) {
    const vk::DeviceInfo here = device(1024, 48 * 1024);
    vk::TuningTable table(here);
    const vk::Variant dflt = table.default_variant(Kernel::Matmul, 300, 512, 512, 2);
    EXPECT_EQ(table.choose(Kernel::Matmul, 300, 512, 512, 2), dflt);
    table.set_tuned(sample_file(here), "t.json");
    EXPECT_EQ(table.tuned_shapes(), 3u);
    const vk::Variant tuned = *vk::parse_variant(Kernel::Matmul, "bm32.bn64.bk16.tm2.tn4");
    EXPECT_EQ(table.choose(Kernel::Matmul, 300, 512, 512, 2), tuned);  // rows 257..512
    EXPECT_EQ(table.choose(Kernel::Matmul, 512, 512, 512, 2), tuned);
    EXPECT_EQ(table.choose(Kernel::Matmul, 4000, 512, 512, 2), tuned);  // the nearest class
    // Another layout, depth or kernel: the default.
    EXPECT_EQ(table.choose(Kernel::Matmul, 300, 512, 512, 0),
              table.default_variant(Kernel::Matmul, 300, 512, 512, 0));
    EXPECT_EQ(table.choose(Kernel::Matmul, 300, 512, 256, 2),
              table.default_variant(Kernel::Matmul, 300, 512, 256, 2));
    EXPECT_EQ(table.choose(Kernel::GroupedMatmul, 300, 512, 512, 2),
              table.default_variant(Kernel::GroupedMatmul, 300, 512, 512, 2));
    const vk::Variant forced = *vk::parse_variant(Kernel::Matmul, "bm16.bn64.bk16.tm1.tn4");
    table.force(Kernel::Matmul, forced);
    EXPECT_EQ(table.choose(Kernel::Matmul, 300, 512, 512, 2), forced);
    EXPECT_EQ(table.choose(Kernel::MatmulGemv, 8, 32000, 512, 2).name(Kernel::MatmulGemv),
              "wg128.nr2");
    table.force(Kernel::Matmul, std::nullopt);
    EXPECT_EQ(table.choose(Kernel::Matmul, 300, 512, 512, 2), tuned);
    // A variant this device cannot run is refused by name.
    const std::string m = error_of([&] {
        table.force(Kernel::Matmul, vk::Variant{{1024, 128, 128, 16, 2, 2, 0}});
    });
    EXPECT_NE(m.find("bm128.bn128.bk16.tm2.tn2"), std::string::npos) << m;
}

}  // namespace
}  // namespace tmx::test

#endif  // TMX_HAS_VULKAN

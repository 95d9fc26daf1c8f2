// The published peaks tmx bench takes for MFU when no --peak-tflops is given, matched on the
// names CUDA reports, and the memory bandwidth tmx devices shows (backends/cuda/cuda_peaks.h);
// no GPU needed.
#include "backends/cuda/cuda_peaks.h"

#include <gtest/gtest.h>

namespace tmx::cuda {
namespace {

TEST(CudaSpecPeaks, KnownGpusByTheNamesCudaReports) {
    struct Case {
        const char* name;
        int sms;
        double bf16, fp32;
    };
    const Case cases[] = {
        {"NVIDIA H100 80GB HBM3", 132, 989.4, 66.9},  // SXM5
        {"NVIDIA H100 PCIe", 114, 756.0, 51.2},
        {"NVIDIA H200", 132, 989.4, 66.9},
        {"NVIDIA A100-SXM4-80GB", 108, 312.0, 19.5},
        {"NVIDIA A100 80GB PCIe", 108, 312.0, 19.5},
        {"NVIDIA L4", 58, 121.0, 30.3},
        {"NVIDIA L40S", 142, 362.05, 91.6},
        {"NVIDIA GeForce RTX 4090", 128, 165.2, 82.6},
    };
    for (const Case& c : cases) {
        SCOPED_TRACE(c.name);
        EXPECT_DOUBLE_EQ(spec_peak_tflops(c.name, c.sms, true), c.bf16);
        EXPECT_DOUBLE_EQ(spec_peak_tflops(c.name, c.sms, false), c.fp32);
    }
}

// No number rather than a wrong one: other models, variants with other clocks, and names that
// only contain a known model's letters.
TEST(CudaSpecPeaks, UnknownGpusAndOtherVariantsHaveNone) {
    for (const char* name :
         {"NVIDIA H100 NVL", "NVIDIA H200 NVL", "NVIDIA GH200 480GB", "NVIDIA L40", "NVIDIA A10",
          "NVIDIA A10G", "Tesla T4", "NVIDIA GeForce RTX 4090 Laptop GPU",
          "NVIDIA GeForce RTX 4080", "NVIDIA L4X", ""}) {
        SCOPED_TRACE(name);
        EXPECT_EQ(spec_peak_tflops(name, 58, true), 0.0);
        EXPECT_EQ(spec_peak_tflops(name, 58, false), 0.0);
    }
    // More SMs than the chip of the table (or none reported): not that chip.
    EXPECT_EQ(spec_peak_tflops("NVIDIA L4", 60, true), 0.0);
    EXPECT_EQ(spec_peak_tflops("NVIDIA L4", 0, true), 0.0);
}

// A MIG slice has a share of the SMs, and so of the peak.
TEST(CudaSpecPeaks, AMigSliceGetsItsShareOfThePeak) {
    EXPECT_DOUBLE_EQ(spec_peak_tflops("NVIDIA H100 80GB HBM3 MIG 1g.10gb", 16, true),
                     989.4 * 16 / 132);
    EXPECT_DOUBLE_EQ(spec_peak_tflops("NVIDIA A100-SXM4-40GB MIG 3g.20gb", 42, false),
                     19.5 * 42 / 108);
}

// Theoretical bandwidth from the memory clock and bus width CUDA reports, against datasheets.
TEST(CudaMemoryBandwidth, FromTheClockAndBusWidthCudaReports) {
    EXPECT_NEAR(memory_bandwidth_gbps(2'619'000, 5120), 3352.3, 0.1);  // H100 SXM: 3.35 TB/s
    EXPECT_NEAR(memory_bandwidth_gbps(6'251'000, 192), 300.0, 0.1);    // L4: 300 GB/s
    EXPECT_NEAR(memory_bandwidth_gbps(1'593'000, 5120), 2039.0, 0.1);  // A100 80GB SXM: 2,039 GB/s
    EXPECT_EQ(memory_bandwidth_gbps(0, 5120), 0.0);
    EXPECT_EQ(memory_bandwidth_gbps(2'619'000, 0), 0.0);
}

}  // namespace
}  // namespace tmx::cuda

// Published dense peak TFLOP/s of NVIDIA GPUs (the training step's MFU in `tmx bench` when
// --peak-tflops is not given; `tmx devices`), and a memory's theoretical bandwidth. Header-only
// and free of CUDA, so that the tests check them without a GPU (and in builds without the
// toolkit).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tmx::cuda {

// From NVIDIA's datasheets: bf16 on tensor cores with fp32 accumulation, without sparsity; and
// plain fp32 (CUDA cores, no TF32: tmx's fp32 mode turns TF32 off). `model` is matched against
// the words of the name CUDA reports ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA
// GeForce RTX 4090"); `variant`, when set, must be a word of it too, and names with a word in
// `excluded` (another variant, with other clocks) match nothing.
struct SpecPeak {
    std::string_view model, variant;
    int sm_count;  // of the full chip as sold: a MIG slice or cut-down part has fewer
    double bf16_tflops, fp32_tflops;
};

inline constexpr SpecPeak kSpecPeaks[] = {
    {"H100", "PCIe", 114, 756.0, 51.2}, {"H100", "", 132, 989.4, 66.9},  // SXM5
    {"H200", "", 132, 989.4, 66.9},                                      // SXM
    {"A100", "", 108, 312.0, 19.5},                                      // SXM4 and PCIe alike
    {"L40S", "", 142, 362.05, 91.6},    {"L4", "", 58, 121.0, 30.3},
    {"4090", "RTX", 128, 165.2, 82.6},  // GeForce: fp32 accumulation at half the fp16 rate
};
// Variants whose clocks (so peaks) differ from the rows above: no peak rather than a wrong one.
inline constexpr std::string_view kExcludedVariants[] = {"NVL", "Max-Q", "Laptop", "Mobile"};

// The words of a device name: split at spaces and hyphens.
inline std::vector<std::string_view> name_words(std::string_view name) {
    std::vector<std::string_view> words;
    size_t i = 0;
    while (i < name.size()) {
        const size_t j = name.find_first_of(" -", i);
        const size_t end = j == std::string_view::npos ? name.size() : j;
        if (end > i) words.push_back(name.substr(i, end - i));
        i = end + 1;
    }
    return words;
}

// The published peak of the device named `name` with `sm_count` SMs, for bf16 (true) or fp32
// matmuls, in TFLOP/s; 0 when tmx does not know it. Fewer SMs than the full chip (a MIG slice)
// scale the peak down in proportion.
inline double spec_peak_tflops(std::string_view name, int sm_count, bool bf16) {
    const std::vector<std::string_view> words = name_words(name);
    auto has = [&](std::string_view w) {
        for (std::string_view x : words)
            if (x == w) return true;
        return false;
    };
    for (std::string_view excluded : kExcludedVariants)
        if (has(excluded)) return 0.0;
    for (const SpecPeak& p : kSpecPeaks) {
        if (!has(p.model) || (!p.variant.empty() && !has(p.variant))) continue;
        const double full = bf16 ? p.bf16_tflops : p.fp32_tflops;
        if (sm_count <= 0 || sm_count > p.sm_count) return 0.0;  // not the chip of the table
        return full * sm_count / p.sm_count;
    }
    return 0.0;
}

// A memory's theoretical bandwidth in GB/s from what CUDA reports: its clock in kHz (the data
// moves on both edges, so twice per cycle: DDR, GDDR and HBM alike as CUDA reports them) and
// its bus width in bits; 0 when either is unknown. An H100 SXM (2,619 MHz, 5,120 bits) gives
// 3,352 GB/s, an L4 (6,251 MHz, 192 bits) 300 GB/s, their datasheets' 3.35 TB/s and 300 GB/s.
inline double memory_bandwidth_gbps(int memory_clock_khz, int bus_width_bits) {
    if (memory_clock_khz <= 0 || bus_width_bits <= 0) return 0.0;
    return 2.0 * memory_clock_khz * 1e3 * (bus_width_bits / 8.0) / 1e9;
}

}  // namespace tmx::cuda

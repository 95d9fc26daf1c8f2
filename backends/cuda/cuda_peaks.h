// Published dense peak TFLOP/s of NVIDIA GPUs, for the training step's MFU in `tmx bench`
// when --peak-tflops is not given. Header-only and free of CUDA, so that the tests check the
// matching without a GPU (and in builds without the toolkit).
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
    {"H100", "PCIe", 114, 756.0, 51.2},
    {"H100", "", 132, 989.4, 66.9},  // SXM5
    {"H200", "", 132, 989.4, 66.9},  // SXM
    {"A100", "", 108, 312.0, 19.5},  // SXM4 and PCIe alike
    {"L40S", "", 142, 362.05, 91.6},
    {"L4", "", 58, 121.0, 30.3},
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

}  // namespace tmx::cuda

// What to tell a user whose NVIDIA driver cannot run this build: CUDA's own message ("CUDA
// driver version is insufficient for CUDA runtime version") is also what a machine without any
// NVIDIA driver gets, and what a CUDA 13 build meets on Debian 12's driver (535). Header-only and
// free of CUDA, so that the tests check it without a GPU.
#pragma once

#include <string>

namespace tmx::cuda {

// The oldest Linux driver (its major version) that runs a CUDA major version's runtime, by
// NVIDIA's minor-version compatibility; 0 where tmx does not know it.
inline int minimum_driver_for(int cuda_major) {
    return cuda_major == 12 ? 525 : cuda_major == 13 ? 580 : 0;
}

// Advice after cudaErrorInsufficientDriver. Versions as CUDA gives them (1000 * major + 10 *
// minor): the runtime tmx was built with, and what the installed driver supports (0: no NVIDIA
// driver is loaded).
inline std::string insufficient_driver_advice(int driver_version, int runtime_version) {
    const auto version = [](int v) {
        return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
    };
    const int runtime_major = runtime_version / 1000, driver_major = driver_version / 1000;
    const int needed = minimum_driver_for(runtime_major);
    std::string s = "this tmx was built with CUDA " + version(runtime_version) +
                    ", which needs an NVIDIA driver ";
    s += needed ? std::to_string(needed) + " or newer" : std::string("that supports it");
    if (driver_version <= 0)
        return s +
               "; no NVIDIA driver is loaded on this machine (nvidia-smi lists the GPUs when "
               "one is)";
    s += "; the installed driver supports CUDA " + version(driver_version) + ": update the driver";
    // A toolkit of the driver's major version runs on it (tmx needs CUDA 12.0 or newer).
    if (driver_major >= 12 && driver_major < runtime_major)
        s += ", or build tmx with a CUDA " + std::to_string(driver_major) + ".x toolkit";
    return s + " (docs/gpu-machines.md)";
}

}  // namespace tmx::cuda

// Deterministic random numbers that do not depend on the standard library's implementation:
// splitmix64 for bits, Box-Muller for normals. Used for initialisation and test inputs.
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

namespace tmx {

class Rng {
  public:
    explicit Rng(uint64_t seed) : state_(seed) {}

    uint64_t next_u64() {
        uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    // Uniform in [0, 1) with 53 random bits.
    double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
    double normal() {
        if (has_spare_) {
            has_spare_ = false;
            return spare_;
        }
        double u1 = 0.0;
        while (u1 <= 0.0) u1 = uniform();
        double u2 = uniform();
        double r = std::sqrt(-2.0 * std::log(u1));
        spare_ = r * std::sin(2.0 * M_PI * u2);
        has_spare_ = true;
        return r * std::cos(2.0 * M_PI * u2);
    }
    // Uniform integer in [0, n).
    uint64_t below(uint64_t n) { return n ? next_u64() % n : 0; }

  private:
    uint64_t state_;
    double spare_ = 0.0;
    bool has_spare_ = false;
};

// A seed for a named stream (e.g. one parameter tensor): independent of the order streams
// are drawn in, so adding a tensor does not change the others' values.
inline uint64_t stream_seed(uint64_t seed, std::string_view name) {
    uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
    for (char c : name) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
    Rng mix(seed ^ h);
    return mix.next_u64();
}

}  // namespace tmx

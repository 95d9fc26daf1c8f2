// What tmx bench's op and model timings share: timing on a backend, errors against the CPU,
// transfers, and the matmul precision for a scope. Internal to engine/report/.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "engine/compute/backend.h"
#include "engine/core/rng.h"

namespace tmx::bench_detail {

// Seeded random inputs: the same values on every backend for the same seed.
class InputMaker {
  public:
    explicit InputMaker(uint64_t seed) : rng_(seed) {}
    std::vector<float> normal(int64_t n, double scale = 1.0) {
        std::vector<float> v(static_cast<size_t>(n));
        for (float& x : v) x = static_cast<float>(rng_.normal() * scale);
        return v;
    }
    // n integers in [0, hi).
    std::vector<int32_t> ints(int64_t n, int64_t hi) {
        std::vector<int32_t> v(static_cast<size_t>(n));
        for (int32_t& x : v) x = static_cast<int32_t>(rng_.below(static_cast<uint64_t>(hi)));
        return v;
    }

  private:
    Rng rng_;
};

// Median wall time in seconds of `work` after warm-up; each run ends when the device is done.
double median_seconds(Backend& be, const std::function<void()>& work, int warmup, int repeats,
                      const std::function<void()>& before_each = {});

// Median seconds of one launch of `work`, timed in batches of back-to-back launches that each
// end with one synchronize: the batch grows (at most max_launches) until it lasts about min_ms,
// so that a short op's time is its own rather than mostly the submit and the wait around it.
// After one warm-up launch; `repeats` batches at the grown size give the median.
struct LaunchTime {
    double seconds = 0;
    int launches = 1;  // per timed batch
};
LaunchTime median_launch_seconds(Backend& be, const std::function<void()>& work, double min_ms,
                                 int repeats, int max_launches = 1024);

// Keeps `be` busy with fp32 matrix products for about `seconds` (in growing batches, each
// ended by a synchronize), so that a GPU's clocks are up when timing starts.
void warm_up(Backend& be, double seconds);

// The largest difference between got and want, over want's largest magnitude (at least 1); a
// NaN counts as infinite.
double max_error(const std::vector<float>& got, const std::vector<float>& want);

std::vector<float> download(Backend& be, const Tensor& t);
Tensor upload(Backend& be, const std::vector<float>& host, Shape shape);
// A matmul operand as the model holds it in the backend's precision: BF16 in bf16 (the model's
// bf16 weight copy and the activations only matmuls read), F32 otherwise.
Tensor upload_operand(Backend& be, const std::vector<float>& host, Shape shape);
Tensor upload_ids(Backend& be, const std::vector<int32_t>& host, Shape shape);

// "512x8x64".
std::string dims(std::initializer_list<int64_t> d);

}  // namespace tmx::bench_detail

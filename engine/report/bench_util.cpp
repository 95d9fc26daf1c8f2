#include "engine/report/bench_util.h"

#include <algorithm>
#include <chrono>
#include <cmath>

namespace tmx::bench_detail {

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

double median_seconds(Backend& be, const std::function<void()>& work, int warmup, int repeats,
                      const std::function<void()>& before_each) {
    for (int i = 0; i < warmup; ++i) {
        if (before_each) before_each();
        work();
        be.synchronize();
    }
    std::vector<double> times;
    for (int i = 0; i < std::max(1, repeats); ++i) {
        if (before_each) before_each();
        be.synchronize();
        const auto t0 = Clock::now();
        work();
        be.synchronize();
        times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    return median(times);
}

LaunchTime median_launch_seconds(Backend& be, const std::function<void()>& work, double min_ms,
                                 int repeats, int max_launches) {
    auto batch_ms = [&](int n) {
        be.synchronize();
        const auto t0 = Clock::now();
        for (int i = 0; i < n; ++i) work();
        be.synchronize();
        return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    };
    batch_ms(1);  // warm-up: pipelines created, weight copies made
    LaunchTime t;
    double ms = batch_ms(t.launches);
    while (ms < min_ms && t.launches < max_launches) {
        const double grown = t.launches * min_ms / std::max(ms, 1e-3);
        t.launches = std::min(max_launches, std::max(t.launches * 2, static_cast<int>(grown)));
        ms = batch_ms(t.launches);
    }
    std::vector<double> per_launch{ms / t.launches};
    for (int r = 1; r < repeats; ++r) per_launch.push_back(batch_ms(t.launches) / t.launches);
    t.seconds = median(per_launch) * 1e-3;
    return t;
}

void warm_up(Backend& be, double seconds) {
    if (!(seconds > 0)) return;
    constexpr int64_t n = 1024;
    InputMaker in(0x3a7);
    const Tensor a = upload(be, in.normal(n * n), {n, n}), b = upload(be, in.normal(n * n), {n, n}),
                 out = be.alloc({n, n});
    Backend::ModeScope fp32(be, {.precision = Precision::F32});
    const auto t0 = Clock::now();
    // Batches that double up to 64 products: a slow device still stops near `seconds`, a fast
    // one is not held back by a synchronize after every product.
    for (int batch = 1; std::chrono::duration<double>(Clock::now() - t0).count() < seconds;
         batch = std::min(batch * 2, 64)) {
        for (int i = 0; i < batch; ++i) be.matmul(a, b, out);
        be.synchronize();
    }
}

double max_error(const std::vector<float>& got, const std::vector<float>& want) {
    double scale = 1.0, worst = 0.0;
    for (float w : want) scale = std::max(scale, std::abs(double(w)));
    for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
        const double d = std::abs(double(got[i]) - double(want[i]));
        worst = std::max(worst, std::isnan(d) ? INFINITY : d);
    }
    return worst / scale;
}

std::vector<float> download(Backend& be, const Tensor& t) {
    std::vector<float> host(static_cast<size_t>(t.numel()));
    be.download(t, host.data());
    return host;
}

Tensor upload(Backend& be, const std::vector<float>& host, Shape shape) {
    Tensor t = be.alloc(std::move(shape));
    be.upload(t, host.data());
    return t;
}

Tensor upload_operand(Backend& be, const std::vector<float>& host, Shape shape) {
    Tensor t = upload(be, host, std::move(shape));
    if (be.matmul_precision() != Precision::BF16) return t;
    Tensor bf16 = be.alloc(t.shape(), DType::BF16);
    be.convert(t, bf16);
    return bf16;
}

Tensor upload_ids(Backend& be, const std::vector<int32_t>& host, Shape shape) {
    Tensor t = be.alloc(std::move(shape), DType::I32);
    be.upload(t, host.data());
    return t;
}

std::string dims(std::initializer_list<int64_t> d) {
    std::string s;
    for (int64_t x : d) {
        if (!s.empty()) s += 'x';
        s += std::to_string(x);
    }
    return s;
}

}  // namespace tmx::bench_detail

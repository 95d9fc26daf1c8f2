// Vulkan optimizer support: the gradient's sum of squares (shaders/sum_squares.comp: two
// passes in compensated fp32, the same bits on every run), scale and AdamW
// (shaders/optimizer.comp).
#include <algorithm>
#include <cmath>

#include "backends/vulkan/vulkan_backend.h"

namespace tmx {
namespace {

// sum_squares.comp's first pass: at most this many workgroups, so the second pass (one
// workgroup) has few partials to add.
constexpr uint64_t kSumSquaresMaxGroups = 1024;

// optimizer.comp's operations and push constants after the binding offsets.
enum OptimizerOp : uint32_t { kScale = 0, kAdamW = 1 };
struct OptimizerPush {
    uint32_t n;
    float s;
    float keep, beta1, one_minus_beta1, beta2, one_minus_beta2, step_size, bc2_sqrt, eps;
    float grad_scale;
};

}  // namespace

void VulkanBackend::sum_squares_impl(const Tensor& x, const Tensor& out_t) {
    const uint64_t n = static_cast<uint64_t>(x.numel()), wg = tuning_.elementwise_wg;
    const uint64_t groups = std::clamp<uint64_t>((n + wg - 1) / wg, 1, kSumSquaresMaxGroups);
    const Tensor partials = alloc({static_cast<int64_t>(2 * groups)});
    struct {
        uint32_t n, groups;
    } p{static_cast<uint32_t>(n), static_cast<uint32_t>(groups)};
    const auto bindings = {in(x), inout(partials), out(out_t)};
    run("sum_squares", {tuning_.elementwise_wg, 0}, bindings, p, static_cast<uint32_t>(groups));
    run("sum_squares", {tuning_.elementwise_wg, 1}, bindings, p, 1);
}

void VulkanBackend::scale_impl(const Tensor& x, float s) {
    const uint64_t n = static_cast<uint64_t>(x.numel());
    if (n == 0) return;
    OptimizerPush p{};
    p.n = static_cast<uint32_t>(n);
    p.s = s;
    auto [gx, gy] = grid(n, tuning_.elementwise_wg);
    run("optimizer", {tuning_.elementwise_wg, kScale}, {inout(x), in(x), in(x), in(x)}, p, gx, gy);
}

void VulkanBackend::adamw_impl(const Tensor& params, const Tensor& grads, const Tensor& m,
                               const Tensor& v, const AdamWParams& hp) {
    const uint64_t n = static_cast<uint64_t>(params.numel());
    if (n == 0) return;
    // The bias corrections in double, rounded once, as the CPU backend computes them.
    const double bc1 = 1.0 - std::pow(static_cast<double>(hp.beta1), static_cast<double>(hp.step));
    const double bc2 = 1.0 - std::pow(static_cast<double>(hp.beta2), static_cast<double>(hp.step));
    const OptimizerPush p{static_cast<uint32_t>(n),
                          1.0f,
                          1.0f - hp.lr * hp.weight_decay,
                          hp.beta1,
                          1.0f - hp.beta1,
                          hp.beta2,
                          1.0f - hp.beta2,
                          static_cast<float>(hp.lr / bc1),
                          static_cast<float>(std::sqrt(bc2)),
                          hp.eps,
                          hp.grad_scale};
    auto [gx, gy] = grid(n, tuning_.elementwise_wg);
    run("optimizer", {tuning_.elementwise_wg, kAdamW},
        {inout(params), in(grads), inout(m), inout(v)}, p, gx, gy);
}

}  // namespace tmx

// Vulkan layernorm and rmsnorm: one workgroup per row (shaders/norm.comp); the backward in a
// pass over rows (d_x, and each row's statistics) and one over columns (d_weight, d_bias;
// shaders/norm_backward.comp). norm_linear at decoding's few rows: the norm as a prologue of the
// linear's matrix-vector product, in its dispatch (shaders/matmul_gemv.comp).
#include "backends/vulkan/vulkan_backend.h"

namespace tmx {
namespace {

// norm.comp's and norm_backward.comp's push constants after the binding offsets.
struct NormPush {
    uint32_t N, d;
    float eps;
    uint32_t layernorm;
};
NormPush norm_push(NormType type, int64_t N, int64_t d, float eps) {
    return {static_cast<uint32_t>(N), static_cast<uint32_t>(d), eps,
            type == NormType::LayerNorm ? 1u : 0u};
}

}  // namespace

void VulkanBackend::norm_impl(NormType type, const Tensor& x, const Tensor& weight,
                              const Tensor& bias, float eps, const Tensor& out_t) {
    const int64_t N = x.dim(0), d = x.dim(1);
    if (N == 0 || d == 0) return;
    const NormPush p = norm_push(type, N, d, eps);
    auto [gx, gy] = grid(static_cast<uint64_t>(N), 1);
    run("norm", {tuning_.row_wg}, {in(x), in(weight), in(bias), out(out_t)}, p, gx, gy);
}

void VulkanBackend::norm_linear_impl(NormType type, const Tensor& x, const Tensor& norm_weight,
                                     const Tensor& norm_bias, float eps, const Tensor& normed,
                                     const Tensor& w, const Tensor& b, const Tensor& y) {
    // A decode step is bound by its number of commands: where the linear is a matrix-vector
    // product, each of its workgroups normalizes the few rows it reads (the statistics cost a
    // pass over them), which saves the norm's dispatch and the barrier after it. Many rows (the
    // tiled product), an empty operand, or so many output columns that the workgroups'
    // repeated statistics may cost more than that dispatch (the classifier's 32,000 columns
    // are 8,000 workgroups each computing them; unmeasured on a GPU): the sequence.
    constexpr int64_t kPrologueMaxColumns = 4096;
    const int64_t N = x.dim(0), d = x.dim(1);
    if (N == 0 || d == 0 || y.dim(1) == 0 || y.dim(1) > kPrologueMaxColumns || !dense_gemv(N)) {
        Backend::norm_linear_impl(type, x, norm_weight, norm_bias, eps, normed, w, b, y);
        return;
    }
    const NormPrologue norm{type, norm_weight, norm_bias, eps, normed};
    dense_matmul(x, w, y, {.trans_b = true}, b, /*b_is_weight=*/true, &norm);
}

void VulkanBackend::norm_backward_impl(NormType type, const Tensor& x, const Tensor& weight,
                                       const Tensor& d_out, float eps, const Tensor& d_x,
                                       const Tensor& d_weight, const Tensor& d_bias) {
    const int64_t N = x.dim(0), d = x.dim(1);
    if (N == 0 || d == 0) return;
    const Tensor stats = alloc({N, 2});  // each row's mean and rstd, from pass 0 to pass 1
    const NormPush p = norm_push(type, N, d, eps);
    const auto bindings = {in(x),           in(weight),    in(d_out),   inout(d_x),
                           inout(d_weight), inout(d_bias), inout(stats)};
    auto [rx, ry] = grid(static_cast<uint64_t>(N), 1);
    run("norm_backward", {tuning_.row_wg, 0}, bindings, p, rx, ry);
    auto [cx, cy] = grid(static_cast<uint64_t>(d), tuning_.column_wg);
    run("norm_backward", {tuning_.column_wg, 1}, bindings, p, cx, cy);
}

}  // namespace tmx

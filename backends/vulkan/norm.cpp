// Vulkan layernorm and rmsnorm: one workgroup per row (shaders/norm.comp); the backward in a
// pass over rows (d_x, and each row's statistics) and one over columns (d_weight, d_bias;
// shaders/norm_backward.comp). norm_linear at decoding's few rows: the norm as a prologue of the
// linear's matrix-vector product, in its dispatch (shaders/matmul_gemv.comp).
#include <algorithm>

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
    // pass over them), which saves the norm's dispatch and the barrier after it. More rows than
    // Tuning::norm_prologue_max_rows (the repeated statistics cost more than the dispatch), an
    // empty operand, or so many output columns that the workgroups' repeated statistics may
    // cost more than that dispatch (the classifier's 32,000 columns are 8,000 workgroups each
    // computing them; unmeasured on a GPU): the sequence.
    constexpr int64_t kPrologueMaxColumns = 4096;
    const int64_t N = x.dim(0), d = x.dim(1);
    if (N == 0 || d == 0 || y.dim(1) == 0 || y.dim(1) > kPrologueMaxColumns ||
        N > tuning_.norm_prologue_max_rows || !dense_gemv(N)) {
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
    // The column sums in chunks of rows (norm_backward.comp), at least 256 rows each and at most
    // 65,535 chunks (a dispatch's y): a training step's rows spread over chunks x d / WG
    // workgroups, where one pass over all rows would run d / WG of them.
    const int64_t chunk_rows = std::max<int64_t>(256, (N + 65534) / 65535);
    const int64_t chunks = (N + chunk_rows - 1) / chunk_rows;
    // Each row's mean and rstd, from pass 0 to pass 1; then each chunk's partial sums.
    const Tensor stats = alloc({N * 2 + (chunks > 1 ? chunks * 2 * d : 0)});
    const struct {
        NormPush norm;
        uint32_t chunk_rows, chunks;
    } p{norm_push(type, N, d, eps), static_cast<uint32_t>(chunk_rows),
        static_cast<uint32_t>(chunks)};
    const auto bindings = {in(x),           in(weight),    in(d_out),   inout(d_x),
                           inout(d_weight), inout(d_bias), inout(stats)};
    auto [rx, ry] = grid(static_cast<uint64_t>(N), 1);
    run("norm_backward", {tuning_.row_wg, 0}, bindings, p, rx, ry);
    const auto column_blocks =
        static_cast<uint32_t>((d + tuning_.column_wg - 1) / tuning_.column_wg);
    run("norm_backward", {tuning_.column_wg, 1}, bindings, p, column_blocks,
        static_cast<uint32_t>(chunks));
    if (chunks == 1) return;
    auto [fx, fy] = grid(static_cast<uint64_t>(d), tuning_.column_wg);
    run("norm_backward", {tuning_.column_wg, 2}, bindings, p, fx, fy);
}

}  // namespace tmx

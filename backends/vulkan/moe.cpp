// Vulkan mixture-of-experts ops: router top-k with gates, grouping slots by expert on the
// device (and both with the gather of the tokens' rows, as one dispatch at decoding's few
// rows), combining expert outputs, and the load-balancing loss.
#include "backends/vulkan/vulkan_backend.h"
#include "engine/core/errors.h"

namespace tmx {
namespace {

constexpr int64_t kMaxExperts = 1024;  // moe_group.comp, router_aux_loss.comp, router_backward
// router_backward.comp's rows (one per invocation) per workgroup.
constexpr uint32_t kRouterRowWg = 64;
// moe_route.comp, one workgroup for the whole routing: a row per invocation for the top-k (so
// at most one row per invocation of the smallest group_wg, 128: no row waits for another),
// and its shared arrays' slots (MAX_SLOTS). Decoding's batches are far below both.
constexpr int64_t kRouteMaxRows = 64, kRouteMaxSlots = 512;

void check_experts(const char* op, int64_t E) {
    if (E > kMaxExperts)
        throw Error(std::string(op) + ": " + std::to_string(E) +
                    " experts is more than the Vulkan backend supports (" +
                    std::to_string(kMaxExperts) + ")");
}

}  // namespace

void VulkanBackend::router_topk_impl(const Tensor& logits, const Tensor& indices,
                                     const Tensor& gates) {
    const int64_t N = logits.dim(0);
    struct {
        uint32_t N, E, k;
    } p{static_cast<uint32_t>(N), static_cast<uint32_t>(logits.dim(1)),
        static_cast<uint32_t>(indices.dim(1))};
    auto [gx, gy] = grid(static_cast<uint64_t>(N), 64);
    run("router_topk", {64}, {in(logits), out(indices), out(gates)}, p, gx, gy);
}

void VulkanBackend::moe_group_impl(const Tensor& indices, int64_t n_experts, const Tensor& offsets,
                                   const Tensor& slot_rows, const Tensor& slot_of) {
    check_experts("moe_group", n_experts);
    struct {
        uint32_t S, k, E;
    } p{static_cast<uint32_t>(indices.numel()), static_cast<uint32_t>(indices.dim(1)),
        static_cast<uint32_t>(n_experts)};
    run("moe_group", {tuning_.group_wg},
        {in(indices), out(offsets), out(slot_rows), out(slot_of), stream_->status_binding()}, p, 1);
}

void VulkanBackend::moe_route_impl(const Tensor& logits, const Tensor& x, const Tensor& indices,
                                   const Tensor& gates, const Tensor& offsets,
                                   const Tensor& slot_rows, const Tensor& slot_of,
                                   const Tensor& xs) {
    const int64_t N = logits.dim(0), E = logits.dim(1), k = indices.dim(1);
    // Beyond these, the sequence: router_topk's rows in parallel, moe_group's error for too
    // many experts, gather_rows' reading of x in other formats.
    if (N > kRouteMaxRows || N * k > kRouteMaxSlots || E > kMaxExperts || x.dtype() != DType::F32) {
        Backend::moe_route_impl(logits, x, indices, gates, offsets, slot_rows, slot_of, xs);
        return;
    }
    struct {
        uint32_t N, E, k, d;
    } p{static_cast<uint32_t>(N), static_cast<uint32_t>(E), static_cast<uint32_t>(k),
        static_cast<uint32_t>(x.dim(1))};
    run("moe_route", {tuning_.group_wg},
        {in(logits), in(x), out(indices), out(gates), out(offsets), out(slot_rows), out(slot_of),
         out(xs)},
        p, 1);
}

void VulkanBackend::moe_combine_impl(const Tensor& expert_out, const Tensor& slot_of,
                                     const Tensor& gates, const Tensor& out_t) {
    const int64_t N = gates.dim(0), d = out_t.dim(1);
    struct {
        uint32_t N, k, d;
    } p{static_cast<uint32_t>(N), static_cast<uint32_t>(gates.dim(1)), static_cast<uint32_t>(d)};
    auto [gx, gy] = grid(static_cast<uint64_t>(N * d), tuning_.elementwise_wg);
    run("moe_combine", {tuning_.elementwise_wg},
        {in(expert_out), in(slot_of), in(gates), inout(out_t), stream_->status_binding()}, p, gx,
        gy);
}

void VulkanBackend::moe_combine_backward_impl(const Tensor& expert_out, const Tensor& slot_of,
                                              const Tensor& gates, const Tensor& d_out,
                                              const Tensor& d_expert_out, const Tensor& d_gates) {
    const int64_t N = gates.dim(0), k = gates.dim(1), d = d_out.dim(1);
    if (N * k == 0) return;
    // A workgroup per (token, choice): d_expert_out's row of that slot, and a fixed-tree dot
    // product for its gate (moe_combine_backward.comp).
    struct {
        uint32_t N, k, d;
    } p{static_cast<uint32_t>(N), static_cast<uint32_t>(k), static_cast<uint32_t>(d)};
    auto [gx, gy] = grid(static_cast<uint64_t>(N * k), 1);
    run("moe_combine_backward", {tuning_.row_wg},
        {in(expert_out), in(slot_of), in(gates), in(d_out), inout(d_expert_out), inout(d_gates),
         stream_->status_binding()},
        p, gx, gy);
}

void VulkanBackend::router_aux_loss_impl(const Tensor& logits, const Tensor& indices,
                                         const Tensor& out_t) {
    check_experts("router_aux_loss", logits.dim(1));
    struct {
        uint32_t N, E, k;
    } p{static_cast<uint32_t>(logits.dim(0)), static_cast<uint32_t>(logits.dim(1)),
        static_cast<uint32_t>(indices.dim(1))};
    run("router_aux_loss", {tuning_.group_wg},
        {in(logits), in(indices), out(out_t), stream_->status_binding()}, p, 1);
}

void VulkanBackend::router_backward_impl(const Tensor& logits, const Tensor& indices,
                                         const Tensor& gates, const Tensor& d_gates,
                                         float aux_weight, const Tensor& d_logits) {
    const int64_t N = logits.dim(0), E = logits.dim(1), k = indices.dim(1);
    if (N == 0 || E == 0) return;
    const bool aux = aux_weight != 0.0f;  // as the CPU: any non-zero weight
    if (aux) check_experts("router_backward", E);
    struct {
        uint32_t N, E, k, has_aux;
        float aux_weight;
        uint32_t phase;
    } p{static_cast<uint32_t>(N),
        static_cast<uint32_t>(E),
        static_cast<uint32_t>(k),
        aux ? 1u : 0u,
        aux_weight,
        0};
    // Phase 0: the aux loss's gradient per mean probability, from the counts over all tokens
    // (one workgroup); phase 1: a row per invocation (router_backward.comp).
    Tensor dprob = aux ? alloc({E}) : Tensor{};
    if (aux)
        run("router_backward", {tuning_.group_wg},
            {in(Tensor{}), in(indices), in(Tensor{}), in(Tensor{}), out(dprob), in(Tensor{}),
             stream_->status_binding()},
            p, 1);
    p.phase = 1;
    auto [gx, gy] = grid(static_cast<uint64_t>(N), kRouterRowWg);
    run("router_backward", {kRouterRowWg},
        {in(logits), in(indices), in(gates), in(d_gates), in(dprob), inout(d_logits),
         stream_->status_binding()},
        p, gx, gy);
}

}  // namespace tmx

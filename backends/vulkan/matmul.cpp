// Vulkan matmuls: dense (tiled, or matrix-vector for decode-sized M; linear() reads its weight
// as stored, or an f32 one from its fp16 copy when fp16 weights are on; matmul() reads fp32)
// and grouped over experts (tiled, or matrix-vector for few slots), with expert ranges read on
// the device.
#include <algorithm>
#include <string_view>
#include <vector>

#include "backends/vulkan/vulkan_activations.h"
#include "backends/vulkan/vulkan_backend.h"
#include "engine/core/errors.h"

namespace tmx {
namespace {

// Rows of a (dense) or slots (grouped) up to which the matrix-vector shaders are used: they spread
// each dot product over a workgroup and read each weight once per 4 rows (one expert's 4 slots),
// where a skinny tile would mostly hold padding and loop over K serially (an 8 x 512 x 512
// projection is 8 such tiles). The grouped one goes to 32 slots (decoding up to 16 sequences at
// top-2), as CUDA's does.
constexpr int64_t kGemvMaxRows = 16;      // a batch's decode step
constexpr int64_t kGemvRowsPerGroup = 4;  // matmul_gemv.comp's MMAX, grouped_matmul_gemv's MS
constexpr int64_t kGroupedGemvMaxSlots = 32;
// column_sums.comp: rows per chunk, at least (each chunk's sum is one invocation's series).
constexpr int64_t kColumnChunkRows = 256;

uint32_t ceil_div(int64_t a, int64_t b) {
    return static_cast<uint32_t>((a + b - 1) / b);
}

// A tiled product of few tiles and a long k (a weight's gradient over a training step's tokens:
// 512 x 512 from 16,384 rows is 64 tiles of 64 x 64, each walking all 16,384) is split along k
// into up to kMaxSplits parts of at least kMinSplitDepth each, so that about kSplitTargetTiles
// workgroups run, then summed in split order (matmul_split_sum.comp). Returns k per split, a
// multiple of the tile's depth bk, or 0 for no split.
constexpr int64_t kSplitTargetTiles = 256, kMinSplitDepth = 512, kMaxSplits = 64;
int64_t split_depth(int64_t tiles, int64_t K, int64_t bk) {
    if (tiles * 2 > kSplitTargetTiles || K < 2 * kMinSplitDepth) return 0;
    const int64_t splits =
        std::min({int64_t{ceil_div(kSplitTargetTiles, tiles)}, K / kMinSplitDepth, kMaxSplits});
    if (splits < 2) return 0;
    const int64_t depth = (ceil_div(K, splits) + bk - 1) / bk * bk;
    return depth < K ? depth : 0;
}

// A matrix-vector variant {WG, NR, SG} (vk::Variant) as run: SG 1 picks the module that sums
// through subgroups, "<family>_sg" before the weight format's suffix; WG and NR are its
// specialization constants.
std::vector<uint32_t> gemv_module(const vk::Variant& v, std::string_view family,
                                  std::string& shader) {
    if (v.spec[2] == 1) shader.insert(family.size(), "_sg");
    return {v.spec[0], v.spec[1]};
}

// A tiled variant {WG, BM, BN, BK, TM, TN, FORM} as run: FORM 1 (".cm") picks the
// cooperative-matrix module, "<family>_cm" before the weight format's suffix, where the call
// reads fp16 weights (its module is built for those only); any other call runs the variant's tile
// in the fp32 form. Returns the module's specialization constants.
std::vector<uint32_t> tiled_module(const vk::Variant& v, const vk::DeviceInfo& d,
                                   std::string_view family, std::string& shader) {
    const bool coop =
        v.spec[6] == vk::kTiledCoopmat && d.coopmat_columns != 0 && shader.ends_with("_f16w");
    if (coop) shader.insert(family.size(), "_cm");
    return vk::tiled_spec(v, d, coop);
}

}  // namespace

VulkanBackend::WeightBinding VulkanBackend::stored_weight(const Tensor& w,
                                                          std::string& shader) const {
    switch (w.dtype()) {
        case DType::F32:
            return {in(w)};
        case DType::F16:
            shader += "_f16w";
            break;
        case DType::BF16:
            shader += "_bf16w";
            break;
        case DType::Q8_0:
            shader += "_q8_0w";
            break;
        default:
            throw std::logic_error(std::string("Vulkan: no shader reads ") + to_string(w.dtype()) +
                                   " weights");
    }
    const vk::Binding b = in(w);
    return {b, static_cast<uint32_t>(b.range.offset % 4), true};
}

VulkanBackend::WeightBinding VulkanBackend::weight(const Tensor& w, std::string& shader) {
    if (!fp16_weights() || w.dtype() != DType::F32) return stored_weight(w, shader);
    shader += "_f16w";
    if (w.numel() == 0) return {in(w), 0, true};  // nothing is read
    const vk::Fp16Weights::Copy copy = fp16_->get(range(w), static_cast<size_t>(w.numel()));
    if (copy.fresh) {
        const uint64_t words = static_cast<uint64_t>(w.numel() + 1) / 2;
        struct {
            uint32_t n;
        } push{static_cast<uint32_t>(w.numel())};
        auto [gx, gy] = grid(words, tuning_.elementwise_wg);
        run("to_fp16", {tuning_.elementwise_wg}, {in(w), {copy.range, true}}, push, gx, gy);
    }
    return {{copy.range, false}, 0, true};
}

void VulkanBackend::matmul_impl(const Tensor& a, const Tensor& b, const Tensor& out_t,
                                MatmulOptions opts, const Tensor& bias) {
    dense_matmul(a, b, out_t, opts, bias, /*b_is_weight=*/false);
}

void VulkanBackend::linear_impl(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y,
                                bool accumulate) {
    dense_matmul(x, w, y, {.trans_b = true, .accumulate = accumulate}, b, /*b_is_weight=*/true);
}

bool VulkanBackend::dense_gemv(int64_t M) {
    return M <= kGemvMaxRows;
}

void VulkanBackend::dense_matmul(const Tensor& a, const Tensor& b, const Tensor& out_t,
                                 MatmulOptions opts, const Tensor& bias, bool b_is_weight,
                                 const NormPrologue* norm) {
    const int64_t M = out_t.dim(0), N = out_t.dim(1);
    const int64_t K = opts.trans_a ? a.dim(0) : a.dim(1);
    if (norm && (!dense_gemv(M) || opts.trans_a || !opts.trans_b))
        throw std::logic_error("Vulkan: a norm prologue needs a matrix-vector product in dot mode");
    if (M == 0 || N == 0) return;
    const bool gemv = dense_gemv(M);
    std::string shader = gemv ? "matmul_gemv" : "matmul";
    // A linear layer's weight is the one operand that may be in another format than fp32.
    const WeightBinding b_read = b_is_weight ? weight(b, shader) : WeightBinding{in(b)};
    const vk::Binding o = opts.accumulate ? inout(out_t) : out(out_t);
    struct {
        uint32_t M, N, K, a_sm, a_sk, b_sk, b_sn, has_bias, accumulate, b_adjust;
    } p{static_cast<uint32_t>(M),
        static_cast<uint32_t>(N),
        static_cast<uint32_t>(K),
        static_cast<uint32_t>(opts.trans_a ? 1 : K),
        static_cast<uint32_t>(opts.trans_a ? M : 1),
        static_cast<uint32_t>(opts.trans_b ? 1 : N),
        static_cast<uint32_t>(opts.trans_b ? K : 1),
        bias.defined() ? 1u : 0u,
        opts.accumulate ? 1u : 0u,
        b_read.byte_adjust};
    const TunableCall call{.op = b_is_weight ? TunableCall::Op::Linear : TunableCall::Op::Matmul,
                           .rows = M,
                           .n = N,
                           .k = K,
                           .trans_a = opts.trans_a,
                           .trans_b = opts.trans_b,
                           .weight = b.dtype(),
                           .reduced_weights = b_read.reduced};

    if (gemv) {
        // The norm prologue's operands follow; without one, dummies, and `out` again in
        // normed's place: the shader declares it written, and a validation layer counts a
        // writable binding as written (a dummy there would then race with its other readers).
        const Tensor none;
        const uint32_t norm_mode = !norm ? 0u : norm->type == NormType::RmsNorm ? 1u : 2u;
        struct {
            decltype(p) base;
            uint32_t dot_mode;
            float eps;
        } pg{p, opts.trans_b ? 1u : 0u, norm ? norm->eps : 0.0f};
        const vk::Variant v = choose(vk::Kernel::MatmulGemv, call);
        std::vector<uint32_t> spec = gemv_module(v, "matmul_gemv", shader);
        spec.push_back(norm_mode);  // matmul_gemv.comp's NORM
        const uint32_t wg = spec[0], rows = spec[1];
        const uint64_t groups = opts.trans_b ? ceil_div(N, rows) : ceil_div(N, wg);
        auto [gx, gy] = grid(groups, 1);
        run(shader, spec,
            {in(a), b_read.binding, in(bias), o, in(norm ? norm->weight : none),
             in(norm ? norm->bias : none), norm ? out(norm->normed) : o},
            pg, gx, gy, ceil_div(M, kGemvRowsPerGroup));
        return;
    }
    const vk::Variant t = choose(vk::Kernel::Matmul, call);
    const std::vector<uint32_t> spec = tiled_module(t, ctx_->info(), "matmul", shader);
    const uint32_t gx = ceil_div(N, t.spec[2]), gy = ceil_div(M, t.spec[1]);
    const int64_t depth = split_depth(int64_t{gx} * gy, K, t.spec[3]);
    struct {
        decltype(p) base;
        uint32_t k_split;
    } pt{p, static_cast<uint32_t>(depth)};
    if (depth == 0) {
        run(shader, spec, {in(a), b_read.binding, in(bias), o}, pt, gx, gy);
        return;
    }
    const int64_t splits = (K + depth - 1) / depth;
    const Tensor partials = alloc({splits * M * N});
    pt.base.has_bias = pt.base.accumulate = 0;
    run(shader, spec, {in(a), b_read.binding, in(bias), out(partials)}, pt, gx, gy,
        static_cast<uint32_t>(splits));
    struct {
        uint32_t M, N, splits, has_bias, accumulate;
    } ps{p.M, p.N, static_cast<uint32_t>(splits), p.has_bias, p.accumulate};
    auto [sx, sy] = grid(static_cast<uint64_t>(M * N), tuning_.elementwise_wg);
    run("matmul_split_sum", {tuning_.elementwise_wg}, {in(partials), in(bias), o}, ps, sx, sy);
}

void VulkanBackend::column_sums(const Tensor& x, const Tensor& offsets, int64_t ranges,
                                const Tensor& out) {
    const int64_t rows = x.dim(0), N = x.dim(1);
    if (rows == 0 || N == 0 || ranges == 0) return;
    // Chunks of at least kColumnChunkRows rows, and at most 65,535 of them in all (a
    // dispatch's y): the ranges' chunks number at most rows / chunk_rows + ranges.
    constexpr int64_t kMaxGroups = 65535;
    if (ranges >= kMaxGroups)
        throw Error("column sums over " + std::to_string(ranges) + " ranges: at most " +
                    std::to_string(kMaxGroups - 1));
    const int64_t chunk_rows =
        std::max(kColumnChunkRows, (rows + kMaxGroups - ranges - 1) / (kMaxGroups - ranges));
    const bool grouped = offsets.defined();
    const int64_t chunks = ceil_div(rows, chunk_rows) + (grouped ? ranges : 0);
    // Every range within one chunk: pass 0 adds to out itself.
    const bool direct = rows <= chunk_rows;
    const Tensor partials = direct ? Tensor{} : alloc({chunks * N});
    struct {
        uint32_t N, rows, ranges, grouped, chunk_rows, direct;
    } p{static_cast<uint32_t>(N), static_cast<uint32_t>(rows),       static_cast<uint32_t>(ranges),
        grouped ? 1u : 0u,        static_cast<uint32_t>(chunk_rows), direct ? 1u : 0u};
    const auto bindings = {in(x), in(offsets), inout(partials), inout(out)};
    const uint32_t column_blocks = ceil_div(N, tuning_.column_wg);
    run("column_sums", {tuning_.column_wg, 0}, bindings, p, column_blocks,
        static_cast<uint32_t>(chunks));
    if (!direct)
        run("column_sums", {tuning_.column_wg, 1}, bindings, p, column_blocks,
            static_cast<uint32_t>(ranges));
}

void VulkanBackend::bias_backward_impl(const Tensor& d_out, const Tensor& d_bias) {
    column_sums(d_out, Tensor{}, 1, d_bias);
}

void VulkanBackend::grouped_matmul_impl(const Tensor& x, const Tensor& w, const Tensor& bias,
                                        const Tensor& offsets, const Tensor& out_t) {
    const int64_t S = x.dim(0), E = w.dim(0), Nout = w.dim(1), K = w.dim(2);
    if (S == 0 || Nout == 0) return;
    if (S <= kGroupedGemvMaxSlots) {
        grouped_matmul_gemv(x, w, bias, offsets, out_t);
        return;
    }
    std::string shader = "grouped_matmul";
    const WeightBinding w_read = weight(w, shader);
    struct {
        uint32_t E, Nout, K, has_bias, w_adjust;
    } p{static_cast<uint32_t>(E), static_cast<uint32_t>(Nout), static_cast<uint32_t>(K),
        bias.defined() ? 1u : 0u, w_read.byte_adjust};
    const TunableCall call{.op = TunableCall::Op::GroupedMatmul,
                           .rows = S,
                           .n = Nout,
                           .k = K,
                           .experts = E,
                           .weight = w.dtype(),
                           .reduced_weights = w_read.reduced};
    const vk::Variant t = choose(vk::Kernel::GroupedMatmul, call);
    const std::vector<uint32_t> spec = tiled_module(t, ctx_->info(), "grouped_matmul", shader);
    run(shader, spec, {in(x), w_read.binding, in(bias), in(offsets), out(out_t)}, p,
        ceil_div(Nout, t.spec[2]), ceil_div(S, t.spec[1]) + static_cast<uint32_t>(E));
}

VulkanBackend::GroupedGemvPush VulkanBackend::grouped_gemv_push(const Tensor& x, const Tensor& w,
                                                                const Tensor& b,
                                                                const WeightBinding& w_read) {
    return {.E = static_cast<uint32_t>(w.dim(0)),
            .Nout = static_cast<uint32_t>(w.dim(1)),
            .K = static_cast<uint32_t>(x.dim(1)),
            .has_bias = b.defined() ? 1u : 0u,
            .w_adjust = w_read.byte_adjust};
}

std::vector<uint32_t> VulkanBackend::grouped_gemv_spec(const Tensor& x, const Tensor& w,
                                                       const WeightBinding& w_read,
                                                       uint32_t epilogue, std::string& shader) {
    const TunableCall call{.op = TunableCall::Op::GroupedMatmul,
                           .rows = x.dim(0),
                           .n = w.dim(1),
                           .k = w.dim(2),
                           .experts = w.dim(0),
                           .weight = w.dtype(),
                           .reduced_weights = w_read.reduced};
    std::vector<uint32_t> spec =
        gemv_module(choose(vk::Kernel::GroupedMatmulGemv, call), "grouped_matmul_gemv", shader);
    spec.push_back(epilogue);
    return spec;
}

bool VulkanBackend::grouped_matmul_gemv(const Tensor& x, const Tensor& w1, const Tensor& b1,
                                        const Tensor& offsets, const Tensor& pre, uint32_t epilogue,
                                        const Tensor& w3, const Tensor& b3, const Tensor& up,
                                        const Tensor& out_t) {
    const int64_t S = x.dim(0), E = w1.dim(0), Nout = w1.dim(1);
    const bool swiglu = epilogue == kSwiglu;
    // One module reads both weights: one format (dtype and fp16 copies alike) for both.
    if (swiglu && w3.dtype() != w1.dtype()) return false;
    if (E == 0) return true;  // no expert: no slot is computed (as the tiled shader)
    std::string shader = "grouped_matmul_gemv";
    const WeightBinding w1_read = weight(w1, shader);
    std::string w3_shader;
    const WeightBinding w3_read = swiglu ? weight(w3, w3_shader) : WeightBinding{in(w3)};
    // An output the epilogue does not write is bound to pre, which the shader writes anyway:
    // the shader's code writes every output binding, and one the stream tracked as read (a
    // dummy) would be a write after read to validation's eyes.
    const auto bindings = {in(x),
                           w1_read.binding,
                           in(b1),
                           in(offsets),
                           out(pre),
                           w3_read.binding,
                           in(b3),
                           swiglu ? out(up) : out(pre),
                           epilogue != 0 ? out(out_t) : out(pre)};
    GroupedGemvPush p = grouped_gemv_push(x, w1, b1, w1_read);
    p.has_bias3 = b3.defined() ? 1u : 0u;
    p.w3_adjust = w3_read.byte_adjust;
    // Tuned as the product with w1 alone: the epilogue needs no more shared memory (w3's sums
    // reuse w1's), so every candidate of the family runs it.
    const std::vector<uint32_t> spec = grouped_gemv_spec(x, w1, w1_read, epilogue, shader);
    // A row of workgroups per run of up to 4 slots of one expert: at most S runs, and at most
    // ceil(S / 4) plus one per expert (the shader's extra rows leave at once).
    const int64_t runs = std::min(S, (S + kGemvRowsPerGroup - 1) / kGemvRowsPerGroup + E);
    run(shader, spec, bindings, p, ceil_div(Nout, spec[1]), static_cast<uint32_t>(runs));
    return true;
}

void VulkanBackend::grouped_ffn_up_impl(const Tensor& x, const Tensor& w1, const Tensor& b1,
                                        const Tensor& w3, const Tensor& b3, const Tensor& offsets,
                                        Activation act, const Tensor& pre, const Tensor& up,
                                        const Tensor& out_t) {
    const int64_t S = x.dim(0), E = w1.dim(0), Nout = w1.dim(1);
    // Decoding's few slots: one dispatch instead of two or three (and their barriers). With no
    // expert the sequence's activation still runs (over pre as it is): left to it.
    if (S > 0 && S <= kGroupedGemvMaxSlots && Nout > 0 && E > 0 &&
        grouped_matmul_gemv(x, w1, b1, offsets, pre,
                            w3.defined() ? kSwiglu : activation_ops(act).forward, w3, b3, up,
                            out_t))
        return;
    Backend::grouped_ffn_up_impl(x, w1, b1, w3, b3, offsets, act, pre, up, out_t);
}

void VulkanBackend::grouped_ffn_down_impl(const Tensor& x, const Tensor& w2, const Tensor& b2,
                                          const Tensor& offsets, const Tensor& slot_of,
                                          const Tensor& gates, const Tensor& ys,
                                          const Tensor& out_t) {
    const int64_t S = x.dim(0), E = w2.dim(0), Nout = w2.dim(1), K = w2.dim(2);
    const int64_t N = gates.dim(0), k = gates.dim(1);
    // One token (a batch-1 decode step): its k slots in one dispatch with the combine
    // (grouped_matmul_gemv.comp's OP_COMBINE), instead of a product and a moe_combine and the
    // wait between them. A larger batch keeps the product's runs of slots per expert, which
    // read each expert's rows once for up to 4 slots (the fused form reads them per token).
    if (N != 1 || k < 1 || k > kGemvRowsPerGroup || S != N * k || E == 0 || Nout == 0 || K == 0) {
        Backend::grouped_ffn_down_impl(x, w2, b2, offsets, slot_of, gates, ys, out_t);
        return;
    }
    std::string shader = "grouped_matmul_gemv";
    const WeightBinding w_read = weight(w2, shader);
    // Bindings as grouped_matmul_gemv.comp's OP_COMBINE takes them: the residual in 4 (and in
    // 7, a writable binding it does not write), gates in 5, slot_of in 6, ys in 8.
    const auto bindings = {in(x),     w_read.binding, in(b2),       in(offsets), inout(out_t),
                           in(gates), in(slot_of),    inout(out_t), out(ys)};
    GroupedGemvPush p = grouped_gemv_push(x, w2, b2, w_read);
    p.choices = static_cast<uint32_t>(k);
    // The product's tuned shape at these slots.
    const std::vector<uint32_t> spec = grouped_gemv_spec(x, w2, w_read, kCombine, shader);
    run(shader, spec, bindings, p, ceil_div(Nout, spec[1]), static_cast<uint32_t>(N));
}

void VulkanBackend::grouped_matmul_backward_impl(const Tensor& x, const Tensor& w,
                                                 const Tensor& offsets, const Tensor& d_out,
                                                 const Tensor& d_x, const Tensor& d_w,
                                                 const Tensor& d_bias) {
    const int64_t S = x.dim(0), E = w.dim(0), Nout = w.dim(1), K = w.dim(2);
    if (S == 0 || E == 0 || Nout == 0) return;  // every gradient sums no term
    if (x.dtype() != DType::F32 || w.dtype() != DType::F32)
        throw Error("grouped_matmul_backward: the Vulkan backend reads fp32 x and w only");
    // Each output element is summed by one invocation in a fixed order (no atomics).
    if (K > 0) {
        // d_x [S, K] += d_out . w[e], per expert's slots: the forward's grid of row tiles.
        struct {
            uint32_t E, Nout, K;
        } p{static_cast<uint32_t>(E), static_cast<uint32_t>(Nout), static_cast<uint32_t>(K)};
        const TunableCall call{.op = TunableCall::Op::GroupedMatmulBackward,
                               .rows = S,
                               .n = Nout,
                               .k = K,
                               .experts = E};
        const uint32_t experts = static_cast<uint32_t>(E);
        const vk::Variant tx = choose(vk::Kernel::GroupedMatmulDx, call);
        run("grouped_matmul_backward_dx", vk::tiled_spec(tx, ctx_->info(), false),
            {in(d_out), in(w), in(offsets), inout(d_x)}, p, ceil_div(K, tx.spec[2]),
            ceil_div(S, tx.spec[1]) + experts);
        // d_w[e] [Nout, K] += d_out[e's slots]^T . x[e's slots]: a grid of tiles per expert.
        const vk::Variant tw = choose(vk::Kernel::GroupedMatmulDw, call);
        run("grouped_matmul_backward_dw", vk::tiled_spec(tw, ctx_->info(), false),
            {in(d_out), in(x), in(offsets), inout(d_w)}, p, ceil_div(K, tw.spec[2]),
            ceil_div(Nout, tw.spec[1]), experts);
    }
    // d_bias[e, n] += column sums of d_out over e's slots.
    if (d_bias.defined()) column_sums(d_out, offsets, E, d_bias);
}

}  // namespace tmx

// Shape and dtype checks shared by every backend, then dispatch to the backend's *_impl.
#include "engine/compute/backend.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "engine/core/checked_math.h"
#include "engine/core/errors.h"

namespace tmx {
namespace {

struct OpCheck {
    const char* op;

    [[noreturn]] void fail(const std::string& what) const {
        throw std::logic_error(std::string("Backend::") + op + ": " + what);
    }
    void defined(const Tensor& t, const char* name) const {
        if (!t.defined()) fail(std::string(name) + " is not allocated");
    }
    void shape(const Tensor& t, const char* name, const Shape& want,
               DType dtype = DType::F32) const {
        defined(t, name);
        if (t.shape() != want)
            fail(std::string(name) + " has shape " + shape_string(t.shape()) + ", expected " +
                 shape_string(want));
        if (t.dtype() != dtype)
            fail(std::string(name) + " is " + to_string(t.dtype()) + ", expected " +
                 to_string(dtype));
    }
    void rank(const Tensor& t, const char* name, int r, DType dtype = DType::F32) const {
        defined(t, name);
        if (t.rank() != r)
            fail(std::string(name) + " has shape " + shape_string(t.shape()) + ", expected rank " +
                 std::to_string(r));
        if (t.dtype() != dtype)
            fail(std::string(name) + " is " + to_string(t.dtype()) + ", expected " +
                 to_string(dtype));
    }
    // The float type t may have: BF16 where it is BF16 and `bf16_allowed`, F32 otherwise (so
    // that a BF16 tensor where none is allowed fails as "expected f32").
    static DType float_type(const Tensor& t, bool bf16_allowed) {
        return bf16_allowed && t.defined() && t.dtype() == DType::BF16 ? DType::BF16 : DType::F32;
    }
};

// The dtype a stored weight (w of linear() and grouped_matmul(), x of gather_rows()) may have:
// its own where it is a 16- or 8-bit format the backend reads, else as OpCheck::float_type.
DType weight_type(const Backend& be, const Tensor& w, bool bf16_operands) {
    if (w.defined() && w.dtype() != DType::F32 && is_weight_format(w.dtype()) &&
        be.supports_weight_format(w.dtype()))
        return w.dtype();
    return OpCheck::float_type(w, bf16_operands);
}

// A Q8_0 weight's rows (its last dimension) must be whole blocks.
void check_weight_rows(const OpCheck& c, const Tensor& w, const char* name) {
    if (w.dtype() == DType::Q8_0 && w.dim(-1) % kQ8_0BlockValues != 0)
        c.fail(std::string(name) + " is q8_0 with rows of " + std::to_string(w.dim(-1)) +
               " values, not whole blocks of 32");
}

}  // namespace

Backend::ModeScope::ModeScope(Backend& be, Mode mode) : be_(be), before_(be.mode_) {
    if (!be.supports_precision(mode.precision))
        throw Error("the " + be.name() + " backend has no " + to_string(mode.precision) +
                    " matmuls (use " + opt("precision") + " fp32)");
    be.mode_ = mode;
}

Tensor Backend::alloc(Shape shape, DType dtype) {
    if (dtype == DType::BF16 && !has_bf16_tensors() && !supports_weight_format(DType::BF16))
        throw Error("the " + name() + " backend has no bf16 tensors (use " + opt("precision") +
                    " fp32)");
    if ((dtype == DType::F16 || dtype == DType::Q8_0) && !supports_weight_format(dtype))
        throw Error("the " + name() + " backend cannot hold " + to_string(dtype) + " weights");
    // Shapes reach here from configs and flags: a negative dimension or a byte count past 64
    // bits is an error naming the shape, never a wrapped size handed to the allocator. (The
    // message is built only on failure: this runs for every tensor.)
    auto what = [&] {
        return "tensor of shape " + shape_string(shape) + " (" + to_string(dtype) + ")";
    };
    for (int64_t d : shape)
        if (d < 0) throw Error(what() + ": a dimension is negative");
    const int64_t numel = shape_numel(shape);
    if (dtype == DType::Q8_0 && numel % kQ8_0BlockValues != 0)
        throw Error(what() + ": q8_0 holds whole blocks of 32 values");
    int64_t signed_bytes = 0;
    if (__builtin_mul_overflow(numel, int64_t{4}, &signed_bytes))  // bounds dtype_bytes
        throw_int64_overflow(what() + " bytes");
    signed_bytes = dtype_bytes(dtype, numel);
    const size_t bytes = static_cast<size_t>(signed_bytes);
    std::shared_ptr<DeviceBuffer> buffer = alloc_impl(bytes);
    MemoryStats& m = *memory_;
    m.live_bytes += bytes;
    m.peak_bytes = std::max(m.peak_bytes, m.live_bytes);
    // The same buffer, behind a reference count that also settles the accounting when the
    // last Tensor lets go.
    std::shared_ptr<DeviceBuffer> counted(buffer.get(),
                                          [buffer, memory = memory_, bytes](DeviceBuffer*) mutable {
                                              memory->live_bytes -= bytes;
                                              buffer.reset();
                                          });
    return Tensor(std::move(counted), std::move(shape), dtype);
}

void Backend::begin_profile() {
    throw Error("the " + name() + " backend cannot time its commands");
}

std::vector<Backend::ProfiledCommands> Backend::end_profile() {
    throw std::logic_error("end_profile() without begin_profile()");
}

void Backend::upload(const Tensor& dst, const void* host) {
    OpCheck{"upload"}.defined(dst, "dst");
    upload_impl(dst, host);
}

void Backend::download(const Tensor& src, void* host) {
    OpCheck{"download"}.defined(src, "src");
    download_impl(src, host);
}

void Backend::fill(const Tensor& dst, float value) {
    OpCheck{"fill"}.rank(dst, "dst", dst.rank());
    fill_impl(dst, value);
}

void Backend::copy(const Tensor& src, const Tensor& dst) {
    OpCheck c{"copy"};
    c.defined(src, "src");
    c.shape(dst, "dst", src.shape(), src.dtype());
    copy_impl(src, dst);
}

void Backend::convert(const Tensor& src, const Tensor& dst) {
    OpCheck c{"convert"};
    c.defined(src, "src");
    if (src.dtype() != DType::F32 && src.dtype() != DType::BF16)
        c.fail(std::string("src is ") + to_string(src.dtype()) + ", expected f32 or bf16");
    c.shape(dst, "dst", src.shape(), src.dtype() == DType::F32 ? DType::BF16 : DType::F32);
    convert_impl(src, dst);
}

void Backend::convert_impl(const Tensor&, const Tensor&) {
    throw Error("the " + name() + " backend has no bf16 tensors");
}

// The checks of the ops the fused ops are made of: each public op runs its own, and a fused op
// those of its sequence, under its own name.
namespace {

void check_gather_rows(const OpCheck& c, const Backend& be, const Tensor& x, const Tensor& rows,
                       const Tensor& out) {
    // BF16 rows stay BF16 where out is BF16 too; any other x is read as its format holds it.
    const bool bf16_rows = be.has_bf16_tensors() && x.defined() && x.dtype() == DType::BF16 &&
                           out.defined() && out.dtype() == DType::BF16;
    c.rank(x, "x", 2, bf16_rows ? DType::BF16 : weight_type(be, x, false));
    check_weight_rows(c, x, "x");
    c.rank(rows, "rows", 1, DType::I32);
    c.shape(out, "out", {rows.dim(0), x.dim(1)}, bf16_rows ? DType::BF16 : DType::F32);
}

void check_norm(const OpCheck& c, const Backend& be, NormType type, const Tensor& x,
                const Tensor& weight, const Tensor& bias, const Tensor& out) {
    c.rank(x, "x", 2);
    c.shape(weight, "weight", {x.dim(1)});
    if (type == NormType::LayerNorm) c.shape(bias, "bias", {x.dim(1)});
    c.shape(out, "out", x.shape(), OpCheck::float_type(out, be.has_bf16_tensors()));
}

}  // namespace

void Backend::gather_rows(const Tensor& x, const Tensor& rows, const Tensor& out) {
    check_gather_rows(OpCheck{"gather_rows"}, *this, x, rows, out);
    gather_rows_impl(x, rows, out);
}

void Backend::norm(NormType type, const Tensor& x, const Tensor& weight, const Tensor& bias,
                   float eps, const Tensor& out) {
    check_norm(OpCheck{"norm"}, *this, type, x, weight, bias, out);
    norm_impl(type, x, weight, type == NormType::LayerNorm ? bias : Tensor{}, eps, out);
}

void Backend::matmul(const Tensor& a, const Tensor& b, const Tensor& out, MatmulOptions opts,
                     const Tensor& bias) {
    OpCheck c{"matmul"};
    const bool bf16_operands = matmul_precision() == Precision::BF16;
    c.rank(a, "a", 2, OpCheck::float_type(a, bf16_operands));
    c.rank(b, "b", 2, OpCheck::float_type(b, bf16_operands));
    int64_t M = opts.trans_a ? a.dim(1) : a.dim(0);
    int64_t K = opts.trans_a ? a.dim(0) : a.dim(1);
    int64_t Kb = opts.trans_b ? b.dim(1) : b.dim(0);
    int64_t N = opts.trans_b ? b.dim(0) : b.dim(1);
    if (K != Kb)
        c.fail("inner dimensions differ: a " + shape_string(a.shape()) + ", b " +
               shape_string(b.shape()));
    c.shape(out, "out", {M, N});
    if (bias.defined()) c.shape(bias, "bias", {N});
    matmul_impl(a, b, out, opts, bias);
}

namespace {
// x [N, in] and w [out, in] of linear() and linear_backward().
void check_linear_operands(const OpCheck& c, const Tensor& x, const Tensor& w, bool bf16_operands,
                           DType w_type) {
    c.rank(x, "x", 2, OpCheck::float_type(x, bf16_operands));
    c.rank(w, "w", 2, w_type);
    check_weight_rows(c, w, "w");
    if (w.dim(1) != x.dim(1))
        c.fail("w " + shape_string(w.shape()) + " does not take x " + shape_string(x.shape()));
}

void check_linear(const OpCheck& c, const Backend& be, const Tensor& x, const Tensor& w,
                  const Tensor& b, const Tensor& y) {
    const bool bf16_operands = be.matmul_precision() == Precision::BF16;
    check_linear_operands(c, x, w, bf16_operands, weight_type(be, w, bf16_operands));
    c.shape(y, "y", {x.dim(0), w.dim(0)});
    if (b.defined()) c.shape(b, "b", {w.dim(0)});
}
}  // namespace

void Backend::linear(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y,
                     bool accumulate) {
    check_linear(OpCheck{"linear"}, *this, x, w, b, y);
    linear_impl(x, w, b, y, accumulate);
}

void Backend::linear_impl(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y,
                          bool accumulate) {
    matmul_impl(x, w, y, {.trans_b = true, .accumulate = accumulate}, b);
}

namespace {
void check_rope(const OpCheck& c, const Tensor& x, const Tensor& positions) {
    c.rank(x, "x", 3);
    if (x.dim(2) % 2 != 0) c.fail("head_dim must be even");
    c.shape(positions, "positions", {x.dim(0)}, DType::I32);
}

// q [B, T, H, hd] or k [B, T, Hkv, hd] as rope() takes it: [B * T, heads, hd].
Tensor heads_of_tokens(const Tensor& x) {
    return x.reshape({x.dim(0) * x.dim(1), x.dim(2), x.dim(3)});
}
}  // namespace

void Backend::rope(const Tensor& x, const Tensor& positions, double theta, bool inverse) {
    check_rope(OpCheck{"rope"}, x, positions);
    rope_impl(x, positions, theta, inverse);
}

namespace {
// The shapes attention() and attention_cached() share.
void check_attention_shapes(const OpCheck& c, const Tensor& q, const Tensor& k, const Tensor& v,
                            const Tensor& out, int64_t window, DType out_type = DType::F32) {
    c.rank(q, "q", 4);
    c.rank(k, "k", 4);
    c.shape(v, "v", k.shape());
    c.shape(out, "out", q.shape(), out_type);
    if (k.dim(0) != q.dim(0) || k.dim(1) != q.dim(1) || k.dim(3) != q.dim(3))
        c.fail("q " + shape_string(q.shape()) + " and k " + shape_string(k.shape()) + " differ");
    if (k.dim(2) == 0 || q.dim(2) % k.dim(2) != 0)
        c.fail("query heads must be a multiple of kv heads");
    if (window < 0) c.fail("negative window");
}
}  // namespace

void Backend::attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        int64_t window) {
    OpCheck c{"attention"};
    const bool bf16_out = attention_in_bf16(matmul_precision(), q.rank() == 4 ? q.dim(3) : 0);
    check_attention_shapes(c, q, k, v, out, window, OpCheck::float_type(out, bf16_out));
    attention_impl(q, k, v, out, window);
}

namespace {
// The shapes attention_cached() and kv_cache_write() share.
void check_kv_cache_shapes(const OpCheck& c, const Tensor& k, const Tensor& v,
                           const Tensor& k_cache, const Tensor& v_cache, const Tensor& start) {
    c.rank(k, "k", 4);
    c.shape(v, "v", k.shape());
    c.rank(k_cache, "k_cache", 4);
    c.shape(v_cache, "v_cache", k_cache.shape());
    if (k_cache.dim(0) != k.dim(0) || k_cache.dim(2) != k.dim(2) || k_cache.dim(3) != k.dim(3))
        c.fail("k " + shape_string(k.shape()) + " and k_cache " + shape_string(k_cache.shape()) +
               " differ");
    if (k_cache.dim(1) < 1) c.fail("the cache has no slots");
    c.shape(start, "start", {k.dim(0)}, DType::I32);
}

void check_attention_cached(const OpCheck& c, const Tensor& q, const Tensor& k, const Tensor& v,
                            const Tensor& k_cache, const Tensor& v_cache, const Tensor& start,
                            const Tensor& out, int64_t window) {
    check_attention_shapes(c, q, k, v, out, window);
    check_kv_cache_shapes(c, k, v, k_cache, v_cache, start);
    if (window > 0 && k_cache.dim(1) < window - 1)
        c.fail("a cache of " + std::to_string(k_cache.dim(1)) + " slots cannot hold a window of " +
               std::to_string(window));
}
}  // namespace

void Backend::attention_cached(const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& k_cache, const Tensor& v_cache, const Tensor& start,
                               const Tensor& out, int64_t window) {
    check_attention_cached(OpCheck{"attention_cached"}, q, k, v, k_cache, v_cache, start, out,
                           window);
    attention_cached_impl(q, k, v, k_cache, v_cache, start, out, window);
}

void Backend::kv_cache_write(const Tensor& k, const Tensor& v, const Tensor& k_cache,
                             const Tensor& v_cache, const Tensor& start) {
    OpCheck c{"kv_cache_write"};
    check_kv_cache_shapes(c, k, v, k_cache, v_cache, start);
    kv_cache_write_impl(k, v, k_cache, v_cache, start);
}

namespace {
void check_router_topk(const OpCheck& c, const Tensor& logits, const Tensor& indices,
                       const Tensor& gates) {
    c.rank(logits, "logits", 2);
    c.rank(indices, "indices", 2, DType::I32);
    if (indices.dim(0) != logits.dim(0) || indices.dim(1) < 1 || indices.dim(1) > logits.dim(1))
        c.fail("indices " + shape_string(indices.shape()) + " do not fit logits " +
               shape_string(logits.shape()));
    c.shape(gates, "gates", indices.shape());
}

void check_moe_group(const OpCheck& c, const Tensor& indices, int64_t n_experts,
                     const Tensor& offsets, const Tensor& slot_rows, const Tensor& slot_of) {
    c.rank(indices, "indices", 2, DType::I32);
    c.shape(offsets, "offsets", {n_experts + 1}, DType::I32);
    c.shape(slot_rows, "slot_rows", {indices.numel()}, DType::I32);
    c.shape(slot_of, "slot_of", {indices.numel()}, DType::I32);
}

void check_grouped_matmul(const OpCheck& c, const Backend& be, const Tensor& x, const Tensor& w,
                          const Tensor& bias, const Tensor& offsets, const Tensor& out) {
    const bool bf16_operands = be.matmul_precision() == Precision::BF16;
    c.rank(x, "x", 2, OpCheck::float_type(x, bf16_operands));
    c.rank(w, "w", 3, weight_type(be, w, bf16_operands));
    check_weight_rows(c, w, "w");
    if (w.dim(2) != x.dim(1))
        c.fail("w " + shape_string(w.shape()) + " does not take x " + shape_string(x.shape()));
    if (bias.defined()) c.shape(bias, "bias", {w.dim(0), w.dim(1)});
    c.shape(offsets, "offsets", {w.dim(0) + 1}, DType::I32);
    c.shape(out, "out", {x.dim(0), w.dim(1)});
}
}  // namespace

void Backend::router_topk(const Tensor& logits, const Tensor& indices, const Tensor& gates) {
    check_router_topk(OpCheck{"router_topk"}, logits, indices, gates);
    router_topk_impl(logits, indices, gates);
}

void Backend::moe_group(const Tensor& indices, int64_t n_experts, const Tensor& offsets,
                        const Tensor& slot_rows, const Tensor& slot_of) {
    check_moe_group(OpCheck{"moe_group"}, indices, n_experts, offsets, slot_rows, slot_of);
    moe_group_impl(indices, n_experts, offsets, slot_rows, slot_of);
}

void Backend::grouped_matmul(const Tensor& x, const Tensor& w, const Tensor& bias,
                             const Tensor& offsets, const Tensor& out) {
    check_grouped_matmul(OpCheck{"grouped_matmul"}, *this, x, w, bias, offsets, out);
    grouped_matmul_impl(x, w, bias, offsets, out);
}

void Backend::moe_combine(const Tensor& expert_out, const Tensor& slot_of, const Tensor& gates,
                          const Tensor& out) {
    OpCheck c{"moe_combine"};
    c.rank(gates, "gates", 2);
    c.rank(out, "out", 2);
    c.shape(expert_out, "expert_out", {gates.numel(), out.dim(1)});
    c.shape(slot_of, "slot_of", {gates.numel()}, DType::I32);
    if (gates.dim(0) != out.dim(0)) c.fail("gates and out have different row counts");
    moe_combine_impl(expert_out, slot_of, gates, out);
}

namespace {
void check_activation(const OpCheck& c, const Backend& be, const Tensor& x, const Tensor& out) {
    c.shape(x, "x", x.shape());
    c.shape(out, "out", x.shape(), OpCheck::float_type(out, be.has_bf16_tensors()));
}

void check_swiglu(const OpCheck& c, const Backend& be, const Tensor& gate, const Tensor& up,
                  const Tensor& out) {
    c.shape(gate, "gate", gate.shape());
    c.shape(up, "up", gate.shape());
    c.shape(out, "out", gate.shape(), OpCheck::float_type(out, be.has_bf16_tensors()));
}
}  // namespace

void Backend::activation(Activation act, const Tensor& x, const Tensor& out) {
    check_activation(OpCheck{"activation"}, *this, x, out);
    activation_impl(act, x, out);
}

void Backend::swiglu(const Tensor& gate, const Tensor& up, const Tensor& out) {
    check_swiglu(OpCheck{"swiglu"}, *this, gate, up, out);
    swiglu_impl(gate, up, out);
}

void Backend::add(const Tensor& a, const Tensor& b, const Tensor& out) {
    OpCheck c{"add"};
    c.shape(a, "a", a.shape());
    c.shape(b, "b", a.shape());
    c.shape(out, "out", a.shape());
    add_impl(a, b, out);
}

void Backend::cross_entropy(const Tensor& logits, const Tensor& targets, const Tensor& losses) {
    OpCheck c{"cross_entropy"};
    c.rank(logits, "logits", 2);
    c.shape(targets, "targets", {logits.dim(0)}, DType::I32);
    c.shape(losses, "losses", {logits.dim(0)});
    cross_entropy_impl(logits, targets, losses);
}

void Backend::router_aux_loss(const Tensor& logits, const Tensor& indices, const Tensor& out) {
    OpCheck c{"router_aux_loss"};
    c.rank(logits, "logits", 2);
    c.rank(indices, "indices", 2, DType::I32);
    if (indices.dim(0) != logits.dim(0)) c.fail("indices and logits have different row counts");
    c.shape(out, "out", {1});
    router_aux_loss_impl(logits, indices, out);
}

std::vector<int32_t> Backend::argmax_rows(const Tensor& logits) {
    OpCheck c{"argmax_rows"};
    c.rank(logits, "logits", 2);
    if (logits.dim(1) == 0) c.fail("logits has no columns");
    std::vector<int32_t> tokens(static_cast<size_t>(logits.dim(0)));
    if (!tokens.empty()) argmax_rows_impl(logits, tokens.data());
    return tokens;
}

void Backend::argmax_rows_impl(const Tensor& logits, int32_t* tokens) {
    const int64_t N = logits.dim(0), V = logits.dim(1);
    std::vector<float> host(static_cast<size_t>(logits.numel()));
    download_impl(logits, host.data());
    for (int64_t n = 0; n < N; ++n) {
        const float* row = host.data() + n * V;
        // Every value checked, so the loop has no early exit and vectorises.
        bool finite = true;
        float best = row[0];
#pragma omp simd reduction(&& : finite) reduction(max : best)
        for (int64_t v = 0; v < V; ++v) {
            finite = finite && std::isfinite(row[v]);
            best = row[v] > best ? row[v] : best;
        }
        tokens[n] = finite ? static_cast<int32_t>(std::find(row, row + V, best) - row) : -1;
    }
}

// ---- fused forward ops

void Backend::norm_linear(NormType type, const Tensor& x, const Tensor& norm_weight,
                          const Tensor& norm_bias, float eps, const Tensor& normed, const Tensor& w,
                          const Tensor& b, const Tensor& y) {
    const OpCheck c{"norm_linear"};
    check_norm(c, *this, type, x, norm_weight, norm_bias, normed);
    check_linear(c, *this, normed, w, b, y);
    norm_linear_impl(type, x, norm_weight, type == NormType::LayerNorm ? norm_bias : Tensor{}, eps,
                     normed, w, b, y);
}

void Backend::norm_linear_impl(NormType type, const Tensor& x, const Tensor& norm_weight,
                               const Tensor& norm_bias, float eps, const Tensor& normed,
                               const Tensor& w, const Tensor& b, const Tensor& y) {
    norm_impl(type, x, norm_weight, norm_bias, eps, normed);
    linear_impl(normed, w, b, y, /*accumulate=*/false);
}

void Backend::rope_attention_cached_store(const Tensor& q, const Tensor& k, const Tensor& v,
                                          const Tensor& positions, double theta,
                                          const Tensor& k_cache, const Tensor& v_cache,
                                          const Tensor& start, const Tensor& out, int64_t window) {
    const OpCheck c{"rope_attention_cached_store"};
    check_attention_cached(c, q, k, v, k_cache, v_cache, start, out, window);
    check_rope(c, heads_of_tokens(q), positions);
    rope_attention_cached_store_impl(q, k, v, positions, theta, k_cache, v_cache, start, out,
                                     window);
}

void Backend::rope_attention_cached_store_impl(const Tensor& q, const Tensor& k, const Tensor& v,
                                               const Tensor& positions, double theta,
                                               const Tensor& k_cache, const Tensor& v_cache,
                                               const Tensor& start, const Tensor& out,
                                               int64_t window) {
    // One token's q and k side by side (slices of the fused qkv projection's row): one rope.
    const Tensor qk =
        q.dim(0) * q.dim(1) == 1 ? q.joined(k, {1, q.dim(2) + k.dim(2), q.dim(3)}) : Tensor{};
    if (qk.defined()) {
        rope_impl(qk, positions, theta, /*inverse=*/false);
    } else {
        rope_impl(heads_of_tokens(q), positions, theta, /*inverse=*/false);
        rope_impl(heads_of_tokens(k), positions, theta, /*inverse=*/false);
    }
    attention_cached_impl(q, k, v, k_cache, v_cache, start, out, window);
    kv_cache_write_impl(k, v, k_cache, v_cache, start);
}

void Backend::moe_route(const Tensor& logits, const Tensor& x, const Tensor& indices,
                        const Tensor& gates, const Tensor& offsets, const Tensor& slot_rows,
                        const Tensor& slot_of, const Tensor& xs) {
    const OpCheck c{"moe_route"};
    check_router_topk(c, logits, indices, gates);
    check_moe_group(c, indices, logits.dim(1), offsets, slot_rows, slot_of);
    check_gather_rows(c, *this, x, slot_rows, xs);
    if (x.dim(0) != logits.dim(0)) c.fail("x and logits have different row counts");
    moe_route_impl(logits, x, indices, gates, offsets, slot_rows, slot_of, xs);
}

void Backend::moe_route_impl(const Tensor& logits, const Tensor& x, const Tensor& indices,
                             const Tensor& gates, const Tensor& offsets, const Tensor& slot_rows,
                             const Tensor& slot_of, const Tensor& xs) {
    router_topk_impl(logits, indices, gates);
    moe_group_impl(indices, logits.dim(1), offsets, slot_rows, slot_of);
    gather_rows_impl(x, slot_rows, xs);
}

void Backend::grouped_ffn_up(const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w3,
                             const Tensor& b3, const Tensor& offsets, Activation act,
                             const Tensor& pre, const Tensor& up, const Tensor& out) {
    const OpCheck c{"grouped_ffn_up"};
    check_grouped_matmul(c, *this, x, w1, b1, offsets, pre);
    if (w3.defined()) {
        check_grouped_matmul(c, *this, x, w3, b3, offsets, up);
        check_swiglu(c, *this, pre, up, out);
    } else {
        if (b3.defined() || up.defined()) c.fail("b3 or up without w3");
        check_activation(c, *this, pre, out);
    }
    grouped_ffn_up_impl(x, w1, b1, w3, b3, offsets, act, pre, up, out);
}

void Backend::grouped_ffn_up_impl(const Tensor& x, const Tensor& w1, const Tensor& b1,
                                  const Tensor& w3, const Tensor& b3, const Tensor& offsets,
                                  Activation act, const Tensor& pre, const Tensor& up,
                                  const Tensor& out) {
    grouped_matmul_impl(x, w1, b1, offsets, pre);
    if (w3.defined()) {
        grouped_matmul_impl(x, w3, b3, offsets, up);
        swiglu_impl(pre, up, out);
    } else {
        activation_impl(act, pre, out);
    }
}

void Backend::grouped_ffn_down(const Tensor& x, const Tensor& w2, const Tensor& b2,
                               const Tensor& offsets, const Tensor& slot_of, const Tensor& gates,
                               const Tensor& ys, const Tensor& out) {
    const OpCheck c{"grouped_ffn_down"};
    check_grouped_matmul(c, *this, x, w2, b2, offsets, ys);
    c.rank(gates, "gates", 2);
    c.rank(out, "out", 2);
    c.shape(ys, "ys", {gates.numel(), out.dim(1)});
    c.shape(slot_of, "slot_of", {gates.numel()}, DType::I32);
    if (gates.dim(0) != out.dim(0)) c.fail("gates and out have different row counts");
    grouped_ffn_down_impl(x, w2, b2, offsets, slot_of, gates, ys, out);
}

void Backend::grouped_ffn_down_impl(const Tensor& x, const Tensor& w2, const Tensor& b2,
                                    const Tensor& offsets, const Tensor& slot_of,
                                    const Tensor& gates, const Tensor& ys, const Tensor& out) {
    grouped_matmul_impl(x, w2, b2, offsets, ys);
    moe_combine_impl(ys, slot_of, gates, out);
}

// ---- backward ops

void Backend::norm_backward(NormType type, const Tensor& x, const Tensor& weight,
                            const Tensor& d_out, float eps, const Tensor& d_x,
                            const Tensor& d_weight, const Tensor& d_bias) {
    OpCheck c{"norm_backward"};
    c.rank(x, "x", 2);
    c.shape(weight, "weight", {x.dim(1)});
    c.shape(d_out, "d_out", x.shape());
    c.shape(d_x, "d_x", x.shape());
    c.shape(d_weight, "d_weight", {x.dim(1)});
    if (type == NormType::LayerNorm) c.shape(d_bias, "d_bias", {x.dim(1)});
    norm_backward_impl(type, x, weight, d_out, eps, d_x, d_weight,
                       type == NormType::LayerNorm ? d_bias : Tensor{});
}

void Backend::bias_backward(const Tensor& d_out, const Tensor& d_bias) {
    OpCheck c{"bias_backward"};
    c.rank(d_out, "d_out", 2);
    c.shape(d_bias, "d_bias", {d_out.dim(1)});
    bias_backward_impl(d_out, d_bias);
}

void Backend::linear_backward(const Tensor& x, const Tensor& w, const Tensor& d_y,
                              const Tensor& d_x, const Tensor& d_w, const Tensor& d_b) {
    OpCheck c{"linear_backward"};
    if (!supports_training()) training_op_unavailable("linear_backward");
    const bool bf16_operands = matmul_precision() == Precision::BF16;
    check_linear_operands(c, x, w, bf16_operands, OpCheck::float_type(w, bf16_operands));
    // A BF16 d_y only without d_b, which sums the gradient itself, in fp32.
    c.shape(d_y, "d_y", {x.dim(0), w.dim(0)},
            OpCheck::float_type(d_y, bf16_operands && !d_b.defined()));
    c.shape(d_x, "d_x", x.shape());  // the gradients are F32 whatever x and w are
    c.shape(d_w, "d_w", w.shape());
    if (d_b.defined()) c.shape(d_b, "d_b", {w.dim(0)});
    linear_backward_impl(x, w, d_y, d_x, d_w, d_b);
}

void Backend::linear_backward_impl(const Tensor& x, const Tensor& w, const Tensor& d_y,
                                   const Tensor& d_x, const Tensor& d_w, const Tensor& d_b) {
    matmul_impl(d_y, w, d_x, {.accumulate = true}, Tensor{});
    matmul_impl(d_y, x, d_w, {.trans_a = true, .accumulate = true}, Tensor{});
    if (d_b.defined()) bias_backward_impl(d_y, d_b);
}

void Backend::attention_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                 const Tensor& d_out, const Tensor& d_q, const Tensor& d_k,
                                 const Tensor& d_v, int64_t window) {
    OpCheck c{"attention_backward"};
    c.rank(q, "q", 4);
    c.rank(k, "k", 4);
    c.shape(v, "v", k.shape());
    c.shape(d_out, "d_out", q.shape());
    c.shape(d_q, "d_q", q.shape());
    c.shape(d_k, "d_k", k.shape());
    c.shape(d_v, "d_v", k.shape());
    if (k.dim(0) != q.dim(0) || k.dim(1) != q.dim(1) || k.dim(3) != q.dim(3) || k.dim(2) == 0 ||
        q.dim(2) % k.dim(2) != 0)
        c.fail("q " + shape_string(q.shape()) + " and k " + shape_string(k.shape()) + " differ");
    if (window < 0) c.fail("negative window");
    attention_backward_impl(q, k, v, d_out, d_q, d_k, d_v, window);
}

void Backend::router_backward(const Tensor& logits, const Tensor& indices, const Tensor& gates,
                              const Tensor& d_gates, float aux_weight, const Tensor& d_logits) {
    OpCheck c{"router_backward"};
    c.rank(logits, "logits", 2);
    c.rank(indices, "indices", 2, DType::I32);
    if (indices.dim(0) != logits.dim(0)) c.fail("indices and logits have different row counts");
    c.shape(gates, "gates", indices.shape());
    c.shape(d_gates, "d_gates", indices.shape());
    c.shape(d_logits, "d_logits", logits.shape());
    router_backward_impl(logits, indices, gates, d_gates, aux_weight, d_logits);
}

void Backend::gather_rows_backward(const Tensor& rows, const Tensor& d_out, const Tensor& d_x) {
    OpCheck c{"gather_rows_backward"};
    c.rank(rows, "rows", 1, DType::I32);
    c.rank(d_x, "d_x", 2);
    c.shape(d_out, "d_out", {rows.dim(0), d_x.dim(1)});
    gather_rows_backward_impl(rows, d_out, d_x);
}

void Backend::grouped_matmul_backward(const Tensor& x, const Tensor& w, const Tensor& offsets,
                                      const Tensor& d_out, const Tensor& d_x, const Tensor& d_w,
                                      const Tensor& d_bias) {
    OpCheck c{"grouped_matmul_backward"};
    const bool bf16_operands = matmul_precision() == Precision::BF16;
    c.rank(x, "x", 2, OpCheck::float_type(x, bf16_operands));
    c.rank(w, "w", 3, OpCheck::float_type(w, bf16_operands));
    if (w.dim(2) != x.dim(1))
        c.fail("w " + shape_string(w.shape()) + " does not take x " + shape_string(x.shape()));
    c.shape(offsets, "offsets", {w.dim(0) + 1}, DType::I32);
    c.shape(d_out, "d_out", {x.dim(0), w.dim(1)});
    c.shape(d_x, "d_x", x.shape());  // the gradients are F32 whatever x and w are
    c.shape(d_w, "d_w", w.shape());
    if (d_bias.defined()) c.shape(d_bias, "d_bias", {w.dim(0), w.dim(1)});
    grouped_matmul_backward_impl(x, w, offsets, d_out, d_x, d_w, d_bias);
}

void Backend::moe_combine_backward(const Tensor& expert_out, const Tensor& slot_of,
                                   const Tensor& gates, const Tensor& d_out,
                                   const Tensor& d_expert_out, const Tensor& d_gates) {
    OpCheck c{"moe_combine_backward"};
    c.rank(gates, "gates", 2);
    c.rank(d_out, "d_out", 2);
    c.shape(expert_out, "expert_out", {gates.numel(), d_out.dim(1)});
    c.shape(slot_of, "slot_of", {gates.numel()}, DType::I32);
    c.shape(d_expert_out, "d_expert_out", expert_out.shape());
    c.shape(d_gates, "d_gates", gates.shape());
    if (gates.dim(0) != d_out.dim(0)) c.fail("gates and d_out have different row counts");
    moe_combine_backward_impl(expert_out, slot_of, gates, d_out, d_expert_out, d_gates);
}

void Backend::activation_backward(Activation act, const Tensor& x, const Tensor& d_out,
                                  const Tensor& d_x) {
    OpCheck c{"activation_backward"};
    c.shape(x, "x", x.shape());
    c.shape(d_out, "d_out", x.shape());
    c.shape(d_x, "d_x", x.shape());
    activation_backward_impl(act, x, d_out, d_x);
}

void Backend::swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& d_out,
                              const Tensor& d_gate, const Tensor& d_up) {
    OpCheck c{"swiglu_backward"};
    c.shape(gate, "gate", gate.shape());
    for (const auto& [t, name] :
         {std::pair{&up, "up"}, {&d_out, "d_out"}, {&d_gate, "d_gate"}, {&d_up, "d_up"}})
        c.shape(*t, name, gate.shape());
    swiglu_backward_impl(gate, up, d_out, d_gate, d_up);
}

void Backend::cross_entropy_backward(const Tensor& logits, const Tensor& targets, float scale,
                                     const Tensor& d_logits) {
    OpCheck c{"cross_entropy_backward"};
    c.rank(logits, "logits", 2);
    c.shape(targets, "targets", {logits.dim(0)}, DType::I32);
    c.shape(d_logits, "d_logits", logits.shape(),
            OpCheck::float_type(d_logits, has_bf16_tensors()));
    cross_entropy_backward_impl(logits, targets, scale, d_logits);
}

void Backend::sum_squares(const Tensor& x, const Tensor& out) {
    OpCheck c{"sum_squares"};
    c.shape(x, "x", x.shape());
    c.shape(out, "out", {1});
    sum_squares_impl(x, out);
}

void Backend::scale(const Tensor& x, float s) {
    OpCheck{"scale"}.shape(x, "x", x.shape());
    scale_impl(x, s);
}

void Backend::adamw(const Tensor& params, const Tensor& grads, const Tensor& m, const Tensor& v,
                    const AdamWParams& hp) {
    OpCheck c{"adamw"};
    c.rank(params, "params", 1);
    for (const auto& [t, name] : {std::pair{&grads, "grads"}, {&m, "m"}, {&v, "v"}})
        c.shape(*t, name, params.shape());
    if (hp.step < 1) c.fail("step must be >= 1");
    adamw_impl(params, grads, m, v, hp);
}

// ---- the training ops of a backend that does not train

void Backend::training_op_unavailable(const char* op) const {
    throw Error(std::string(op) + " is not available on the " + name() +
                " backend (it runs inference only)");
}

void Backend::norm_backward_impl(NormType, const Tensor&, const Tensor&, const Tensor&, float,
                                 const Tensor&, const Tensor&, const Tensor&) {
    training_op_unavailable("norm_backward");
}
void Backend::bias_backward_impl(const Tensor&, const Tensor&) {
    training_op_unavailable("bias_backward");
}
void Backend::attention_backward_impl(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                      const Tensor&, const Tensor&, const Tensor&, int64_t) {
    training_op_unavailable("attention_backward");
}
void Backend::router_backward_impl(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                   float, const Tensor&) {
    training_op_unavailable("router_backward");
}
void Backend::gather_rows_backward_impl(const Tensor&, const Tensor&, const Tensor&) {
    training_op_unavailable("gather_rows_backward");
}
void Backend::grouped_matmul_backward_impl(const Tensor&, const Tensor&, const Tensor&,
                                           const Tensor&, const Tensor&, const Tensor&,
                                           const Tensor&) {
    training_op_unavailable("grouped_matmul_backward");
}
void Backend::moe_combine_backward_impl(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                        const Tensor&, const Tensor&) {
    training_op_unavailable("moe_combine_backward");
}
void Backend::activation_backward_impl(Activation, const Tensor&, const Tensor&, const Tensor&) {
    training_op_unavailable("activation_backward");
}
void Backend::swiglu_backward_impl(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                   const Tensor&) {
    training_op_unavailable("swiglu_backward");
}
void Backend::cross_entropy_backward_impl(const Tensor&, const Tensor&, float, const Tensor&) {
    training_op_unavailable("cross_entropy_backward");
}
void Backend::sum_squares_impl(const Tensor&, const Tensor&) {
    training_op_unavailable("sum_squares");
}
void Backend::scale_impl(const Tensor&, float) {
    training_op_unavailable("scale");
}
void Backend::adamw_impl(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                         const AdamWParams&) {
    training_op_unavailable("adamw");
}

}  // namespace tmx

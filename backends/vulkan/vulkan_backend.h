// The Vulkan backend: GLSL compute shaders (shaders/*.comp, embedded as SPIR-V) on any Vulkan
// 1.2 device, Mesa's lavapipe included. It runs every op, forward, backward and the optimizer's,
// in fp32 (training and inference); training ops are deterministic (no float atomics).
//
// Ops are recorded into one command buffer (vulkan_commands.h: barriers only between dependent
// commands) and submitted at download() or synchronize(); a forward step is one submit.
// Inputs a shader finds invalid (token ids, rows, expert indices, targets out of range) are
// reported through a status word and thrown as tmx::Error at that sync point.
//
// Weights (w of linear and grouped_matmul, the embedding table) are read in the format they are
// stored in: f32, bf16, f16 or Q8_0 (shaders/weights.glsl; supports_weight_format). An f32
// matmul weight is read from an fp16 copy when the context says so (vulkan_context.h,
// vulkan_fp16.h); every other operand is fp32.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "backends/vulkan/vulkan_commands.h"
#include "backends/vulkan/vulkan_context.h"
#include "backends/vulkan/vulkan_fp16.h"
#include "backends/vulkan/vulkan_memory.h"
#include "backends/vulkan/vulkan_pipelines.h"
#include "backends/vulkan/vulkan_tuning.h"
#include "engine/compute/backend.h"
#include "engine/compute/kernel_tuning.h"

namespace tmx {

// Throws tmx::Error when Vulkan or the chosen device is unavailable.
std::unique_ptr<Backend> make_vulkan_backend(const vk::VulkanOptions& options = {});

class VulkanBackend final : public Backend, public KernelTuning {
  public:
    explicit VulkanBackend(const vk::VulkanOptions& options = {});
    ~VulkanBackend() override;

    std::string name() const override { return "vulkan"; }
    bool supports_training() const override { return true; }
    // The largest device-local memory heap (training's memory check compares with it).
    uint64_t memory_capacity() const override;
    // Every format: the shaders unpack 16- and 8-bit weights from 32-bit words, which any
    // Vulkan 1.2 device reads (no 8- or 16-bit storage feature is needed).
    bool supports_weight_format(DType t) const override {
        return t == DType::F32 || t == DType::BF16 || t == DType::F16 || t == DType::Q8_0;
    }
    // "vulkan: <device name> (device N), f32 weights read as fp32 | fp16, tuned | untuned" (the
    // fp16 through fp16 copies; weights stored in other formats are read as stored; tuned: a
    // tuning file of `tmx tune` chooses the matmul shapes, vulkan_tuning.h).
    std::string description() const override;
    void synchronize() override;
    // Records the step into a secondary command buffer on its second run; from the third, the
    // submit runs that buffer instead of recording every dispatch again.
    void run_recorded(StepRecording& rec, const std::function<void()>& body) override;
    // Timestamps after every command (vk::Stream's timing); while profiling, steps are not
    // recorded, nor recordings replayed.
    bool can_profile() const override { return stream_->can_time(); }
    void begin_profile() override;
    std::vector<ProfiledCommands> end_profile() override;
    // The stream's barriers among the profiled commands (vk::Stream::timed_barriers).
    std::optional<int64_t> profiled_barriers() const override { return profiled_barriers_; }

    // For tests and `tmx devices`: the device, the allocator and the stream's counters.
    const vk::Context& context() const { return *ctx_; }
    vk::Allocator::Stats allocator_stats() const { return allocator_->stats(); }
    const vk::Stream::Counters& counters() const { return stream_->counters(); }
    // Whether f32 matmul weights are read as fp16 (not in training mode, Backend::Mode: there
    // f32 weights are read as they are), and how many fp16 copies exist now.
    bool fp16_weights() const { return fp16_ != nullptr && !training_mode(); }
    size_t fp16_weight_copies() const { return fp16_ ? fp16_->size() : 0; }

    // Workgroup and tile sizes, chosen per device (specialization constants of the shaders).
    struct Tuning {
        uint32_t elementwise_wg = 256;
        uint32_t row_wg = 128;  // norm, cross_entropy: one workgroup per row
        // Column sums (bias_backward, norm_backward's weights) and row scatters
        // (gather_rows_backward): one invocation per column, walking (a chunk of) the rows in
        // order.
        uint32_t column_wg = 64;
        // The matmul kernels' shapes are chosen per call by the tuning table (vulkan_tuning.h).
        uint32_t attention_wg = 64, attention_chunk = 256;  // attention.comp, the fallback
        // Few queries (T <= split_max_t): each query's window in slices of keys, a workgroup
        // per slice, then a merge (attention_split.comp, _combine.comp).
        uint32_t attention_split_max_t = 4;  // its shape: the tuning table's (vulkan_tuning.h)
        // Many queries (T >= tile_min_t, head_dim <= 128): tiles of queries walking the keys in
        // tiles (attention_tiled.comp), shaped by the tuning table (vulkan_tuning.h).
        uint32_t attention_tile_min_t = 16;
        uint32_t group_wg = 256;  // moe_group, router_aux_loss: one workgroup in all
        // norm_linear with the norm in the matrix-vector product's dispatch (its prologue) up to
        // this many rows, above it the norm's own dispatch: every workgroup of the product
        // computes its rows' statistics, a cost that grows with the rows. On an H200
        // (docs/gpu-results.md, 2026-11-28) the prologue saved 50 us a batch-1 decode step and
        // cost 28 us more than the norms at batch 8 (about 54 us + 11 us a row against 103 us
        // for the step's 16 norm dispatches: even near 5 rows).
        uint32_t norm_prologue_max_rows = 4;
    };
    const Tuning& tuning() const { return tuning_; }

    // ---- the matmul kernels' shapes (KernelTuning; vulkan_tuning.h)
    void log_calls(std::vector<TunableCall>* log) override { call_log_ = log; }
    std::vector<std::string> variants(const TunableCall& call) const override;
    std::string default_variant(const TunableCall& call) const override;
    void force_variant(const std::string& kernel, const std::string& variant) override;
    std::string save_tuning(const std::vector<TunedChoice>& choices) override;
    std::string tuning_path() const override;
    const vk::TuningTable& tuning_table() const { return table_; }
    // "tuned (N shapes, FILE)", "untuned", or "untuned (WHY)": a refused file, or tuning off.
    const std::string& tuning_status() const { return tuning_status_; }

  protected:
    TMX_BACKEND_MEMORY_OP_OVERRIDES
    TMX_BACKEND_FORWARD_OP_OVERRIDES
    // A linear layer's weight is read as stored, or from its fp16 copy (an f32 weight when fp16
    // weights are on).
    void linear_impl(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y,
                     bool accumulate) override;
    // On the device (shaders/argmax_rows.comp, sampling.cpp).
    void argmax_rows_impl(const Tensor& logits, int32_t* tokens) override;
    // Fused forward ops, fewer dispatches at decoding's few rows (else Backend's sequence):
    // moe_route as one workgroup (moe_route.comp, moe.cpp); rope_attention_cached_store with
    // q and k rotated as the split path reads them and the cache write inside its merge
    // (attention_split.comp, attention_combine.comp, attention.cpp);
    // norm_linear as one matrix-vector product that normalizes x's rows as it reads them
    // (matmul_gemv.comp's norm prologue, norm.cpp); grouped_ffn_up as one grouped
    // matrix-vector product with an activation epilogue, and (one token) grouped_ffn_down as
    // one with the combine into the residual (grouped_matmul_gemv.comp, matmul.cpp).
    void moe_route_impl(const Tensor& logits, const Tensor& x, const Tensor& indices,
                        const Tensor& gates, const Tensor& offsets, const Tensor& slot_rows,
                        const Tensor& slot_of, const Tensor& xs) override;
    void rope_attention_cached_store_impl(const Tensor& q, const Tensor& k, const Tensor& v,
                                          const Tensor& positions, double theta,
                                          const Tensor& k_cache, const Tensor& v_cache,
                                          const Tensor& start, const Tensor& out,
                                          int64_t window) override;
    void norm_linear_impl(NormType type, const Tensor& x, const Tensor& norm_weight,
                          const Tensor& norm_bias, float eps, const Tensor& normed, const Tensor& w,
                          const Tensor& b, const Tensor& y) override;
    void grouped_ffn_up_impl(const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w3,
                             const Tensor& b3, const Tensor& offsets, Activation act,
                             const Tensor& pre, const Tensor& up, const Tensor& out) override;
    void grouped_ffn_down_impl(const Tensor& x, const Tensor& w2, const Tensor& b2,
                               const Tensor& offsets, const Tensor& slot_of, const Tensor& gates,
                               const Tensor& ys, const Tensor& out) override;
    // The training ops, fp32 only (no BF16 tensors: convert_impl is Backend's default).
    // Deterministic: no float atomics, every sum in a fixed order.
    TMX_BACKEND_TRAINING_OP_OVERRIDES

  private:
    // Bindings of tensors: read, written, or both. An undefined or empty tensor binds a
    // dummy buffer (the shader does not read it).
    vk::Binding in(const Tensor& t) const;
    vk::Binding out(const Tensor& t) const;
    vk::Binding inout(const Tensor& t) const;
    vk::BufferRange range(const Tensor& t) const;
    // How a shader reads a weight (shaders/weights.glsl): the binding, and the bytes the tensor
    // starts into its first 4-byte word (a 16- or 8-bit tensor may start mid-word; the push
    // constants' offsets count words).
    struct WeightBinding {
        vk::Binding binding;
        uint32_t byte_adjust = 0;
        bool reduced = false;  // read in fewer than 32 bits (stored so, or an fp16 copy)
    };
    // The weight as stored; `shader` becomes the variant that reads its format.
    WeightBinding stored_weight(const Tensor& w, std::string& shader) const;
    // A matmul weight: its fp16 copy if it is f32 and fp16 weights are on (converted now if it
    // has none), else stored_weight(w).
    WeightBinding weight(const Tensor& w, std::string& shader);
    // A norm the matrix-vector product applies to a's rows as it reads them, also writing
    // them to `normed` (norm_linear; bias: layernorm's, or undefined).
    struct NormPrologue {
        NormType type;
        const Tensor& weight;
        const Tensor& bias;
        float eps;
        const Tensor& normed;
    };
    // out[r, n] += column sums of x over range r's rows (shaders/column_sums.comp): one range,
    // all of x's rows, where offsets is undefined (bias_backward), else `ranges` ranges read
    // from offsets on the device (grouped_matmul's d_bias).
    void column_sums(const Tensor& x, const Tensor& offsets, int64_t ranges, const Tensor& out);
    // Whether dense_matmul runs a product of M rows as matrix-vector products.
    static bool dense_gemv(int64_t M);
    // matmul() and linear(): with b_is_weight, b is read through weight(). A norm prologue
    // only where dense_gemv(M) and in dot mode (opts.trans_b, !opts.trans_a).
    void dense_matmul(const Tensor& a, const Tensor& b, const Tensor& out, MatmulOptions opts,
                      const Tensor& bias, bool b_is_weight, const NormPrologue* norm = nullptr);
    // RoPE done inside the split attention path: the chunk's positions and rope_table().
    struct SplitRope {
        Tensor positions, table;
    };
    // attention_cached on the path the query count picks; with `store` (on the split path
    // only, attention.cpp's takes_split_path) its merge also does kv_cache_write, and with
    // `rope` (split path and store only) q and k are rotated as they are read and stored.
    void record_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& k_cache,
                          const Tensor& v_cache, const Tensor& start, const Tensor& out,
                          int64_t window, bool store, const SplitRope* rope = nullptr);
    // grouped_matmul_gemv.comp: pre = grouped_matmul(x, w1, b1, offsets) for few slots; with
    // an epilogue (an activation's elementwise op code, vulkan_activations.h) also out = act(pre),
    // or for kSwiglu up = grouped_matmul(x, w3, b3, offsets) and out = silu(pre) * up. False,
    // recording nothing, where it cannot: w1 and w3 in different formats.
    // grouped_matmul_gemv.comp's push constants after the bindings' offsets, and the pieces
    // every dispatch of it shares: E, Nout, K, w's bias and byte adjustment for x [S, K] and
    // w [E, Nout, K] read as w_read; and the module and specialization constants of the
    // tuned variant at those slots, with the epilogue.
    struct GroupedGemvPush {
        uint32_t E = 0, Nout = 0, K = 0, has_bias = 0, w_adjust = 0, has_bias3 = 0, w3_adjust = 0;
        uint32_t choices = 0;  // the combine's k
    };
    static GroupedGemvPush grouped_gemv_push(const Tensor& x, const Tensor& w, const Tensor& b,
                                             const WeightBinding& w_read);
    std::vector<uint32_t> grouped_gemv_spec(const Tensor& x, const Tensor& w,
                                            const WeightBinding& w_read, uint32_t epilogue,
                                            std::string& shader);
    bool grouped_matmul_gemv(const Tensor& x, const Tensor& w1, const Tensor& b1,
                             const Tensor& offsets, const Tensor& pre, uint32_t epilogue = 0,
                             const Tensor& w3 = {}, const Tensor& b3 = {}, const Tensor& up = {},
                             const Tensor& out = {});

    // The variant a tunable call of `kernel` runs with (the tuning table's choice at the
    // kernel's shape of the call), logged while call_log_ is set.
    vk::Variant choose(vk::Kernel kernel, TunableCall call);
    // Loads the tuning file the options or the environment name (vulkan_tuning.h).
    void load_tuning(const vk::VulkanOptions& options);

    // Records shader `shader` (specialization constants spec) over the bindings, with the
    // op's push constants (a struct of 4-byte fields) after the per-binding offsets.
    template <class Push>
    void run(const std::string& shader, std::initializer_list<uint32_t> spec,
             std::initializer_list<vk::Binding> bindings, const Push& push, uint32_t gx,
             uint32_t gy = 1, uint32_t gz = 1) {
        run(shader, std::vector<uint32_t>(spec), bindings, push, gx, gy, gz);
    }
    template <class Push>
    void run(const std::string& shader, const std::vector<uint32_t>& spec,
             std::initializer_list<vk::Binding> bindings, const Push& push, uint32_t gx,
             uint32_t gy = 1, uint32_t gz = 1) {
        static_assert(sizeof(Push) % 4 == 0);
        const vk::Pipeline& p =
            pipelines_->get(shader, static_cast<uint32_t>(bindings.size()), spec);
        stream_->dispatch(p, {bindings.begin(), bindings.size()}, &push, sizeof(Push), gx, gy, gz);
    }
    // Workgroups for n items, wg per workgroup, as a 2-D grid (x then y; group_index()).
    std::pair<uint32_t, uint32_t> grid(uint64_t n, uint32_t wg) const;
    // activation_backward.comp with operation op (y and d_y: swiglu's up and its gradient).
    void record_activation_backward(uint32_t op, const Tensor& x, const Tensor& y,
                                    const Tensor& d_out, const Tensor& d_x, const Tensor& d_y);
    // An elementwise shader (one invocation per element; specialization constants WG and OP;
    // push constants: n after the binding offsets) over n elements.
    void run_elementwise(const std::string& shader, uint32_t op, uint64_t n,
                         std::initializer_list<vk::Binding> bindings);
    // elementwise.comp with operation op over n elements.
    void elementwise(uint32_t op, const Tensor& x, const Tensor& y, const Tensor& out);
    // Throws tmx::Error for an error a shader reported since the last sync.
    void check_status();
    // The rope table of (theta, head_dim): per frequency, turns per position as 64-bit fixed
    // point (rope.comp). Built once and kept on the device.
    const Tensor& rope_table(double theta, int64_t head_dim);

    std::shared_ptr<vk::Context> ctx_;
    std::shared_ptr<vk::Allocator> allocator_;
    // Before stream_, which calls it on writes: destroyed after it. Shared with the release
    // hooks of buffers, which may outlive the backend (they hold a weak_ptr).
    std::shared_ptr<vk::Fp16Weights> fp16_;
    std::unique_ptr<vk::Pipelines> pipelines_;
    std::unique_ptr<vk::Stream> stream_;
    // While a step is being recorded: where its own allocations are kept.
    std::vector<std::shared_ptr<DeviceBuffer>>* pinned_ = nullptr;
    // Recordings may outlive the backend: they reach its stream only while this is set.
    std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
    Tuning tuning_;
    vk::TuningTable table_;
    std::string tuning_status_ = "untuned";
    std::vector<TunableCall>* call_log_ = nullptr;
    std::optional<int64_t> profiled_barriers_;  // the last end_profile()'s
    Tensor dummy_;
    std::map<std::pair<double, int64_t>, Tensor> rope_tables_;
};

}  // namespace tmx

// The Backend interface: the seam between the engine and each device
// (docs/design.md#15-layering).
//
// Every op is *enqueued*: a GPU backend records or launches it and returns at once, the CPU
// backend may run it on the spot. Tensors stay on the device between ops; the host reads back
// only through download(), which waits for the work that produces the data.
//
// Each op's contract (shapes, layout, semantics) is written here once. The public methods check
// shapes and dtypes, then call the backend's *_impl; a shape mismatch is an engine bug and
// throws std::logic_error naming the op and the shapes.
//
// Layout conventions: row-major; an activation matrix is [N, features] with N = B*T tokens,
// token n = b*T + t. Linear weights are [out, in] (Hugging Face's layout): a linear layer is
// linear(x, W, b, y), which names W as a weight. Integer tensors (token ids, expert ids) are I32.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/compute/backend_ops.h"
#include "engine/compute/op_kinds.h"
#include "engine/compute/precision.h"
#include "engine/compute/tensor.h"
#include "engine/compute/weight_format.h"

namespace tmx {

struct MatmulOptions {
    bool trans_a = false;     // a is stored [K, M]
    bool trans_b = false;     // b is stored [N, K]
    bool accumulate = false;  // out += result, instead of out = result
};

class Backend {
  public:
    virtual ~Backend() = default;
    virtual std::string name() const = 0;
    // The backend and what it runs on, for logs and benchmark reports.
    virtual std::string description() const { return name(); }
    // Whether the backward and optimizer ops exist (a training backend). Where they do not,
    // each throws tmx::Error saying so; Trainer checks this up front.
    virtual bool supports_training() const { return false; }
    // The most memory the backend's tensors can take, in bytes (the CPU: the machine's physical
    // memory), or 0 when unknown. Trainer refuses a run whose memory estimate exceeds it.
    virtual uint64_t memory_capacity() const { return 0; }

    // ---- the mode: precision and training (what the ops compute until a ModeScope ends)
    // The precision of matmul(), grouped_matmul() and grouped_matmul_backward()'s d_x and d_w
    // products: F32 (the default), or BF16: every operand element is rounded to bfloat16
    // (round_to_bf16) before it is multiplied, products are summed in fp32 and results are fp32
    // (biases, d_bias and accumulated outputs are fp32 and not rounded). BF16 also rounds the
    // products of attention() and attention_backward() when head_dim <= kBf16AttentionMaxHeadDim
    // (attention_in_bf16; their comments say which values); attention_cached() and every other
    // op are fp32 either way. BF16 where a backend lacks it is a tmx::Error naming the backend.
    virtual bool supports_precision(Precision p) const { return p == Precision::F32; }
    // What training and inference use unless told otherwise: BF16 where the hardware multiplies
    // bf16 faster (tensor cores; the model then also reads bf16 copies of its weights, half the
    // bytes a decode step moves), F32 elsewhere (the CPU only emulates bf16's rounding).
    virtual Precision default_precision() const { return Precision::F32; }
    // The device's published dense peak for matmuls in precision p, in TFLOP/s (tmx bench's MFU
    // when no --peak-tflops is given); 0 where unknown, as on every CPU.
    virtual double spec_peak_tflops(Precision) const { return 0.0; }
    struct Mode {
        Precision precision = Precision::F32;  // of the matmuls and attention (above)
        // Training mode: while on, every op computes its contract in the matmul precision, with
        // no inference-only shortcut (the Vulkan backend's fp16 copies of f32 weights), since
        // the weights change at every step.
        bool training = false;
    };
    // Sets the mode where a pass starts (a command's backend, a trainer, a benchmark's run)
    // and restores the one before when the scope ends, however it ends, so that the mode an
    // op runs in is written where its pass begins:
    //   Backend::ModeScope mode(be, {.precision = Precision::BF16, .training = true});
    // Scopes nest: each restores what the one outside it set. A backend starts in {F32, no
    // training}. Throws tmx::Error for a precision the backend lacks.
    class ModeScope {
      public:
        ModeScope(Backend& be, Mode mode);
        ~ModeScope() { be_.mode_ = before_; }
        ModeScope(const ModeScope&) = delete;
        ModeScope& operator=(const ModeScope&) = delete;

      private:
        Backend& be_;
        Mode before_;
    };
    Precision matmul_precision() const { return mode_.precision; }
    bool training_mode() const { return mode_.training; }

    // ---- bf16 tensors
    // A backend with BF16 precision also has BF16 tensors (alloc() refuses them elsewhere). An
    // op reads a BF16 element as the exact value it holds and stores one rounded with
    // round_to_bf16. Ops take them only where listed:
    //  - convert(), F32 to BF16 and back;
    //  - the out of norm(), activation(), swiglu() and cross_entropy_backward() (d_logits),
    //    and of attention() where attention_in_bf16(matmul_precision(), head_dim);
    //  - gather_rows() with x and out both BF16;
    //  - in BF16 precision only, the operands (never out or bias) of matmul(), x and w of
    //    linear(), grouped_matmul() and grouped_matmul_backward(), and x, w and (without d_b)
    //    d_y of linear_backward(): these round their operands to bf16 anyway, so a BF16
    //    operand gives exactly the result of its fp32 value.
    // So a model in BF16 precision can keep bf16 copies of its weights and store the
    // activations only matmuls read as BF16: half their memory and traffic, the same results.
    // upload(), download() and copy() move elements of any dtype as they are (BF16: the
    // 16-bit patterns, as round_to_bf16's result's upper half).
    bool has_bf16_tensors() const { return supports_precision(Precision::BF16); }
    // dst = src, F32 to BF16 (rounded to nearest even) or BF16 to F32 (exact), same shape.
    void convert(const Tensor& src, const Tensor& dst);

    // ---- weights stored in 16 and 8 bits (inference)
    // Whether the backend reads weights stored in format t (engine/compute/weight_format.h) in
    // any precision: F32 always; BF16, F16 and Q8_0 where this says so. Then alloc() makes
    // tensors of t, upload() and download() move their bytes as they are, and t may be the
    // dtype of w in linear() and grouped_matmul() and of x in gather_rows() (an embedding
    // table; those ops only). Each reads a weight as the value its format holds (Q8_0: scale *
    // int8); the matmuls multiply it with x as the precision says for x, and a backend may also
    // quantize x to Q8_0 blocks for int8 products with a Q8_0 weight (the CPU does:
    // backends/cpu/cpu_backend.h).
    // A Q8_0 weight's rows are whole blocks of 32 values.
    virtual bool supports_weight_format(DType t) const { return t == DType::F32; }

    // ---- memory and transfers
    Tensor alloc(Shape shape, DType dtype = DType::F32);
    // Bytes of the buffers alloc() made that are still referenced, and the most there were at
    // once since the backend was made or reset_peak_memory() was called.
    struct MemoryStats {
        size_t live_bytes = 0, peak_bytes = 0;
    };
    MemoryStats memory_stats() const { return *memory_; }
    void reset_peak_memory() { memory_->peak_bytes = memory_->live_bytes; }
    // Copies host data (numel elements of the tensor's dtype) to the device. The host pointer
    // may be reused as soon as this returns.
    void upload(const Tensor& dst, const void* host);
    // Waits for pending work on the tensor, then copies it to host memory.
    void download(const Tensor& src, void* host);
    void fill(const Tensor& dst, float value);  // F32 tensors
    void copy(const Tensor& src, const Tensor& dst);
    // Waits until every enqueued op has finished.
    virtual void synchronize() = 0;

    // ---- recorded steps
    // A step a caller repeats on the same tensors with new contents (a decode step: the same
    // weights, cache and workspace) can be recorded once and replayed, which saves the host's
    // cost of issuing each op. run_recorded(rec, body): a backend that records (CUDA: a CUDA
    // graph) calls body() normally the first time, records the ops it enqueues the second time,
    // and after that replays the recording without calling body. So body may only enqueue ops
    // (no upload, download or synchronize); everything it decides on the host (shapes,
    // precision, which tensors) must be the same every time, since only tensor contents may
    // differ between steps; and the tensors it uses must outlive rec, except those body
    // allocates itself, which rec keeps. Backends that do not record call body() every time.
    struct StepRecording {
        int runs = 0;                 // times body has run
        std::shared_ptr<void> graph;  // the backend's recording, once made
    };
    virtual void run_recorded(StepRecording& rec, const std::function<void()>& body) {
        ++rec.runs;
        body();
    }

    // ---- device timing (tmx bench --profile)
    // Where a step's device time goes. Between begin_profile() and end_profile(), a backend
    // that can_profile() times every command it runs on the device; end_profile() waits for
    // them and returns, per kind of command (a kernel or shader, or a copy), how many ran and
    // the time they took, in the order each kind first ran. A command's time runs from the end
    // of the command before it to its own end, so a wait between two commands counts towards
    // the second, and the times add up to the span the device was working on the step. While
    // profiling, run_recorded() runs body() every time, so each op's commands are timed.
    struct ProfiledCommands {
        std::string name;
        int64_t count = 0;
        double seconds = 0;
    };
    virtual bool can_profile() const { return false; }
    virtual void begin_profile();                         // throws tmx::Error when !can_profile()
    virtual std::vector<ProfiledCommands> end_profile();  // logic_error without begin_profile()
    // After end_profile(): how many times the profiled commands waited for the ones before
    // them (pipeline barriers: what a GPU's step pays per dependency besides each command's
    // launch), or nullopt where the backend does not count them.
    virtual std::optional<int64_t> profiled_barriers() const { return std::nullopt; }

    // ---- forward ops
    // out[s, :] = x[rows[s], :].   x [N, d], rows [S] (I32, each in [0, N)), out [S, d]. The
    // model's token embedding (x the table, rows the token ids) and its gather of token rows
    // into expert order (moe_group's slot_rows). x is F32 with out F32; or BF16 with out BF16,
    // copied as it is (a backend with BF16 tensors); or a weight stored in BF16, F16 or Q8_0
    // where supports_weight_format() says so, with out F32: each value as its format holds it.
    // A row outside [0, N) throws: at once on the CPU, at the next sync point on a GPU.
    void gather_rows(const Tensor& x, const Tensor& rows, const Tensor& out);

    // out = norm(x) * weight (+ bias): layernorm (mean and biased variance) or rmsnorm over the
    // last dimension. x, out [N, d]; weight [d]; bias [d] for layernorm, undefined for rmsnorm.
    void norm(NormType type, const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
              const Tensor& out);

    // out[M, N] (+)= op(a) [M, K] . op(b) [K, N] (+ bias[N] once, when given).
    void matmul(const Tensor& a, const Tensor& b, const Tensor& out, MatmulOptions opts = {},
                const Tensor& bias = {});

    // A linear layer: y (+)= x . w^T (+ b once, when given), x [N, in], w [out, in], b [out],
    // y [N, out]: exactly matmul(x, w, y, {.trans_b = true, .accumulate = accumulate}, b), but
    // with w named as a weight, which a backend may read from a copy it keeps (Vulkan's fp16
    // weights); matmul() never does. BF16 operands as for matmul().
    void linear(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y,
                bool accumulate = false);

    // Rotates x [N, heads, head_dim] in place by its token's position (positions [N], I32):
    // rotate-half pairs (i, i + head_dim/2), angle = pos * theta^(-2i/head_dim). With inverse,
    // rotates by -angle: the transpose, which is also rope's backward.
    void rope(const Tensor& x, const Tensor& positions, double theta, bool inverse = false);

    // Causal sliding-window GQA attention inside each of B sequences of T tokens:
    // out_i = softmax_j(q_i . k_j / sqrt(head_dim)) v_j over i - window < j <= i (window 0 =
    // unlimited). q, out [B, T, H, hd]; k, v [B, T, Hkv, hd]; query head h reads kv head
    // h / (H / Hkv).
    // In BF16 precision with hd <= kBf16AttentionMaxHeadDim (attention_in_bf16), where bf16(x)
    // = round_to_bf16(x), scale = 1 / sqrt(hd) and J(i) are the keys query i sees:
    //   s_j = (bf16(q_i) . bf16(k_j)) * scale,  m = max_{j in J(i)} s_j,  e_j = exp(s_j - m),
    //   l = sum_j e_j (unrounded),  out_i = (sum_j bf16(e_j) bf16(v_j)) / l,
    // all in fp32. Tensor cores multiply bf16, so the weights are rounded before their product
    // with v, as FlashAttention does. A GPU rounds e_j against a running max (online softmax):
    // its weights may differ from these by one bf16 ulp (each is within a relative 2^-8 of the
    // exact e_j).
    void attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                   int64_t window);

    // The same attention for a chunk of new tokens against a rolling KV cache
    // (docs/design.md#6-rolling-kv-cache-and-generation), in fp32 under either precision.
    // Sequence b's chunk holds T tokens at positions start[b] .. start[b] + T - 1; its cache
    // k_cache[b], v_cache[b] [S, Hkv, hd] holds its earlier positions p in
    // [max(0, start[b] - S), start[b]), position p in slot p mod S (other slots are not read).
    // The query at position p attends to every cached or chunk position j with
    // p - window < j <= p (window 0 = unlimited; then S must cover every earlier position).
    // q, out [B, T, H, hd]; k, v [B, T, Hkv, hd] (the chunk's own keys and values, keys after
    // RoPE); k_cache, v_cache [B, S, Hkv, hd]; start [B] (I32, >= 0).
    void attention_cached(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& k_cache,
                          const Tensor& v_cache, const Tensor& start, const Tensor& out,
                          int64_t window);
    // Stores the chunk's keys and values in the cache after attention_cached() has read it:
    // position start[b] + t goes to slot (start[b] + t) mod S, in increasing t (a chunk longer
    // than S leaves its last S positions). Shapes as for attention_cached().
    void kv_cache_write(const Tensor& k, const Tensor& v, const Tensor& k_cache,
                        const Tensor& v_cache, const Tensor& start);

    // Router: for each row of logits [N, E], the indices of the top_k largest (ties: lower
    // index first; listed in descending logit order) into indices [N, k] (I32), and the
    // softmax of those k logits into gates [N, k].
    void router_topk(const Tensor& logits, const Tensor& indices, const Tensor& gates);

    // Groups the N*k (token, choice) slots by expert, stably: offsets [E+1] (I32) are the
    // prefix sums of per-expert counts; sorted slot s in [offsets[e], offsets[e+1]) belongs to
    // expert e, slot_rows[s] is its token; slot_of[n*k + j] is the sorted slot of token n's
    // j-th choice. Runs on the device: no host round trip.
    void moe_group(const Tensor& indices, int64_t n_experts, const Tensor& offsets,
                   const Tensor& slot_rows, const Tensor& slot_of);

    // One matmul over all experts: out[s, :] = x[s, :] . w[e]^T (+ bias[e]) for every sorted
    // slot s of expert e (offsets as moe_group gives). x [S, K], w [E, Nout, K], bias [E, Nout]
    // or undefined, out [S, Nout].
    void grouped_matmul(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& offsets,
                        const Tensor& out);

    // out[n, :] += sum_j gates[n, j] * expert_out[slot_of[n*k + j], :], j in ascending order.
    // expert_out [N*k, d], slot_of [N*k] (I32), gates [N, k], out [N, d].
    void moe_combine(const Tensor& expert_out, const Tensor& slot_of, const Tensor& gates,
                     const Tensor& out);

    // out = act(x), elementwise (gelu is the tanh approximation; relu2 = relu(x)^2).
    void activation(Activation act, const Tensor& x, const Tensor& out);
    // out = silu(gate) * up, elementwise.
    void swiglu(const Tensor& gate, const Tensor& up, const Tensor& out);
    // out = a + b, elementwise (out may alias a or b).
    void add(const Tensor& a, const Tensor& b, const Tensor& out);

    // losses[n] = logsumexp(logits[n, :]) - logits[n, targets[n]]; a target of -1 gives 0.
    // logits [N, V], targets [N] (I32), losses [N].
    void cross_entropy(const Tensor& logits, const Tensor& targets, const Tensor& losses);

    // Load-balancing loss of one MoE layer into out [1]: E * sum_e f_e * P_e, f_e = fraction
    // of tokens whose top-k holds e, P_e = mean over tokens of softmax(logits)_e.
    // logits [N, E], indices [N, k] (I32).
    void router_aux_loss(const Tensor& logits, const Tensor& indices, const Tensor& out);

    // Greedy decoding's token per row, on the host: element n is the first index of the
    // largest value of logits[n, :], or -1 where the row holds a NaN or an infinity (which no
    // draw may pass over silently). logits [N, V] F32, V >= 1. A backend may take the argmax
    // on its device and download N tokens rather than N rows of logits (Vulkan); by default
    // the host downloads the logits.
    std::vector<int32_t> argmax_rows(const Tensor& logits);

    // ---- fused forward ops
    // Each is the sequence of forward ops its comment names, on the same tensors, and equals
    // it within those ops' tolerances: one op so that a backend may run it as fewer commands
    // (a decode step is bound by their number, not by its arithmetic). Shapes and dtypes are
    // those of the ops in the sequence. A backend that does not fuse one runs the sequence.

    // normed = norm(x); then y = linear(normed, w, b) (no accumulation). The attention block's
    // norm with the q (or the fused qkv) projection, the feed-forward block's with the router,
    // the final norm with the classifier.
    void norm_linear(NormType type, const Tensor& x, const Tensor& norm_weight,
                     const Tensor& norm_bias, float eps, const Tensor& normed, const Tensor& w,
                     const Tensor& b, const Tensor& y);

    // A decoding step's attention: rope(q, positions, theta) and rope(k, positions, theta) (q
    // and k as [B * T, heads, head_dim], positions [B * T]); attention_cached(q, k, v, k_cache,
    // v_cache, start, out, window); then kv_cache_write(k, v, k_cache, v_cache, start). q and k
    // are scratch: afterwards they may hold the rotated values or the given ones (a backend
    // may rotate them as it reads them). out and the cache are the sequence's.
    void rope_attention_cached_store(const Tensor& q, const Tensor& k, const Tensor& v,
                                     const Tensor& positions, double theta, const Tensor& k_cache,
                                     const Tensor& v_cache, const Tensor& start, const Tensor& out,
                                     int64_t window);

    // MoE routing from the router's logits [N, E]: router_topk(logits, indices, gates);
    // moe_group(indices, E, offsets, slot_rows, slot_of); gather_rows(x, slot_rows, xs) (x F32
    // [N, d], or BF16 with xs BF16, as gather_rows takes them).
    void moe_route(const Tensor& logits, const Tensor& x, const Tensor& indices,
                   const Tensor& gates, const Tensor& offsets, const Tensor& slot_rows,
                   const Tensor& slot_of, const Tensor& xs);

    // The first half of the experts' feed-forward: pre = grouped_matmul(x, w1, b1, offsets);
    // then, without w3, out = activation(act, pre); with w3 (SwiGLU, `act` unused), up =
    // grouped_matmul(x, w3, b3, offsets) and out = swiglu(pre, up). pre (and up) are kept for
    // the backward.
    void grouped_ffn_up(const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w3,
                        const Tensor& b3, const Tensor& offsets, Activation act, const Tensor& pre,
                        const Tensor& up, const Tensor& out);
    // The second half: ys = grouped_matmul(x, w2, b2, offsets), then moe_combine(ys, slot_of,
    // gates, out) (out[n, :] += sum_j gates[n, j] ys[slot_of[n k + j], :], j ascending). ys is
    // kept for the backward.
    void grouped_ffn_down(const Tensor& x, const Tensor& w2, const Tensor& b2,
                          const Tensor& offsets, const Tensor& slot_of, const Tensor& gates,
                          const Tensor& ys, const Tensor& out);

    // ---- backward ops
    // Gradient outputs (d_*) are *accumulated into* (+=) unless the op says otherwise, so a
    // tensor read in several places collects every contribution; callers zero them first.

    // Backward of gather_rows(): d_x[rows[s], :] += d_out[s, :] in increasing s, so a row that
    // rows names several times (a token repeated in a batch) adds its d_out rows in that order.
    // d_x, d_out F32.
    void gather_rows_backward(const Tensor& rows, const Tensor& d_out, const Tensor& d_x);

    // Backward of norm(): d_x, d_weight and (layernorm) d_bias accumulate.
    void norm_backward(NormType type, const Tensor& x, const Tensor& weight, const Tensor& d_out,
                       float eps, const Tensor& d_x, const Tensor& d_weight, const Tensor& d_bias);

    // d_bias[N] += sum over rows of d_out [M, N] (the bias gradient of a linear layer).
    void bias_backward(const Tensor& d_out, const Tensor& d_bias);

    // Backward of linear(): d_x += d_y . w, then d_w += d_y^T . x, then (when defined)
    // bias_backward(d_y, d_b): the products of matmul() in that order. x and w as for linear().
    void linear_backward(const Tensor& x, const Tensor& w, const Tensor& d_y, const Tensor& d_x,
                         const Tensor& d_w, const Tensor& d_b);

    // Backward of attention(): recomputes the softmax from q and k. In BF16 precision with
    // hd <= kBf16AttentionMaxHeadDim, with q^, k^, v^, dO^ = bf16 of q, k, v, d_out and s, m, l
    // from them as in attention(), all in fp32:
    //   P_ij = exp(s_ij - m_i) / l_i,  dP_ij = dO^_i . v^_j,  D_i = sum_j P_ij dP_ij (unrounded P),
    //   dS_ij = P_ij (dP_ij - D_i),  d_q_i += scale sum_j bf16(dS_ij) k^_j,
    //   d_k_j += scale sum_i bf16(dS_ij) q^_i,  d_v_j += sum_i bf16(P_ij) dO^_i:
    // P and dS are rounded before their products, as the forward's weights are.
    void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& d_out,
                            const Tensor& d_q, const Tensor& d_k, const Tensor& d_v,
                            int64_t window);

    // d_logits (+)= gradient through the gate softmax (from d_gates [N, k]) plus, when
    // aux_weight > 0, through the load-balancing loss aux_weight * router_aux_loss(logits,
    // indices): only via the mean router probabilities P (the counts f are constants).
    void router_backward(const Tensor& logits, const Tensor& indices, const Tensor& gates,
                         const Tensor& d_gates, float aux_weight, const Tensor& d_logits);

    // Backward of grouped_matmul(): d_x, d_w and (when defined) d_bias accumulate.
    void grouped_matmul_backward(const Tensor& x, const Tensor& w, const Tensor& offsets,
                                 const Tensor& d_out, const Tensor& d_x, const Tensor& d_w,
                                 const Tensor& d_bias);

    // Backward of moe_combine(): d_expert_out and d_gates accumulate.
    void moe_combine_backward(const Tensor& expert_out, const Tensor& slot_of, const Tensor& gates,
                              const Tensor& d_out, const Tensor& d_expert_out,
                              const Tensor& d_gates);

    // d_x += act'(x) * d_out.
    void activation_backward(Activation act, const Tensor& x, const Tensor& d_out,
                             const Tensor& d_x);
    // Backward of swiglu(): d_gate and d_up accumulate.
    void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& d_out,
                         const Tensor& d_gate, const Tensor& d_up);

    // Writes (does not accumulate) d_logits = scale * (softmax(logits) - onehot(target)) per
    // row; rows whose target is -1 get 0.
    void cross_entropy_backward(const Tensor& logits, const Tensor& targets, float scale,
                                const Tensor& d_logits);

    // ---- optimizer support
    // out[0] = sum of squares of x (accumulated in double where the backend can).
    void sum_squares(const Tensor& x, const Tensor& out);
    // x *= s, elementwise.
    void scale(const Tensor& x, float s);
    // One AdamW step (PyTorch's formulation) over flat tensors of equal shape: decoupled decay
    // p -= lr * weight_decay * p on every element; m, v moments; bias-corrected update. A model
    // steps its decayed and undecayed tensors in separate calls, on views of its flat tensors
    // (adamw_step in engine/train/trainer.h), so no per-element mask is stored. `step` is
    // the 1-based step count after this update. The gradient used is grads * grad_scale (one
    // fp32 multiply per element: the same values as scale(grads, grad_scale) first), so that
    // gradient clipping costs no pass of its own; grads itself is left as it is.
    struct AdamWParams {
        float lr, beta1, beta2, eps, weight_decay;
        int64_t step;
        float grad_scale = 1.0f;
    };
    void adamw(const Tensor& params, const Tensor& grads, const Tensor& m, const Tensor& v,
               const AdamWParams& hp);

  protected:
    // The *_impl functions the public methods call after their checks. Their lists are in
    // engine/compute/backend_ops.h (which says what each list holds); a backend declares its
    // overrides from the same lists (TMX_BACKEND_FORWARD_OP_OVERRIDES and the like).
    // alloc_impl: the buffer's memory stays allocated until the last Tensor referring to it is
    // gone.
    TMX_BACKEND_MEMORY_OPS(TMX_BACKEND_DECLARE_PURE_IMPL)
    // Only backends with BF16 tensors are asked; the default says there are none.
    virtual void convert_impl(const Tensor& src, const Tensor& dst);

    TMX_BACKEND_FORWARD_OPS(TMX_BACKEND_DECLARE_PURE_IMPL)
    // By default the matmul_impl (and bias_backward_impl) calls the contracts state; a backend
    // that treats weights apart overrides them.
    virtual void linear_impl(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y,
                             bool accumulate);
    virtual void linear_backward_impl(const Tensor& x, const Tensor& w, const Tensor& d_y,
                                      const Tensor& d_x, const Tensor& d_w, const Tensor& d_b);
    // The fused forward ops: by default each runs its sequence's *_impl functions.
    TMX_BACKEND_FUSED_OPS(TMX_BACKEND_DECLARE_DEFAULT_IMPL)
    // Writes logits.dim(0) tokens to `tokens` (host memory); by default from the downloaded
    // logits.
    virtual void argmax_rows_impl(const Tensor& logits, int32_t* tokens);
    // The backward and optimizer ops. A backend that does not train leaves them alone: each
    // throws tmx::Error ("<op> is not available on the <name> backend ...").
    TMX_BACKEND_TRAINING_OPS(TMX_BACKEND_DECLARE_DEFAULT_IMPL)

  private:
    [[noreturn]] void training_op_unavailable(const char* op) const;
    Mode mode_;  // set only by ModeScope
    // Shared with every buffer's release hook, so buffers may outlive the backend object.
    std::shared_ptr<MemoryStats> memory_ = std::make_shared<MemoryStats>();
};

}  // namespace tmx

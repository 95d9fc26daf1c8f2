// The tiny-mixtral model on a Backend: parameters named and initialised (seeded) as
// docs/design.md#10-parameters-and-initialisation says, and the forward pass of
// docs/design.md#3-forward-pass.
//
// All parameters live in one flat fp32 device tensor, in the order of model_param_layout().
// Each layer's experts are consecutive, so the stacked [E, d_ff, d] expert weights the grouped
// matmul needs are plain views of that tensor.
//
// In BF16 precision the model keeps a bf16 copy of that tensor, which the matmuls read, and
// stores the activations that only matmuls read (the norms' outputs, attention's output, the
// FFN activation, the expert-sorted inputs, and the classifier's d_logits) as BF16 tensors. The
// matmuls round their operands to bf16 anyway (engine/compute/backend.h), so this gives the same
// results as fp32 storage with half the memory and traffic, and no rounding copies per matmul.
//
// For inference a model may instead keep its weights in a 16- or 8-bit format
// (engine/compute/weight_format.h), on a backend that reads that format: then the matmul
// weights and the embedding table are held in it, packed into one flat tensor per stored dtype
// (stored_dtype below), and only the norms, biases and router stay fp32; there is no fp32 copy
// of the whole model. Such a model does not train.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "engine/compute/backend.h"
#include "engine/model/config.h"
#include "engine/model/kv_cache.h"
#include "engine/model/training_memory.h"

namespace tmx {

enum class ParamInit { Normal, Zeros, Ones };

struct ParamSpec {
    std::string name;
    Shape shape;
    ParamInit init = ParamInit::Normal;
    double init_std = 0.0;  // for Normal
    bool decay = false;     // AdamW weight decay: 2-D weights except the token embedding
    int64_t offset = 0;     // in elements, into the flat parameter tensor
    int64_t numel() const { return shape_numel(shape); }
};

struct ParamLayout {
    std::vector<ParamSpec> specs;
    int64_t total = 0;
    // The spec of that name, or nullptr.
    const ParamSpec* find(const std::string& name) const;
};

ParamLayout model_param_layout(const ModelConfig& config);

// The dtype a model with weights in `weight_format` stores parameter s in: the format for the
// 2-D weights (the matmuls' and the embedding table), except Q8_0 rows that are not whole blocks
// of 32, which are F16 (as llama.cpp falls back); F32 for the norms, biases and the router
// (routing decisions are sensitive to it, and it is tiny; llama.cpp keeps it F32 too).
DType stored_dtype(const ParamSpec& s, DType weight_format);
std::vector<ParamSpec> model_param_specs(const ModelConfig& config);

// Views of one layer's weights inside the flat parameter tensor. Undefined when the config
// has no such parameter (biases off, rmsnorm, dense FFN vs experts).
struct LayerWeights {
    Tensor input_norm_w, input_norm_b, post_norm_w, post_norm_b;
    Tensor wq, bq, wk, bk, wv, bv, wo, bo;
    // [q_dim + 2 kv_dim, d]: wq, wk and wv as one matrix, where the layout has them back to
    // back (no attention biases between them); undefined otherwise.
    Tensor wqkv;
    Tensor router;  // [E, d]
    // Expert FFN, stacked over experts: w1/w3 [E, d_ff, d], w2 [E, d, d_ff], biases [E, *].
    // For a dense FFN the leading E dimension is absent.
    Tensor w1, b1, w2, b2, w3, b3;
};

// What a training forward pass keeps for the backward pass, per layer. Under bf16 storage
// (see the top) a1, a2, xs, act and (where attention runs in bf16) att are BF16.
struct LayerActivations {
    Tensor h_in, h_mid;   // residual stream entering the layer / after attention
                          // (kept for backward only)
    Tensor a1, a2;        // outputs of the two norms
    Tensor q, k, v, att;  // q and k after RoPE; att = attention output
    Tensor qkv;           // decoding one token: [1, q_dim + 2 kv_dim], q, k and v
                          // its slices (one matmul, one RoPE); else undefined
    Tensor router_logits, top_idx, gates, offsets, slot_rows, slot_of;  // MoE routing
    Tensor xs;            // a2 gathered into expert-sorted slots (MoE)
    Tensor pre, up, act;  // FFN: w1 output, w3 output (swiglu), activation output
                          // (in training one buffer for every layer: see backward())
    Tensor ys;            // expert outputs per slot (MoE)
};

struct ForwardResult {
    // [B*T, V], on the device; undefined after a training forward (keep_activations), whose
    // classifier runs in chunks of rows and never holds every logit at once.
    Tensor logits;
    double loss = 0.0;      // mean cross-entropy over the targets given (>= 0), without aux
    int64_t n_targets = 0;  // number of targets that were scored
    double aux = 0.0;       // load-balancing loss, mean over layers (0 for dense models)
    // With kept activations, for MoE models: per layer, how many (token, choice) slots each
    // expert received.
    std::vector<std::vector<int64_t>> expert_slots;
};

class Model {
  public:
    // Allocates the parameters on `backend` (uninitialised), the weights in `weight_format`
    // (see the top; a format the backend cannot hold is a tmx::Error).
    Model(const ModelConfig& config, Backend& backend, DType weight_format = DType::F32);

    const ModelConfig& config() const { return config_; }
    const ParamLayout& layout() const { return layout_; }
    Backend& backend() const { return backend_; }
    DType weight_format() const { return weight_format_; }
    // Every parameter in layout order (fp32 weights); with weights in another format, only the
    // parameters stored in fp32, packed.
    const Tensor& params() const { return params_; }
    // Whoever writes params() directly (an optimizer step) calls this afterwards, so that the
    // bf16 copy of the weights is refreshed before the next pass reads it.
    void params_changed() { bf16_weights_current_ = false; }
    // In BF16 precision, whether weights and matmul-only activations are stored in bf16 (the
    // default) or kept fp32: for checking that bf16 storage changes no result.
    void set_bf16_storage(bool on) { bf16_storage_enabled_ = on; }
    int64_t num_params() const { return layout_.total; }

    // The initialisation of docs/design.md#10-parameters-and-initialisation: weights
    // N(0, 0.02), o_proj and w2 N(0, 0.02/sqrt(2L)), biases 0, norm weights 1. Each tensor
    // draws from its own stream of `seed`.
    void init_random(uint64_t seed);

    // Every parameter in fp32, in layout order (weights in another format decoded), and back
    // (encoded into each parameter's stored dtype).
    std::vector<float> params_to_host() const;
    void params_from_host(const std::vector<float>& values);
    // Sets one parameter from host data in `format`: its stored dtype's bytes as they are, or
    // fp32 values encoded into it (any other format is a logic_error).
    void set_param(const std::string& name, DType format, const void* data);
    // The named parameter's view (in its stored dtype).
    Tensor param(const std::string& name) const;

    // Runs tokens [B, T] (row-major, positions 0..T-1 in each row). With targets [B*T] (-1 =
    // not scored) it also computes the mean cross-entropy and the aux loss. With
    // keep_activations (needs targets) it keeps what backward() needs.
    ForwardResult forward(const std::vector<int32_t>& tokens, int64_t B, int64_t T,
                          const std::vector<int32_t>* targets = nullptr,
                          bool keep_activations = false);
    // forward() with targets for evaluation: the loss, aux and counts without the logits
    // (ForwardResult::logits stays undefined). The classifier runs in chunks of rows, as in
    // training, so the [B*T, V] logits never exist whole.
    ForwardResult forward_loss(const std::vector<int32_t>& tokens, int64_t B, int64_t T,
                               const std::vector<int32_t>& targets);

    // Generation: a chunk of T new tokens for each of B sequences (tokens [B, T]); sequence b's
    // chunk is at positions start[b] .. start[b] + T - 1 and attends to what `cache` holds of
    // its earlier positions, then is written into the cache. Returns the logits of each
    // sequence's last chunk token, [B, V] on the device.
    //
    // every_position, where given, also receives the logits of every chunk token (for scoring a
    // prompt), in blocks of `block_rows` rows in order: (first row of the block in tokens'
    // order, its logits [n, V] on the device, valid during the call). By default (0) a block
    // holds at most kLogitsBlockElements logits, so a long chunk's [B*T, V] never exist whole.
    using LogitsBlock = std::function<void(int64_t first_row, const Tensor& logits)>;
    static constexpr int64_t kLogitsBlockElements = int64_t{1} << 22;
    Tensor forward_cached(const std::vector<int32_t>& tokens, int64_t B, int64_t T,
                          const std::vector<int32_t>& start, const KvCache& cache,
                          const LogitsBlock& every_position = {}, int64_t block_rows = 0);

    // Gradients of loss_scale * (mean cross-entropy + router_aux_loss_coef * aux) of the last
    // forward(..., keep_activations = true), accumulated into grads(). The aux gradient flows
    // through the mean router probabilities only.
    //
    // grads_final_from(offset), where given, is called as the pass goes, each time with a lower
    // offset: this pass writes no gradient at [offset, num_params()) any more (the head and the
    // final norm, then each layer from the last, then the embedding: 0). A data-parallel trainer
    // starts summing those gradients over the ranks while the pass goes on.
    using GradsFinal = std::function<void(int64_t offset)>;
    void backward(float loss_scale = 1.0f, const GradsFinal& grads_final_from = {});
    // Frees what the last forward(..., keep_activations = true) kept, when no backward() will
    // follow (a step rejected for a non-finite loss).
    void discard_activations() { saved_ = {}; }
    // The flat gradient tensor (same layout as params()); allocated on first use.
    const Tensor& grads();
    void zero_grads();
    Tensor grad(const std::string& name);

    // How many logits the training classifier holds at once (default 2^25: 128 MiB in fp32,
    // and as much for their gradient); it takes classifier_chunk_rows() rows at a time.
    void set_classifier_chunk_values(int64_t values) { classifier_chunk_values_ = values; }

  private:
    const ParamSpec& spec(const std::string& name) const;  // logic_error when there is none
    // Parameter s with `shape` from its first element: in `flat`, a tensor laid out like the
    // parameters (the bf16 copy, the gradients), or where it is stored when flat is null.
    Tensor locate(const Tensor* flat, const ParamSpec& s, Shape shape) const;
    // Views of one layer's tensors (locate's `flat`).
    LayerWeights bind_layer(const Tensor* flat, int64_t layer) const;
    Tensor view(const Tensor& flat, const std::string& name) const;
    // Whether this pass stores weights and matmul-only activations in bf16 (see the top).
    bool bf16_storage() const {
        return bf16_storage_enabled_ && weight_format_ == DType::F32 &&
               backend_.matmul_precision() == Precision::BF16;
    }
    // Makes the bf16 copy of the weights current, when bf16_storage(); called by each pass.
    void refresh_bf16_weights();
    // The weights the matmuls read: the bf16 copy's views under bf16_storage(), else the
    // parameters' own. Norm weights and biases are read from layers_ (fp32) either way.
    const LayerWeights& matmul_weights(int64_t layer) const {
        return bf16_storage() ? layers_bf16_[layer] : layers_[layer];
    }
    const Tensor& lm_head_operand() const { return bf16_storage() ? lm_head_bf16_ : lm_head_; }
    // Activations for N tokens (for_backward: h_in/h_mid too, and act left for the caller to
    // bind to the buffer the layers share); `cached`: for attention_cached(), whose output is
    // fp32.
    LayerActivations alloc_activations(int64_t N, bool for_backward, bool cached = false) const;
    // Checks token ids against the vocabulary (check_tokens), and uploads them.
    void check_tokens(const std::vector<int32_t>& tokens) const;
    Tensor upload_tokens(const std::vector<int32_t>& tokens) const;
    // Attention against a KV cache instead of within the chunk alone.
    struct CachedAttention {
        const KvCache* cache;
        Tensor start;  // [B] I32: each sequence's first chunk position
    };
    // One transformer layer on the residual stream h [B*T, d], in place. Activations go to
    // `a` (h_in/h_mid too when allocated); aux_out [1] receives the layer's load-balancing
    // loss when defined.
    void layer_forward(int64_t layer, const Tensor& h, LayerActivations& a, const Tensor& positions,
                       int64_t B, int64_t T, const Tensor& aux_out, const CachedAttention* cached);
    // a.act = the FFN activation of a.pre (and a.up: swiglu).
    void ffn_activation(const LayerActivations& a) const;
    // forward_cached for one token per sequence (validated), on tensors kept with the cache
    // from step to step so that the backend records the step once and replays it.
    Tensor decode_step(const std::vector<int32_t>& tokens, const std::vector<int32_t>& start,
                       const KvCache& cache);
    enum class Pass {
        Logits,  // inference: all the logits (and the loss when there are targets)
        Loss,    // evaluation: the loss alone, the classifier in chunks
        Train,   // the loss, the classifier's gradients and what backward() needs
    };
    ForwardResult run_forward(const std::vector<int32_t>& tokens, int64_t B, int64_t T,
                              const std::vector<int32_t>* targets, Pass pass);
    // The final norm of the residual stream h [rows, d] (bf16 under bf16_storage()).
    Tensor final_norm(const Tensor& h) const;
    // Final norm and LM head: logits [rows, V] of the residual stream h [rows, d].
    Tensor logits_of(const Tensor& h) const;
    // The classifier in chunks of rows of the normed stream [N, d]: per chunk the logits and
    // their cross-entropy into losses [N]; with_gradients, also its gradient for a loss scale
    // of 1 (the mean over n_targets), carried back through the LM head at once. A [N, V]
    // logits tensor never exists (at B32 x T512 x 32k it would be 2 GiB, its gradient as much).
    struct Classifier {
        Tensor d_normed;  // [N, d]: gradient of the final norm's output
        Tensor d_weight;  // like lm_head: gradient of the LM head's weight
    };
    Classifier classifier_chunks(const Tensor& normed, const Tensor& targets, const Tensor& losses,
                                 bool with_gradients, int64_t n_targets);

    ModelConfig config_;
    Backend& backend_;
    ParamLayout layout_;
    DType weight_format_;
    // Where each parameter (by layout index) is stored: the flat tensor of its dtype in
    // stored_, and its offset there (with f32 weights, params_ holds everything at the
    // layout's offsets).
    struct Place {
        DType dtype;
        int64_t offset;
    };
    std::vector<Place> places_;
    std::map<DType, Tensor> stored_;
    Tensor params_;  // stored_[F32]
    Tensor embed_, final_norm_w_, final_norm_b_, lm_head_;
    std::vector<LayerWeights> layers_;
    // The bf16 copy of params_ (BF16, made on the first pass that needs it) and its views.
    Tensor params_bf16_, lm_head_bf16_;
    std::vector<LayerWeights> layers_bf16_;
    bool bf16_weights_current_ = false;
    bool bf16_storage_enabled_ = true;
    Tensor grads_;
    int64_t classifier_chunk_values_ = int64_t{1} << 25;

    // State of the last forward pass that kept its activations.
    struct Saved {
        int64_t B = 0, T = 0;
        Tensor ids, positions, h_final, a_final;
        Classifier head;
        int64_t n_targets = 0;
        std::vector<LayerActivations> layers;
    };
    Saved saved_;
};

// Mean next-token cross-entropy of a token sequence, scored in consecutive windows of at most
// `window` inputs (each window predicts its own next tokens; every token after the first is
// predicted exactly once). Returns the total in nats and the number of predicted tokens.
struct TokenScore {
    double total_nats = 0.0;
    int64_t tokens = 0;
};
TokenScore score_tokens(Model& model, const std::vector<int32_t>& tokens, int64_t window);

}  // namespace tmx

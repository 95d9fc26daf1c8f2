#include "engine/model/model.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>

#include "engine/core/checked_math.h"
#include "engine/core/errors.h"
#include "engine/core/rng.h"

namespace tmx {

const ParamSpec* ParamLayout::find(const std::string& name) const {
    for (const auto& s : specs)
        if (s.name == name) return &s;
    return nullptr;
}

ParamLayout model_param_layout(const ModelConfig& c) {
    ParamLayout layout;
    const double std = 0.02;
    const double proj_std = 0.02 / std::sqrt(2.0 * static_cast<double>(c.n_layers));
    const int64_t d = c.d_model;
    auto add = [&](std::string name, Shape shape, ParamInit init, double init_std, bool decay) {
        ParamSpec s{std::move(name), std::move(shape), init, init_std, decay, layout.total};
        layout.total += s.numel();
        layout.specs.push_back(std::move(s));
    };
    auto norm = [&](const std::string& prefix) {
        add(prefix + ".weight", {d}, ParamInit::Ones, 0.0, false);
        if (c.has_norm_bias()) add(prefix + ".bias", {d}, ParamInit::Zeros, 0.0, false);
    };
    auto linear = [&](const std::string& prefix, int64_t out, int64_t in, bool bias, double s) {
        add(prefix + ".weight", {out, in}, ParamInit::Normal, s, true);
        if (bias) add(prefix + ".bias", {out}, ParamInit::Zeros, 0.0, false);
    };
    // Each expert matrix for all experts back to back (weights, then biases), so that the
    // stacked tensor of a layer is one contiguous view.
    auto experts = [&](const std::string& prefix, const std::string& w, int64_t out, int64_t in,
                       double s) {
        for (int64_t e = 0; e < c.n_experts; ++e)
            add(prefix + std::to_string(e) + "." + w + ".weight", {out, in}, ParamInit::Normal, s,
                true);
        if (c.ffn_bias)
            for (int64_t e = 0; e < c.n_experts; ++e)
                add(prefix + std::to_string(e) + "." + w + ".bias", {out}, ParamInit::Zeros, 0.0,
                    false);
    };
    const bool swiglu = c.ffn_type == FfnType::SwiGlu;

    add("model.embed_tokens.weight", {c.vocab_size, d}, ParamInit::Normal, std, false);
    for (int64_t i = 0; i < c.n_layers; ++i) {
        const std::string p = "model.layers." + std::to_string(i);
        norm(p + ".input_layernorm");
        linear(p + ".self_attn.q_proj", c.q_dim(), d, c.attn_bias, std);
        linear(p + ".self_attn.k_proj", c.kv_dim(), d, c.attn_bias, std);
        linear(p + ".self_attn.v_proj", c.kv_dim(), d, c.attn_bias, std);
        linear(p + ".self_attn.o_proj", d, c.q_dim(), c.attn_bias, proj_std);
        norm(p + ".post_attention_layernorm");
        if (c.is_moe()) {
            add(p + ".block_sparse_moe.gate.weight", {c.n_experts, d}, ParamInit::Normal, std,
                true);
            const std::string ep = p + ".block_sparse_moe.experts.";
            experts(ep, "w1", c.d_ff, d, std);
            experts(ep, "w2", d, c.d_ff, proj_std);
            if (swiglu) experts(ep, "w3", c.d_ff, d, std);
        } else {
            linear(p + ".mlp.w1", c.d_ff, d, c.ffn_bias, std);
            linear(p + ".mlp.w2", d, c.d_ff, c.ffn_bias, proj_std);
            if (swiglu) linear(p + ".mlp.w3", c.d_ff, d, c.ffn_bias, std);
        }
    }
    norm("model.norm");
    if (!c.tie_embeddings) add("lm_head.weight", {c.vocab_size, d}, ParamInit::Normal, std, true);
    return layout;
}

std::vector<ParamSpec> model_param_specs(const ModelConfig& config) {
    return model_param_layout(config).specs;
}

namespace {

// The tensors a pass allocates, listed once: the model allocates them from these lists and
// training_memory() adds their bytes up, so the estimate cannot drift from the model.
struct TensorSpec {
    Shape shape;
    DType dtype = DType::F32;
    double bytes() const {
        double n = static_cast<double>(dtype_bytes(dtype, 1));
        for (int64_t d : shape) n *= static_cast<double>(d);
        return n;
    }
};
template <typename Owner>
struct MemberSpec {
    Tensor Owner::*member;
    TensorSpec tensor;
};
template <typename Owner>
Owner alloc_members(Backend& be, const std::vector<MemberSpec<Owner>>& specs) {
    Owner owner;
    for (const auto& s : specs) owner.*s.member = be.alloc(s.tensor.shape, s.tensor.dtype);
    return owner;
}
template <typename Owner>
double bytes_of(const std::vector<MemberSpec<Owner>>& specs) {
    double sum = 0;
    for (const auto& s : specs) sum += s.tensor.bytes();
    return sum;
}

// The dtype of the activations only matmuls read (a1, a2, xs, act, the final norm's output,
// the classifier's d_logits), and of attention's output, which is one of them where attention
// runs in bf16 (attention_cached() stores fp32).
struct ActivationDtypes {
    DType matmul_input = DType::F32;
    DType att = DType::F32;
};
ActivationDtypes activation_dtypes(const ModelConfig& c, Precision precision, bool bf16_storage,
                                   bool cached) {
    ActivationDtypes t;
    if (bf16_storage) t.matmul_input = DType::BF16;
    if (!cached && attention_in_bf16(precision, c.head_dim)) t.att = t.matmul_input;
    return t;
}

// The FFN activation's output for N tokens (the input of w2).
TensorSpec ffn_act_spec(const ModelConfig& c, int64_t N, ActivationDtypes t) {
    const int64_t S = c.is_moe() ? checked_mul(N, c.top_k, "tokens x top_k") : N;
    return {{S, c.d_ff}, t.matmul_input};
}

// A layer's activations for N tokens. for_backward: with h_in and h_mid, and without act, which
// training does not keep per layer (one buffer serves every layer; backward() recomputes each
// layer's from pre: an elementwise pass instead of S x d_ff values a layer).
std::vector<MemberSpec<LayerActivations>> activation_specs(const ModelConfig& c, int64_t N,
                                                           bool for_backward, ActivationDtypes t) {
    using A = LayerActivations;
    const int64_t d = c.d_model;
    const int64_t S = c.is_moe() ? checked_mul(N, c.top_k, "tokens x top_k") : N;
    std::vector<MemberSpec<A>> s;
    auto add = [&](Tensor A::*member, Shape shape, DType dtype = DType::F32) {
        s.push_back({member, {std::move(shape), dtype}});
    };
    if (for_backward) {
        add(&A::h_in, {N, d});
        add(&A::h_mid, {N, d});
    }
    add(&A::a1, {N, d}, t.matmul_input);
    add(&A::a2, {N, d}, t.matmul_input);
    add(&A::q, {N, c.q_dim()});
    add(&A::k, {N, c.kv_dim()});
    add(&A::v, {N, c.kv_dim()});
    add(&A::att, {N, c.q_dim()}, t.att);
    if (c.is_moe()) {
        add(&A::router_logits, {N, c.n_experts});
        add(&A::top_idx, {N, c.top_k}, DType::I32);
        add(&A::gates, {N, c.top_k});
        add(&A::offsets, {c.n_experts + 1}, DType::I32);
        add(&A::slot_rows, {S}, DType::I32);
        add(&A::slot_of, {S}, DType::I32);
        add(&A::xs, {S, d}, t.matmul_input);
        add(&A::ys, {S, d});
    }
    add(&A::pre, {S, c.d_ff});
    if (c.ffn_type == FfnType::SwiGlu) add(&A::up, {S, c.d_ff});
    if (!for_backward) s.push_back({&A::act, ffn_act_spec(c, N, t)});
    return s;
}

// The backward pass's gradients of one layer's activations, reused layer after layer.
struct BackwardScratch {
    Tensor dh;                                                 // gradient of the residual stream
    Tensor d_pre, d_up, d_act, d_xs, d_ys, d_gates, d_router;  // feed-forward block
    Tensor d_q, d_att, d_k, d_v;                               // attention block
};
std::vector<MemberSpec<BackwardScratch>> backward_scratch_specs(const ModelConfig& c, int64_t N) {
    using G = BackwardScratch;
    const int64_t d = c.d_model;
    const int64_t S = c.is_moe() ? checked_mul(N, c.top_k, "tokens x top_k") : N;
    std::vector<MemberSpec<G>> s;
    auto add = [&](Tensor G::*member, Shape shape) { s.push_back({member, {std::move(shape)}}); };
    add(&G::dh, {N, d});
    add(&G::d_pre, {S, c.d_ff});
    if (c.ffn_type == FfnType::SwiGlu) add(&G::d_up, {S, c.d_ff});
    add(&G::d_act, {S, c.d_ff});
    if (c.is_moe()) {
        add(&G::d_xs, {S, d});
        add(&G::d_ys, {S, d});
        add(&G::d_gates, {N, c.top_k});
        add(&G::d_router, {N, c.n_experts});
    }
    add(&G::d_q, {N, c.q_dim()});
    add(&G::d_att, {N, c.q_dim()});
    add(&G::d_k, {N, c.kv_dim()});
    add(&G::d_v, {N, c.kv_dim()});
    return s;
}

// Rows of logits the training classifier computes at a time.
int64_t classifier_chunk_rows(int64_t chunk_values, int64_t V, int64_t N) {
    return std::clamp<int64_t>(chunk_values / V, 1, N);
}

}  // namespace

TrainingMemory training_memory(const ModelConfig& c, int64_t batch, int64_t seq,
                               Precision precision, bool with_validation,
                               int64_t classifier_chunk_values) {
    const int64_t N = checked_mul(batch, seq, "training memory: batch x seq");
    const int64_t d = c.d_model, V = c.vocab_size, L = c.n_layers;
    const double P = static_cast<double>(model_param_layout(c).total);
    const bool bf16 = precision == Precision::BF16;  // bf16 storage, as Model's default
    TrainingMemory m;
    m.weights = 4 * P;
    m.gradients = 4 * P;
    m.optimizer = 8 * P;
    m.bf16_weights = bf16 ? 2 * P : 0;

    const ActivationDtypes t = activation_dtypes(c, precision, bf16, /*cached=*/false);
    const double ids = TensorSpec{{N}, DType::I32}.bytes();  // token ids, positions, targets
    const double per_token_row = TensorSpec{{N}}.bytes();    // losses
    const double stream = TensorSpec{{N, d}}.bytes();
    const double normed = TensorSpec{{N, d}, t.matmul_input}.bytes();
    const double aux = c.is_moe() ? TensorSpec{{L}}.bytes() : 0;
    // forward(): ids, positions, h and the final norm's output stay for backward(); aux,
    // targets and losses until it returns.
    m.activations = 2 * ids + stream +
                    static_cast<double>(L) * bytes_of(activation_specs(c, N, true, t)) +
                    ffn_act_spec(c, N, t).bytes() /* shared by the layers */ + normed;
    const double forward_locals = aux + ids + per_token_row;
    // The classifier: the head's gradients, and a chunk of logits with their gradient (then,
    // for MoE, every layer's expert offsets, read back in one go).
    const int64_t rows = classifier_chunk_rows(classifier_chunk_values, V, N);
    const double chunk =
        TensorSpec{{rows, V}}.bytes() + TensorSpec{{rows, V}, t.matmul_input}.bytes();
    const double offsets = c.is_moe() ? TensorSpec{{L, c.n_experts + 1}, DType::I32}.bytes() : 0;
    const double classifier = forward_locals + stream /* d_normed */ +
                              TensorSpec{{V, d}}.bytes() /* d_weight */ + std::max(chunk, offsets);
    // backward(): d_normed and the scratch; the head's weight gradient is added and freed first.
    const double backward = stream + bytes_of(backward_scratch_specs(c, N));
    // A validation pass (forward_loss(), after the step freed its activations): one layer's
    // activations and a chunk of logits.
    m.validation_pass = 2 * ids + stream + forward_locals +
                        bytes_of(activation_specs(c, N, false, t)) + normed +
                        TensorSpec{{rows, V}}.bytes();
    const double validation = with_validation ? m.validation_pass : 0;
    const double peak =
        std::max({m.activations + classifier, m.activations + backward, validation});
    m.step_scratch = peak - m.activations;
    return m;
}

DType stored_dtype(const ParamSpec& s, DType weight_format) {
    const bool weight =
        s.shape.size() == 2 && s.name.find(".block_sparse_moe.gate.") == std::string::npos;
    if (!weight) return DType::F32;
    if (weight_format == DType::Q8_0 && s.shape[1] % kQ8_0BlockValues != 0) return DType::F16;
    return weight_format;
}

Model::Model(const ModelConfig& config, Backend& backend, DType weight_format)
    : config_(config),
      backend_(backend),
      layout_(model_param_layout(config)),
      weight_format_(weight_format) {
    if (!is_weight_format(weight_format))
        throw std::logic_error(std::string("Model: ") + to_string(weight_format) +
                               " is no weight format");
    // Each parameter's place: at its layout offset in params_ (f32 weights), or packed into
    // the flat tensor of its stored dtype, in layout order (so that wq, wk and wv stay back to
    // back, and each layer's experts too).
    std::map<DType, int64_t> sizes;
    for (const auto& s : layout_.specs) {
        const DType t = stored_dtype(s, weight_format);
        if (t != DType::F32 && !backend_.supports_weight_format(t))
            throw Error("the " + backend_.name() + " backend cannot hold " + to_string(t) +
                        " weights (load them as f32)");
        int64_t& size = sizes[t];
        places_.push_back({t, weight_format == DType::F32 ? s.offset : size});
        size += s.numel();
    }
    for (const auto& [t, size] : sizes)
        stored_[t] = t == DType::F32 && weight_format == DType::F32
                         ? backend_.alloc({layout_.total})
                         : backend_.alloc({size}, t);
    params_ = stored_.at(DType::F32);  // every config has norms
    embed_ = param("model.embed_tokens.weight");
    final_norm_w_ = param("model.norm.weight");
    final_norm_b_ = layout_.find("model.norm.bias") ? param("model.norm.bias") : Tensor{};
    lm_head_ = config_.tie_embeddings ? embed_ : param("lm_head.weight");
    for (int64_t i = 0; i < config_.n_layers; ++i) layers_.push_back(bind_layer(nullptr, i));
}

const ParamSpec& Model::spec(const std::string& name) const {
    const ParamSpec* s = layout_.find(name);
    if (!s) throw std::logic_error("no parameter named " + name);
    return *s;
}

Tensor Model::locate(const Tensor* flat, const ParamSpec& s, Shape shape) const {
    if (flat) return flat->slice(s.offset, std::move(shape));
    const Place& p = places_[static_cast<size_t>(&s - layout_.specs.data())];
    return stored_.at(p.dtype).slice(p.offset, std::move(shape));
}

Tensor Model::view(const Tensor& flat, const std::string& name) const {
    const ParamSpec& s = spec(name);
    return locate(&flat, s, s.shape);
}

LayerWeights Model::bind_layer(const Tensor* flat, int64_t layer) const {
    const ModelConfig& c = config_;
    const std::string p = "model.layers." + std::to_string(layer);
    auto view = [&](const std::string& name) {
        const ParamSpec& s = spec(name);
        return locate(flat, s, s.shape);
    };
    auto opt = [&](const std::string& name) { return layout_.find(name) ? view(name) : Tensor{}; };
    // The stacked [E, ...] view that starts at expert 0's tensor.
    auto stacked = [&](const std::string& first, Shape per_expert) {
        const ParamSpec* s = layout_.find(first);
        if (!s) return Tensor{};
        per_expert.insert(per_expert.begin(), c.n_experts);
        return locate(flat, *s, per_expert);
    };
    LayerWeights w;
    w.input_norm_w = view(p + ".input_layernorm.weight");
    w.input_norm_b = opt(p + ".input_layernorm.bias");
    w.post_norm_w = view(p + ".post_attention_layernorm.weight");
    w.post_norm_b = opt(p + ".post_attention_layernorm.bias");
    w.wq = view(p + ".self_attn.q_proj.weight");
    w.bq = opt(p + ".self_attn.q_proj.bias");
    w.wk = view(p + ".self_attn.k_proj.weight");
    w.bk = opt(p + ".self_attn.k_proj.bias");
    w.wv = view(p + ".self_attn.v_proj.weight");
    w.bv = opt(p + ".self_attn.v_proj.bias");
    w.wo = view(p + ".self_attn.o_proj.weight");
    w.bo = opt(p + ".self_attn.o_proj.bias");
    // wq, wk and wv back to back in the layout (no biases between them) are back to back in
    // every flat tensor: one [q_dim + 2 kv_dim, d] view from wq's place.
    const ParamSpec &sq = spec(p + ".self_attn.q_proj.weight"),
                    &sk = spec(p + ".self_attn.k_proj.weight"),
                    &sv = spec(p + ".self_attn.v_proj.weight");
    if (sk.offset == sq.offset + sq.numel() && sv.offset == sk.offset + sk.numel())
        w.wqkv = locate(flat, sq, {c.q_dim() + 2 * c.kv_dim(), c.d_model});
    if (c.is_moe()) {
        const std::string e0 = p + ".block_sparse_moe.experts.0.";
        w.router = view(p + ".block_sparse_moe.gate.weight");
        w.w1 = stacked(e0 + "w1.weight", {c.d_ff, c.d_model});
        w.b1 = stacked(e0 + "w1.bias", {c.d_ff});
        w.w2 = stacked(e0 + "w2.weight", {c.d_model, c.d_ff});
        w.b2 = stacked(e0 + "w2.bias", {c.d_model});
        w.w3 = stacked(e0 + "w3.weight", {c.d_ff, c.d_model});
        w.b3 = stacked(e0 + "w3.bias", {c.d_ff});
    } else {
        w.w1 = view(p + ".mlp.w1.weight");
        w.b1 = opt(p + ".mlp.w1.bias");
        w.w2 = view(p + ".mlp.w2.weight");
        w.b2 = opt(p + ".mlp.w2.bias");
        w.w3 = opt(p + ".mlp.w3.weight");
        w.b3 = opt(p + ".mlp.w3.bias");
    }
    return w;
}

Tensor Model::param(const std::string& name) const {
    const ParamSpec& s = spec(name);
    return locate(nullptr, s, s.shape);
}

void Model::init_random(uint64_t seed) {
    std::vector<float> host(static_cast<size_t>(layout_.total));
    for (const auto& s : layout_.specs) {
        float* dst = host.data() + s.offset;
        switch (s.init) {
            case ParamInit::Zeros:
                std::fill(dst, dst + s.numel(), 0.0f);
                break;
            case ParamInit::Ones:
                std::fill(dst, dst + s.numel(), 1.0f);
                break;
            case ParamInit::Normal: {
                Rng rng(stream_seed(seed, s.name));
                for (int64_t i = 0; i < s.numel(); ++i)
                    dst[i] = static_cast<float>(rng.normal() * s.init_std);
                break;
            }
        }
    }
    params_from_host(host);
}

std::vector<float> Model::params_to_host() const {
    std::vector<float> host(static_cast<size_t>(layout_.total));
    if (weight_format_ == DType::F32) {
        backend_.download(params_, host.data());
        return host;
    }
    std::vector<std::byte> bytes;
    for (const auto& s : layout_.specs) {
        const Tensor t = param(s.name);
        bytes.resize(t.bytes());
        backend_.download(t, bytes.data());
        decode_weights(t.dtype(), bytes.data(), s.numel(), host.data() + s.offset);
    }
    return host;
}

void Model::params_from_host(const std::vector<float>& values) {
    if (static_cast<int64_t>(values.size()) != layout_.total)
        throw std::logic_error("params_from_host: wrong number of values");
    if (weight_format_ == DType::F32) {
        backend_.upload(params_, values.data());
    } else {
        for (const auto& s : layout_.specs) set_param(s.name, DType::F32, values.data() + s.offset);
    }
    params_changed();
}

void Model::set_param(const std::string& name, DType format, const void* data) {
    const Tensor t = param(name);
    if (format == t.dtype()) {
        backend_.upload(t, data);
    } else if (format == DType::F32) {
        std::vector<std::byte> bytes(t.bytes());
        encode_weights(t.dtype(), static_cast<const float*>(data), t.numel(), bytes.data());
        backend_.upload(t, bytes.data());
    } else {
        throw std::logic_error("Model::set_param: " + name + " is stored as " +
                               to_string(t.dtype()) + ", given " + to_string(format));
    }
    params_changed();
}

void Model::refresh_bf16_weights() {
    if (!bf16_storage() || bf16_weights_current_) return;
    if (!params_bf16_.defined()) {
        params_bf16_ = backend_.alloc({layout_.total}, DType::BF16);
        for (int64_t i = 0; i < config_.n_layers; ++i)
            layers_bf16_.push_back(bind_layer(&params_bf16_, i));
        lm_head_bf16_ = view(
            params_bf16_, config_.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
    }
    backend_.convert(params_, params_bf16_);
    bf16_weights_current_ = true;
}

const Tensor& Model::grads() {
    if (weight_format_ != DType::F32)
        throw Error(std::string("a model with ") + to_string(weight_format_) +
                    " weights cannot be trained: train from full-precision (f32) weights");
    if (!grads_.defined()) {
        grads_ = backend_.alloc({layout_.total});
        backend_.fill(grads_, 0.0f);
    }
    return grads_;
}

void Model::zero_grads() {
    backend_.fill(grads(), 0.0f);
}

Tensor Model::grad(const std::string& name) {
    return view(grads(), name);
}

LayerActivations Model::alloc_activations(int64_t N, bool for_backward, bool cached) const {
    return alloc_members(backend_,
                         activation_specs(config_, N, for_backward,
                                          activation_dtypes(config_, backend_.matmul_precision(),
                                                            bf16_storage(), cached)));
}

void Model::check_tokens(const std::vector<int32_t>& tokens) const {
    for (int32_t t : tokens)
        if (t < 0 || t >= config_.vocab_size)
            throw Error("token id " + std::to_string(t) +
                        " is outside the model's vocabulary [0, " +
                        std::to_string(config_.vocab_size) + ")");
}

Tensor Model::upload_tokens(const std::vector<int32_t>& tokens) const {
    check_tokens(tokens);
    Tensor ids = backend_.alloc({static_cast<int64_t>(tokens.size())}, DType::I32);
    backend_.upload(ids, tokens.data());
    return ids;
}

void Model::layer_forward(int64_t l, const Tensor& h, LayerActivations& a, const Tensor& positions,
                          int64_t B, int64_t T, const Tensor& aux_out,
                          const CachedAttention* cached) {
    const ModelConfig& c = config_;
    Backend& be = backend_;
    const LayerWeights& w = layers_[l];  // norms and biases
    const LayerWeights& m = matmul_weights(l);
    const int64_t N = B * T, H = c.n_heads, Hkv = c.n_kv_heads, hd = c.head_dim;
    const float eps = static_cast<float>(c.norm_eps);
    const bool swiglu = c.ffn_type == FfnType::SwiGlu;

    if (a.h_in.defined()) be.copy(h, a.h_in);
    // Attention block: the norm goes with the first projection (norm_linear).
    if (a.qkv.defined()) {
        // One token (decoding): its q, k and v are one row, so one matmul makes them.
        be.norm_linear(c.norm_type, h, w.input_norm_w, w.input_norm_b, eps, a.a1, m.wqkv, Tensor{},
                       a.qkv);
    } else {
        be.norm_linear(c.norm_type, h, w.input_norm_w, w.input_norm_b, eps, a.a1, m.wq, w.bq, a.q);
        be.linear(a.a1, m.wk, w.bk, a.k);
        be.linear(a.a1, m.wv, w.bv, a.v);
    }
    const Tensor q = a.q.reshape({B, T, H, hd}), att = a.att.reshape({B, T, H, hd});
    const Tensor k = a.k.reshape({B, T, Hkv, hd}), v = a.v.reshape({B, T, Hkv, hd});
    if (cached) {
        // RoPE, attention and the cache write as one op (a backend may rotate q and k as it
        // reads them): nothing reads q or k afterwards.
        const KvCache& cache = *cached->cache;
        be.rope_attention_cached_store(q, k, v, positions, c.rope_theta, cache.keys(l),
                                       cache.values(l), cached->start, att, c.sliding_window);
    } else {
        // The backward reads q and k rotated (saved activations).
        be.rope(a.q.reshape({N, H, hd}), positions, c.rope_theta);
        be.rope(a.k.reshape({N, Hkv, hd}), positions, c.rope_theta);
        be.attention(q, k, v, att, c.sliding_window);
    }
    be.linear(a.att, m.wo, w.bo, h, /*accumulate=*/true);  // h += o Wo^T + bo
    if (a.h_mid.defined()) be.copy(h, a.h_mid);
    // Feed-forward block: the norm goes with the router (or the first projection).
    if (c.is_moe()) {
        be.norm_linear(c.norm_type, h, w.post_norm_w, w.post_norm_b, eps, a.a2, m.router, Tensor{},
                       a.router_logits);
        be.moe_route(a.router_logits, a.a2, a.top_idx, a.gates, a.offsets, a.slot_rows, a.slot_of,
                     a.xs);
        if (aux_out.defined()) be.router_aux_loss(a.router_logits, a.top_idx, aux_out);
        be.grouped_ffn_up(a.xs, m.w1, w.b1, swiglu ? m.w3 : Tensor{}, swiglu ? w.b3 : Tensor{},
                          a.offsets, c.activation, a.pre, swiglu ? a.up : Tensor{}, a.act);
        be.grouped_ffn_down(a.act, m.w2, w.b2, a.offsets, a.slot_of, a.gates, a.ys, h);
    } else {
        be.norm_linear(c.norm_type, h, w.post_norm_w, w.post_norm_b, eps, a.a2, m.w1, w.b1, a.pre);
        if (swiglu) be.linear(a.a2, m.w3, w.b3, a.up);
        ffn_activation(a);
        be.linear(a.act, m.w2, w.b2, h, /*accumulate=*/true);
    }
}

void Model::ffn_activation(const LayerActivations& a) const {
    if (config_.ffn_type == FfnType::SwiGlu)
        backend_.swiglu(a.pre, a.up, a.act);
    else
        backend_.activation(config_.activation, a.pre, a.act);
}

Tensor Model::final_norm(const Tensor& h) const {
    const ModelConfig& c = config_;
    Tensor normed = backend_.alloc(h.shape(), bf16_storage() ? DType::BF16 : DType::F32);
    backend_.norm(c.norm_type, h, final_norm_w_, final_norm_b_, static_cast<float>(c.norm_eps),
                  normed);
    return normed;
}

Tensor Model::logits_of(const Tensor& h) const {
    const ModelConfig& c = config_;
    const Tensor normed = backend_.alloc(h.shape(), bf16_storage() ? DType::BF16 : DType::F32);
    Tensor logits = backend_.alloc({h.dim(0), c.vocab_size});
    backend_.norm_linear(c.norm_type, h, final_norm_w_, final_norm_b_,
                         static_cast<float>(c.norm_eps), normed, lm_head_operand(), Tensor{},
                         logits);
    return logits;
}

Model::Classifier Model::classifier_chunks(const Tensor& normed, const Tensor& targets,
                                           const Tensor& losses, bool with_gradients,
                                           int64_t n_targets) {
    Backend& be = backend_;
    const int64_t N = normed.dim(0), V = config_.vocab_size;
    const Tensor& lm_head = lm_head_operand();
    Classifier head;
    if (with_gradients) {
        head.d_normed = be.alloc(normed.shape());
        head.d_weight = be.alloc(lm_head_.shape());
        be.fill(head.d_normed, 0.0f);
        be.fill(head.d_weight, 0.0f);
    }
    // d loss / d logits of the mean cross-entropy; backward() applies its loss scale.
    const float scale = n_targets ? 1.0f / static_cast<float>(n_targets) : 0.0f;
    const int64_t rows = classifier_chunk_rows(classifier_chunk_values_, V, N);
    // d_logits feeds only the two matmuls below: bf16 under bf16_storage(), as the activations.
    Tensor logits = be.alloc({rows, V});
    Tensor d_logits =
        with_gradients ? be.alloc({rows, V}, bf16_storage() ? DType::BF16 : DType::F32) : Tensor{};
    for (int64_t r0 = 0; r0 < N; r0 += rows) {
        const int64_t r1 = std::min(N, r0 + rows), n = r1 - r0;
        const Tensor x = normed.rows(r0, r1), lg = logits.rows(0, n);
        const Tensor tgt = targets.rows(r0, r1);
        be.linear(x, lm_head, Tensor{}, lg);
        be.cross_entropy(lg, tgt, losses.rows(r0, r1));
        if (!with_gradients) continue;
        const Tensor dlg = d_logits.rows(0, n);
        be.cross_entropy_backward(lg, tgt, scale, dlg);
        be.linear_backward(x, lm_head, dlg, head.d_normed.rows(r0, r1), head.d_weight, Tensor{});
    }
    return head;
}

ForwardResult Model::forward(const std::vector<int32_t>& tokens, int64_t B, int64_t T,
                             const std::vector<int32_t>* targets, bool keep_activations) {
    if (keep_activations && !targets)
        throw std::logic_error("forward: keeping activations needs targets");
    return run_forward(tokens, B, T, targets, keep_activations ? Pass::Train : Pass::Logits);
}

ForwardResult Model::forward_loss(const std::vector<int32_t>& tokens, int64_t B, int64_t T,
                                  const std::vector<int32_t>& targets) {
    return run_forward(tokens, B, T, &targets, Pass::Loss);
}

ForwardResult Model::run_forward(const std::vector<int32_t>& tokens, int64_t B, int64_t T,
                                 const std::vector<int32_t>* targets, Pass pass) {
    const bool keep_activations = pass == Pass::Train;
    const ModelConfig& c = config_;
    const int64_t N = B * T;
    if (static_cast<int64_t>(tokens.size()) != N)
        throw std::logic_error("forward: tokens do not match B*T");
    Backend& be = backend_;
    // The last training pass's activations go before this one's are made (backward() frees
    // them too; a step rejected before its backward pass leaves them).
    if (keep_activations) saved_ = {};
    refresh_bf16_weights();

    Tensor ids = upload_tokens(tokens);
    std::vector<int32_t> pos_host(static_cast<size_t>(N));
    for (int64_t n = 0; n < N; ++n) pos_host[n] = static_cast<int32_t>(n % T);
    Tensor positions = be.alloc({N}, DType::I32);
    be.upload(positions, pos_host.data());

    Tensor h = be.alloc({N, c.d_model});
    Tensor aux = c.is_moe() && targets ? be.alloc({c.n_layers}) : Tensor{};

    // Inference reuses one set of buffers for every layer; training keeps each layer's, except
    // the FFN activation's output: one buffer for all, which backward() recomputes per layer.
    std::vector<LayerActivations> kept;
    LayerActivations scratch;
    Tensor shared_act;
    if (!keep_activations) {
        scratch = alloc_activations(N, /*for_backward=*/false);
    } else {
        const TensorSpec act = ffn_act_spec(
            c, N, activation_dtypes(c, be.matmul_precision(), bf16_storage(), /*cached=*/false));
        shared_act = be.alloc(act.shape, act.dtype);
    }

    be.gather_rows(embed_, ids, h);
    for (int64_t l = 0; l < c.n_layers; ++l) {
        if (keep_activations) {
            kept.push_back(alloc_activations(N, /*for_backward=*/true));
            kept.back().act = shared_act;
        }
        layer_forward(l, h, keep_activations ? kept.back() : scratch, positions, B, T,
                      aux.defined() ? aux.slice(l, {1}) : Tensor{}, nullptr);
    }
    ForwardResult result;
    if (targets && static_cast<int64_t>(targets->size()) != N)
        throw std::logic_error("forward: targets do not match B*T");
    Tensor tgt, losses = targets ? be.alloc({N}) : Tensor{};
    if (targets) {
        tgt = be.alloc({N}, DType::I32);
        be.upload(tgt, targets->data());
    }
    Tensor a_final;
    Classifier head;
    if (pass == Pass::Logits) {
        result.logits = logits_of(h);
        if (targets) be.cross_entropy(result.logits, tgt, losses);
    } else {
        int64_t n_targets = 0;
        for (int32_t t : *targets) n_targets += t >= 0;
        a_final = final_norm(h);
        head = classifier_chunks(a_final, tgt, losses, keep_activations, n_targets);
    }

    if (targets) {
        std::vector<float> host(static_cast<size_t>(N));
        be.download(losses, host.data());
        double sum = 0.0;
        for (int64_t n = 0; n < N; ++n) {
            if ((*targets)[n] < 0) continue;
            sum += host[n];
            ++result.n_targets;
        }
        result.loss = result.n_targets ? sum / static_cast<double>(result.n_targets) : 0.0;
        if (c.is_moe()) {
            std::vector<float> aux_host(static_cast<size_t>(c.n_layers));
            be.download(aux, aux_host.data());
            double s = 0.0;
            for (float x : aux_host) s += x;
            result.aux = s / static_cast<double>(c.n_layers);
        }
        if (keep_activations && c.is_moe()) {
            // Every layer's offsets gathered on the device, then one read: one sync per step
            // instead of one per layer.
            const int64_t E1 = c.n_experts + 1;
            Tensor all = be.alloc({c.n_layers, E1}, DType::I32);
            for (int64_t l = 0; l < c.n_layers; ++l)
                be.copy(kept[l].offsets, all.slice(l * E1, {E1}));
            std::vector<int32_t> off(static_cast<size_t>(c.n_layers * E1));
            be.download(all, off.data());
            for (int64_t l = 0; l < c.n_layers; ++l) {
                std::vector<int64_t> counts(static_cast<size_t>(c.n_experts));
                for (int64_t e = 0; e < c.n_experts; ++e)
                    counts[e] = off[l * E1 + e + 1] - off[l * E1 + e];
                result.expert_slots.push_back(std::move(counts));
            }
        }
        if (keep_activations)
            saved_ = Saved{B,
                           T,
                           ids,
                           positions,
                           h,
                           a_final,
                           std::move(head),
                           result.n_targets,
                           std::move(kept)};
    }
    return result;
}

void Model::backward(float loss_scale, const GradsFinal& grads_final_from) {
    if (saved_.layers.empty() || !saved_.head.d_normed.defined())
        throw std::logic_error("backward: no forward pass with kept activations since the last");
    const ModelConfig& c = config_;
    Backend& be = backend_;
    const int64_t B = saved_.B, T = saved_.T, N = B * T;
    const int64_t H = c.n_heads, Hkv = c.n_kv_heads, hd = c.head_dim;
    const float eps = static_cast<float>(c.norm_eps);
    const bool swiglu = c.ffn_type == FfnType::SwiGlu;
    const Tensor& g = grads();
    const float aux_weight = c.is_moe() ? loss_scale * static_cast<float>(c.router_aux_loss_coef) /
                                              static_cast<float>(c.n_layers)
                                        : 0.0f;

    // Head: logits = norm(h) lm_head^T. The forward pass computed its gradients for a loss
    // scale of 1 (in chunks, never holding all the logits): scale them now.
    Tensor d_a = saved_.head.d_normed;
    Tensor d_lm_head =
        c.tie_embeddings ? view(g, "model.embed_tokens.weight") : view(g, "lm_head.weight");
    be.scale(d_a, loss_scale);
    be.scale(saved_.head.d_weight, loss_scale);
    be.add(d_lm_head, saved_.head.d_weight, d_lm_head);
    saved_.head = {};  // one backward per forward: the gradients are spent
    BackwardScratch scratch = alloc_members(be, backward_scratch_specs(c, N));
    auto& [dh, d_pre, d_up, d_act, d_xs, d_ys, d_gates, d_router, d_q, d_att, d_k, d_v] = scratch;
    be.fill(dh, 0.0f);
    be.norm_backward(c.norm_type, saved_.h_final, final_norm_w_, d_a, eps, dh,
                     view(g, "model.norm.weight"),
                     c.has_norm_bias() ? view(g, "model.norm.bias") : Tensor{});
    // Each layer's parameters are one run of the layout, the final norm and an untied head
    // after the last layer's, the embedding before the first's.
    const auto finished = [&](int64_t offset) {
        if (grads_final_from) grads_final_from(offset);
    };
    const auto layer_start = [&](int64_t l) {
        return layout_.find("model.layers." + std::to_string(l) + ".input_layernorm.weight")
            ->offset;
    };
    finished(layout_.find("model.norm.weight")->offset);

    for (int64_t l = c.n_layers - 1; l >= 0; --l) {
        const LayerWeights& w = layers_[l];  // norms
        const LayerWeights& m = matmul_weights(l);
        const LayerWeights gw = bind_layer(&g, l);
        const LayerActivations& a = saved_.layers[l];
        // Feed-forward block: h_out = h_mid + ffn(norm(h_mid)); dh flows on to h_mid as is.
        for (const Tensor* t : {&d_pre, &d_act, &d_a}) be.fill(*t, 0.0f);
        if (swiglu) be.fill(d_up, 0.0f);
        // a.act is one buffer for every layer: this layer's again (the last layer's is still
        // there from the forward pass).
        if (l != c.n_layers - 1) ffn_activation(a);
        if (c.is_moe()) {
            for (const Tensor* t : {&d_xs, &d_ys, &d_gates, &d_router}) be.fill(*t, 0.0f);
            be.moe_combine_backward(a.ys, a.slot_of, a.gates, dh, d_ys, d_gates);
            be.grouped_matmul_backward(a.act, m.w2, a.offsets, d_ys, d_act, gw.w2, gw.b2);
        } else {
            be.linear_backward(a.act, m.w2, dh, d_act, gw.w2, gw.b2);
        }
        if (swiglu)
            be.swiglu_backward(a.pre, a.up, d_act, d_pre, d_up);
        else
            be.activation_backward(c.activation, a.pre, d_act, d_pre);
        if (c.is_moe()) {
            be.grouped_matmul_backward(a.xs, m.w1, a.offsets, d_pre, d_xs, gw.w1, gw.b1);
            if (swiglu) be.grouped_matmul_backward(a.xs, m.w3, a.offsets, d_up, d_xs, gw.w3, gw.b3);
            be.gather_rows_backward(a.slot_rows, d_xs, d_a);
            be.router_backward(a.router_logits, a.top_idx, a.gates, d_gates, aux_weight, d_router);
            be.linear_backward(a.a2, m.router, d_router, d_a, gw.router, Tensor{});
        } else {
            be.linear_backward(a.a2, m.w1, d_pre, d_a, gw.w1, gw.b1);
            if (swiglu) be.linear_backward(a.a2, m.w3, d_up, d_a, gw.w3, gw.b3);
        }
        be.norm_backward(c.norm_type, a.h_mid, w.post_norm_w, d_a, eps, dh, gw.post_norm_w,
                         gw.post_norm_b);

        // Attention block: h_mid = h_in + attention(norm(h_in)) Wo^T + bo.
        for (const Tensor* t : {&d_att, &d_q, &d_k, &d_v, &d_a}) be.fill(*t, 0.0f);
        be.linear_backward(a.att, m.wo, dh, d_att, gw.wo, gw.bo);
        be.attention_backward(a.q.reshape({B, T, H, hd}), a.k.reshape({B, T, Hkv, hd}),
                              a.v.reshape({B, T, Hkv, hd}), d_att.reshape({B, T, H, hd}),
                              d_q.reshape({B, T, H, hd}), d_k.reshape({B, T, Hkv, hd}),
                              d_v.reshape({B, T, Hkv, hd}), c.sliding_window);
        be.rope(d_q.reshape({N, H, hd}), saved_.positions, c.rope_theta, /*inverse=*/true);
        be.rope(d_k.reshape({N, Hkv, hd}), saved_.positions, c.rope_theta, /*inverse=*/true);
        be.linear_backward(a.a1, m.wq, d_q, d_a, gw.wq, gw.bq);
        be.linear_backward(a.a1, m.wk, d_k, d_a, gw.wk, gw.bk);
        be.linear_backward(a.a1, m.wv, d_v, d_a, gw.wv, gw.bv);
        be.norm_backward(c.norm_type, a.h_in, w.input_norm_w, d_a, eps, dh, gw.input_norm_w,
                         gw.input_norm_b);
        finished(layer_start(l));
    }
    be.gather_rows_backward(saved_.ids, dh, view(g, "model.embed_tokens.weight"));
    finished(0);
    saved_ = {};  // the activations are spent: free them before the next step makes its own
}

Tensor Model::forward_cached(const std::vector<int32_t>& tokens, int64_t B, int64_t T,
                             const std::vector<int32_t>& start, const KvCache& cache,
                             const LogitsBlock& every_position, int64_t block_rows) {
    const ModelConfig& c = config_;
    const int64_t N = B * T;
    if (static_cast<int64_t>(tokens.size()) != N || static_cast<int64_t>(start.size()) != B ||
        cache.batch() != B || T < 1)
        throw std::logic_error("forward_cached: tokens, start and cache do not match B and T");
    Backend& be = backend_;
    const int64_t limit = kv_cache_max_positions(c);
    std::vector<int32_t> pos_host(static_cast<size_t>(N));
    for (int64_t b = 0; b < B; ++b) {
        if (start[b] < 0 || (limit >= 0 && start[b] + T > limit))
            throw std::logic_error("forward_cached: positions beyond what the cache holds");
        for (int64_t t = 0; t < T; ++t) pos_host[b * T + t] = static_cast<int32_t>(start[b] + t);
    }
    refresh_bf16_weights();
    if (T == 1) {
        Tensor logits = decode_step(tokens, start, cache);
        if (every_position) every_position(0, logits);
        return logits;
    }
    Tensor ids = upload_tokens(tokens);
    Tensor positions = be.alloc({N}, DType::I32);
    be.upload(positions, pos_host.data());
    CachedAttention cached{&cache, be.alloc({B}, DType::I32)};
    be.upload(cached.start, start.data());

    Tensor h = be.alloc({N, c.d_model});
    LayerActivations scratch = alloc_activations(N, /*for_backward=*/false, /*cached=*/true);
    be.gather_rows(embed_, ids, h);
    for (int64_t l = 0; l < c.n_layers; ++l)
        layer_forward(l, h, scratch, positions, B, T, Tensor{}, &cached);
    if (every_position) {
        const int64_t rows =
            block_rows > 0 ? block_rows : std::max<int64_t>(1, kLogitsBlockElements / c.vocab_size);
        for (int64_t r = 0; r < N; r += rows)
            every_position(r, logits_of(h.rows(r, std::min(N, r + rows))));
    }
    // Only each sequence's last token is needed (T > 1 here: decode_step takes one token): the
    // LM head is the largest matmul.
    std::vector<int32_t> last(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b) last[b] = static_cast<int32_t>(b * T + T - 1);
    Tensor rows = be.alloc({B}, DType::I32);
    be.upload(rows, last.data());
    Tensor h_last = be.alloc({B, c.d_model});
    be.gather_rows(h, rows, h_last);
    return logits_of(h_last);
}

namespace {

// A decode step's tensors, kept with the cache (KvCache::decode_state) from step to step.
struct DecodeState {
    Tensor params;  // the model the step was made for (a cache may serve another model next)
    Precision precision = Precision::F32;
    bool bf16_storage = false;
    // [B] I32 each, slices of one [2B] tensor that one upload fills; start is also the
    // positions (one token per sequence).
    Tensor ids_start, ids, start;
    Tensor h;  // [B, d]
    LayerActivations scratch;
    Tensor logits;  // [B, V]: the step's output
    Backend::StepRecording recording;
};

}  // namespace

Tensor Model::decode_step(const std::vector<int32_t>& tokens, const std::vector<int32_t>& start,
                          const KvCache& cache) {
    const ModelConfig& c = config_;
    Backend& be = backend_;
    const int64_t B = cache.batch();
    check_tokens(tokens);
    if (static_cast<int64_t>(tokens.size()) != B || static_cast<int64_t>(start.size()) != B)
        throw std::logic_error("decode_step: " + std::to_string(tokens.size()) + " tokens and " +
                               std::to_string(start.size()) + " starts for a batch of " +
                               std::to_string(B));
    auto state = std::static_pointer_cast<DecodeState>(cache.decode_state());
    // Another model's weights, or another precision's kernels, would make a recording of the
    // step wrong: start afresh.
    if (!state || state->params.buffer() != params_.buffer() ||
        state->precision != be.matmul_precision() || state->bf16_storage != bf16_storage()) {
        state = std::make_shared<DecodeState>();
        state->params = params_;
        state->precision = be.matmul_precision();
        state->bf16_storage = bf16_storage();
        state->ids_start = be.alloc({2 * B}, DType::I32);
        state->ids = state->ids_start.slice(0, {B});
        state->start = state->ids_start.slice(B, {B});
        state->h = be.alloc({B, c.d_model});
        state->scratch = alloc_activations(B, /*for_backward=*/false, /*cached=*/true);
        // One sequence: q, k and v as slices of one row (layer_forward makes them at once),
        // each starting 32-byte aligned as a tensor of its own would.
        const int64_t qd = c.q_dim(), kvd = c.kv_dim();
        if (B == 1 && layers_[0].wqkv.defined() && qd % 8 == 0 && kvd % 8 == 0) {
            LayerActivations& a = state->scratch;
            a.qkv = be.alloc({1, qd + 2 * kvd});
            a.q = a.qkv.slice(0, {1, qd});
            a.k = a.qkv.slice(qd, {1, kvd});
            a.v = a.qkv.slice(qd + kvd, {1, kvd});
        }
        cache.decode_state() = state;
    }
    DecodeState& d = *state;
    std::vector<int32_t> ids_start(tokens);
    ids_start.insert(ids_start.end(), start.begin(), start.end());
    be.upload(d.ids_start, ids_start.data());
    be.run_recorded(d.recording, [&] {
        const CachedAttention cached{&cache, d.start};
        be.gather_rows(embed_, d.ids, d.h);
        for (int64_t l = 0; l < c.n_layers; ++l)
            layer_forward(l, d.h, d.scratch, d.start, B, 1, Tensor{}, &cached);
        d.logits = logits_of(d.h);
    });
    // The caller's own copy: the next step overwrites d.logits.
    Tensor out = be.alloc(d.logits.shape());
    be.copy(d.logits, out);
    return out;
}

TokenScore score_tokens(Model& model, const std::vector<int32_t>& tokens, int64_t window) {
    TokenScore score;
    if (window <= 0) throw std::logic_error("score_tokens: window must be positive");
    const int64_t n = static_cast<int64_t>(tokens.size());
    for (int64_t start = 0; start + 1 < n; start += window) {
        const int64_t T = std::min(window, n - 1 - start);
        std::vector<int32_t> inputs(tokens.begin() + start, tokens.begin() + start + T);
        std::vector<int32_t> targets(tokens.begin() + start + 1, tokens.begin() + start + T + 1);
        ForwardResult r = model.forward_loss(inputs, 1, T, targets);
        score.total_nats += r.loss * static_cast<double>(r.n_targets);
        score.tokens += r.n_targets;
    }
    return score;
}

}  // namespace tmx

// BF16 tensors (engine/compute/backend.h, "bf16 tensors") on every backend that has them: the CPU
// (which CI runs) and CUDA (on a GPU); a backend without them refuses to allocate one.
// - convert() rounds to nearest even exactly as round_to_bf16 does (ties, subnormals,
//   overflow, infinities, NaN), widens exactly, and works on views at any element offset.
// - An op with a BF16 out stores exactly the rounding of what it stores in an F32 out, on the
//   same backend (the arithmetic must not change, only the store).
// - In BF16 precision, a BF16 operand of matmul(), grouped_matmul() and
//   grouped_matmul_backward() gives the result of an F32 operand holding the same values: on
//   the CPU bit for bit (the same sgemm on the same values), elsewhere within fp32 summation
//   error (a GPU library may pick another algorithm for another operand type or alignment).
// - A model in BF16 precision that stores its weights and matmul-only activations in bf16
//   gives the logits, losses and gradients of one that keeps them fp32 (bit for bit on the
//   CPU), and refreshes its bf16 weights after an optimizer step.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "backends/registry.h"
#include "engine/compute/backend.h"
#include "engine/compute/precision.h"
#include "engine/model/kv_cache.h"
#include "engine/model/model.h"
#include "tests/backends/backend_pair_fixture.h"
#include "tests/model_scenarios.h"

namespace tmx::test {
namespace {

float from_bits(uint32_t u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

bool is_bf16_nan(uint16_t b) {
    return (b & 0x7f80u) == 0x7f80u && (b & 0x007fu) != 0;
}

// The same bf16 patterns, where NaN matches any NaN (a GPU may give its canonical NaN).
::testing::AssertionResult SameBf16(const std::vector<uint16_t>& got,
                                    const std::vector<uint16_t>& want) {
    if (got.size() != want.size())
        return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
    size_t differing = 0, first = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        const bool same = got[i] == want[i] || (is_bf16_nan(got[i]) && is_bf16_nan(want[i]));
        if (!same && differing++ == 0) first = i;
    }
    if (differing == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << differing << " of " << got.size() << " elements differ; the first, element " << first
           << ": 0x" << std::hex << got[first] << " vs 0x" << want[first] << " (the rounding of "
           << from_bf16_bits(want[first]) << ")";
}

std::vector<uint16_t> bf16_of(const std::vector<float>& v) {
    std::vector<uint16_t> r(v.size());
    for (size_t i = 0; i < v.size(); ++i) r[i] = to_bf16_bits(v[i]);
    return r;
}

std::vector<float> values_of(const std::vector<uint16_t>& b) {
    std::vector<float> r(b.size());
    for (size_t i = 0; i < b.size(); ++i) r[i] = from_bf16_bits(b[i]);
    return r;
}

class Bf16Tensors : public BackendPairTest {
  protected:
    bool needs_training() const override { return true; }  // grouped_matmul_backward
    void SetUp() override {
        BackendPairTest::SetUp();
        if (IsSkipped() || HasFatalFailure()) return;
        if (!be().has_bf16_tensors())
            GTEST_SKIP() << "backend " << backend_name() << " has no bf16 tensors";
    }

    // A BF16 tensor on the backend under test holding the rounding of host.
    Tensor up_bf16(const std::vector<float>& host, Shape shape) {
        Tensor t = be().alloc(std::move(shape), DType::BF16);
        const std::vector<uint16_t> bits = bf16_of(host);
        be().upload(t, bits.data());
        return t;
    }
    std::vector<uint16_t> down_bf16(const Tensor& t) {
        std::vector<uint16_t> host(static_cast<size_t>(t.numel()));
        be().download(t, host.data());
        return host;
    }
    // The values of host rounded to bf16, as floats: what a BF16 tensor of host holds.
    static std::vector<float> rounded(const std::vector<float>& host) {
        std::vector<float> r(host.size());
        for (size_t i = 0; i < host.size(); ++i) r[i] = round_to_bf16(host[i]);
        return r;
    }
    // got against want: bit for bit on the CPU, within tol of the scale elsewhere.
    void expect_same_result(const std::vector<float>& got, const std::vector<float>& want,
                            double tol, const std::string& what) {
        if (backend_name() == "cpu") {
            EXPECT_TRUE(BitwiseEqual(got, want)) << what << "; " << trace();
        } else {
            EXPECT_TRUE(Close(got, want, tol)) << what << "; " << trace();
        }
    }
};

TEST_P(Bf16Tensors, ConvertRoundsToNearestEvenAndWidensExactly) {
    std::vector<float> host = {
        1.0f,
        -1.0f,
        0.0f,
        -0.0f,
        from_bits(0x3f808000u),             // 1 + 2^-8: a tie, to the even 1
        from_bits(0x3f818000u),             // 1 + 3 * 2^-8: a tie, to the even 1 + 2^-6
        from_bits(0x3f808001u),             // just above the tie: up
        from_bits(0x3f807fffu),             // just below: down
        from_bits(0x00000001u),             // the smallest subnormal: to 0
        from_bits(0x00018000u),             // a subnormal tie
        from_bits(0x807fffffu),             // the largest negative subnormal: to -2^-126
        std::numeric_limits<float>::max(),  // overflows to infinity
        from_bits(0x7f7f7fffu),             // the largest that stays finite
        std::numeric_limits<float>::infinity(),
        -std::numeric_limits<float>::infinity(),
        std::numeric_limits<float>::quiet_NaN(),
        from_bits(0xff800001u),  // a signalling NaN
    };
    for (double scale : {1e-30, 1e-3, 1.0, 1e5, 1e30})
        for (float x : normal(200, scale)) host.push_back(x);
    const int64_t n = static_cast<int64_t>(host.size());

    Tensor src = up(be(), host, {n});
    Tensor bf = be().alloc({n}, DType::BF16);
    be().convert(src, bf);
    const std::vector<uint16_t> bits = down_bf16(bf);
    EXPECT_TRUE(SameBf16(bits, bf16_of(host))) << trace();
    EXPECT_EQ(bits[4], 0x3f80u);
    EXPECT_EQ(bits[5], 0x3f82u);
    EXPECT_EQ(bits[11], 0x7f80u) << "fp32's largest rounds to infinity";
    EXPECT_TRUE(is_bf16_nan(bits[15]) && is_bf16_nan(bits[16])) << "NaN stays NaN";

    Tensor back = poisoned(be(), {n});
    be().convert(bf, back);
    const std::vector<float> widened = down(be(), back);
    EXPECT_TRUE(BitwiseEqual(widened, values_of(bits))) << "widening is exact; " << trace();

    // Views at odd element offsets and odd lengths, so that no vector path may assume alignment.
    for (int64_t offset : {1, 3, 8}) {
        const int64_t len = n - offset - 2;
        Tensor part = be().alloc({n}, DType::BF16);
        const std::vector<uint16_t> zeros(static_cast<size_t>(n), 0x4000u);  // 2.0
        be().upload(part, zeros.data());
        be().convert(src.slice(offset, {len}), part.slice(offset, {len}));
        const std::vector<uint16_t> got = down_bf16(part);
        std::vector<uint16_t> want = zeros;
        for (int64_t i = 0; i < len; ++i) want[offset + i] = to_bf16_bits(host[offset + i]);
        EXPECT_TRUE(SameBf16(got, want)) << "offset " << offset << "; " << trace();

        Tensor wide = poisoned(be(), {len});
        be().convert(bf.slice(offset, {len}), wide);
        const std::vector<float> w = down(be(), wide);
        EXPECT_TRUE(
            BitwiseEqual(w, values_of({bits.begin() + offset, bits.begin() + offset + len})))
            << "widening at offset " << offset << "; " << trace();
    }
}

TEST_P(Bf16Tensors, OpsWithABf16OutStoreTheRoundingOfTheirF32Result) {
    Backend::ModeScope bf16(be(), {.precision = Precision::BF16});  // for attention's bf16 out
    // Runs op into an F32 out and into a BF16 out of the same shape.
    const auto expect_rounded = [&](const std::string& what, const Shape& shape,
                                    const std::function<void(const Tensor&)>& op) {
        Tensor f32 = poisoned(be(), shape);
        Tensor bf = be().alloc(shape, DType::BF16);
        op(f32);
        op(bf);
        EXPECT_TRUE(SameBf16(down_bf16(bf), bf16_of(down(be(), f32)))) << what << "; " << trace();
    };
    struct Rows {
        int64_t N, d;
    };
    for (const Rows& r : {Rows{1, 8}, Rows{37, 130}, Rows{5, 1027}}) {
        const int64_t N = r.N, d = r.d;
        SCOPED_TRACE("N " + std::to_string(N) + ", d " + std::to_string(d));
        Tensor x = up(be(), normal(N * d, 2.0), {N, d});
        Tensor y = up(be(), normal(N * d), {N, d});
        Tensor w = up(be(), normal(d), {d}), b = up(be(), normal(d), {d});
        expect_rounded("rmsnorm", {N, d}, [&](const Tensor& out) {
            be().norm(NormType::RmsNorm, x, w, Tensor{}, 1e-5f, out);
        });
        expect_rounded("layernorm", {N, d}, [&](const Tensor& out) {
            be().norm(NormType::LayerNorm, x, w, b, 1e-5f, out);
        });
        for (Activation act :
             {Activation::Gelu, Activation::Silu, Activation::Relu, Activation::Relu2})
            expect_rounded("activation " + std::to_string(static_cast<int>(act)), {N, d},
                           [&](const Tensor& out) { be().activation(act, x, out); });
        expect_rounded("swiglu", {N, d}, [&](const Tensor& out) { be().swiglu(x, y, out); });
        std::vector<int32_t> targets = ints(N, 0, static_cast<int32_t>(d));
        targets[0] = -1;  // an unscored row: zeros
        Tensor tgt = up_ids(be(), targets, {N});
        expect_rounded("cross_entropy_backward", {N, d},
                       [&](const Tensor& out) { be().cross_entropy_backward(x, tgt, 0.37f, out); });
    }
    // Attention where it runs in bf16 (head dims up to 128), windows shorter and longer than T.
    struct AttentionCase {
        int64_t B, T, H, Hkv, hd, window;
    };
    for (const AttentionCase& c : {AttentionCase{1, 1, 2, 1, 64, 0},
                                   {2, 37, 4, 2, 40, 0},
                                   {1, 70, 8, 2, 128, 16},
                                   {2, 45, 4, 4, 16, 7}}) {
        SCOPED_TRACE("attention B,T,H,Hkv,hd,window " + std::to_string(c.B) + "," +
                     std::to_string(c.T) + "," + std::to_string(c.H) + "," + std::to_string(c.Hkv) +
                     "," + std::to_string(c.hd) + "," + std::to_string(c.window));
        const Shape qs{c.B, c.T, c.H, c.hd}, ks{c.B, c.T, c.Hkv, c.hd};
        Tensor q = up(be(), normal(shape_numel(qs), 1.5), qs);
        Tensor k = up(be(), normal(shape_numel(ks), 1.5), ks);
        Tensor v = up(be(), normal(shape_numel(ks)), ks);
        expect_rounded("attention", qs,
                       [&](const Tensor& out) { be().attention(q, k, v, out, c.window); });
    }
    // gather_rows moves BF16 rows as they are.
    const int64_t N = 40, d = 67, S = 53;
    const std::vector<float> xs = normal(N * d);
    const std::vector<int32_t> rows = ints(S, 0, N);
    Tensor out = be().alloc({S, d}, DType::BF16);
    be().gather_rows(up_bf16(xs, {N, d}), up_ids(be(), rows, {S}), out);
    std::vector<uint16_t> want;
    for (int32_t r : rows)
        for (int64_t j = 0; j < d; ++j) want.push_back(to_bf16_bits(xs[r * d + j]));
    EXPECT_TRUE(SameBf16(down_bf16(out), want)) << "gather_rows; " << trace();
}

TEST_P(Bf16Tensors, Bf16OperandsGiveTheResultOfTheirValues) {
    Backend::ModeScope bf16(be(), {.precision = Precision::BF16});
    // Dense: each operand BF16 or not, every transposition; K not a multiple of 8, and one that is.
    struct Dense {
        int64_t M, N, K;
    };
    for (const Dense& shape : {Dense{1, 70, 64}, Dense{33, 50, 77}, Dense{130, 96, 256}}) {
        const int64_t M = shape.M, N = shape.N, K = shape.K;
        for (int form = 0; form < 4; ++form) {
            const MatmulOptions opts{.trans_a = (form & 1) != 0, .trans_b = (form & 2) != 0};
            const Shape as = opts.trans_a ? Shape{K, M} : Shape{M, K};
            const Shape bs = opts.trans_b ? Shape{N, K} : Shape{K, N};
            const std::vector<float> a = normal(M * K), b = normal(K * N), bias = normal(N);
            Tensor a32 = up(be(), rounded(a), as), b32 = up(be(), rounded(b), bs);
            Tensor a16 = up_bf16(a, as), b16 = up_bf16(b, bs);
            Tensor bias_t = up(be(), bias, {N});
            const auto run = [&](const Tensor& x, const Tensor& y) {
                Tensor out = poisoned(be(), {M, N});
                be().matmul(x, y, out, opts, bias_t);
                return down(be(), out);
            };
            const std::vector<float> want = run(a32, b32);
            const std::string what = "matmul M,N,K " + std::to_string(M) + "," + std::to_string(N) +
                                     "," + std::to_string(K) + " form " + std::to_string(form);
            expect_same_result(run(a16, b32), want, reduction_tol(K), what + ", a bf16");
            expect_same_result(run(a32, b16), want, reduction_tol(K), what + ", b bf16");
            expect_same_result(run(a16, b16), want, reduction_tol(K), what + ", both bf16");
        }
    }
    // Grouped, forward and backward: few slots (the decode path) and many, one expert with none.
    struct Grouped {
        int S;
        int64_t Nout, K;
    };
    for (const Grouped& shape : {Grouped{6, 40, 24}, Grouped{150, 72, 77}, Grouped{300, 64, 128}}) {
        const int S = shape.S;
        const int64_t Nout = shape.Nout, K = shape.K;
        const int64_t E = 4;
        // Nondecreasing, as the contract requires (a slot in two experts' ranges would be summed
        // into twice, racing on a GPU); expert 1 gets none.
        std::vector<int32_t> offsets = {0, S / 3, S / 3, S - S / 3, S};
        const std::vector<float> x = normal(S * K), w = normal(E * Nout * K);
        const std::vector<float> bias = normal(E * Nout), dy = normal(S * Nout);
        const std::vector<float> dx0 = accum_init(S * K), dw0 = accum_init(E * Nout * K);
        Tensor off = up_ids(be(), offsets, {E + 1});
        Tensor bias_t = up(be(), bias, {E, Nout}), dy_t = up(be(), dy, {S, Nout});
        struct Result {
            std::vector<float> out, dx, dw;
        };
        const auto run = [&](const Tensor& xt, const Tensor& wt) {
            Result r;
            Tensor out = poisoned(be(), {S, Nout});
            be().grouped_matmul(xt, wt, bias_t, off, out);
            r.out = down(be(), out);
            Tensor dx = up(be(), dx0, {S, K}), dw = up(be(), dw0, {E, Nout, K});
            be().grouped_matmul_backward(xt, wt, off, dy_t, dx, dw, Tensor{});
            r.dx = down(be(), dx);
            r.dw = down(be(), dw);
            return r;
        };
        Tensor x32 = up(be(), rounded(x), {S, K}), w32 = up(be(), rounded(w), {E, Nout, K});
        const Result want = run(x32, w32);
        const std::string what = "grouped S,Nout,K " + std::to_string(S) + "," +
                                 std::to_string(Nout) + "," + std::to_string(K);
        for (int form = 1; form < 4; ++form) {
            const Result got =
                run(form & 1 ? up_bf16(x, {S, K}) : x32, form & 2 ? up_bf16(w, {E, Nout, K}) : w32);
            const std::string f = what + (form == 1   ? ", x bf16"
                                          : form == 2 ? ", w bf16"
                                                      : ", both bf16");
            expect_same_result(got.out, want.out, reduction_tol(K), f + ": out");
            expect_same_result(got.dx, want.dx, reduction_tol(Nout), f + ": d_x");
            expect_same_result(got.dw, want.dw, reduction_tol(S), f + ": d_w");
        }
    }
}

// Logits, loss, aux and every gradient of a small model, in BF16 precision.
struct ModelResult {
    std::vector<float> logits, grads;
    double loss = 0, aux = 0, train_loss = 0;
};

ModelResult run_model(Model& model, Backend& be) {
    const ModelConfig& c = model.config();
    const int64_t B = 2, T = 19;
    std::vector<int32_t> tokens(B * T), targets(B * T);
    for (int64_t i = 0; i < B * T; ++i) {
        tokens[i] = static_cast<int32_t>((i * 37 + 11) % c.vocab_size);
        targets[i] = i % T == T - 1 ? -1 : static_cast<int32_t>((i * 53 + 5) % c.vocab_size);
    }
    ModelResult r;
    const ForwardResult f = model.forward(tokens, B, T, &targets);
    r.logits.resize(static_cast<size_t>(f.logits.numel()));
    be.download(f.logits, r.logits.data());
    r.loss = f.loss;
    r.aux = f.aux;
    model.zero_grads();
    r.train_loss = model.forward(tokens, B, T, &targets, /*keep_activations=*/true).loss;
    model.backward();
    r.grads.resize(static_cast<size_t>(model.num_params()));
    be.download(model.grads(), r.grads.data());
    return r;
}

TEST_P(Bf16Tensors, ModelsStoringBf16GiveTheResultsOfFp32Storage) {
    Backend::ModeScope bf16(be(), {.precision = Precision::BF16});
    for (const char* name : {"test-tiny", "test-tiny-dense", "test-tiny-swiglu"}) {
        SCOPED_TRACE(name);
        const ModelConfig config = test_config(name);
        Model fp32_storage(config, be()), bf16_storage(config, be());
        fp32_storage.set_bf16_storage(false);
        fp32_storage.init_random(11);
        bf16_storage.params_from_host(fp32_storage.params_to_host());
        const ModelResult want = run_model(fp32_storage, be());
        const ModelResult got = run_model(bf16_storage, be());
        const bool cpu = backend_name() == "cpu";
        if (cpu) {
            EXPECT_TRUE(BitwiseEqual(got.logits, want.logits)) << "logits";
            EXPECT_TRUE(BitwiseEqual(got.grads, want.grads)) << "gradients";
            EXPECT_EQ(got.loss, want.loss);
            EXPECT_EQ(got.train_loss, want.train_loss);
            EXPECT_EQ(got.aux, want.aux);
        } else {
            EXPECT_TRUE(Close(got.logits, want.logits, 1e-5)) << "logits";
            EXPECT_TRUE(Close(got.grads, want.grads, 1e-4, /*floor=*/0.0)) << "gradients";
            EXPECT_NEAR(got.loss, want.loss, 1e-6 * want.loss);
            EXPECT_NEAR(got.train_loss, want.train_loss, 1e-6 * want.train_loss);
        }

        // An optimizer step, announced: the next pass reads the new weights (as a fresh model
        // given them does), not the bf16 copy of the old ones.
        Tensor m = be().alloc({bf16_storage.num_params()}), v = be().alloc(m.shape());
        for (const Tensor* t : {&m, &v}) be().fill(*t, 0.0f);
        be().adamw(bf16_storage.params(), bf16_storage.grads(), m, v,
                   {.lr = 1e-2f,
                    .beta1 = 0.9f,
                    .beta2 = 0.95f,
                    .eps = 1e-8f,
                    .weight_decay = 0.1f,
                    .step = 1});
        bf16_storage.params_changed();
        Model fresh(config, be());
        fresh.params_from_host(bf16_storage.params_to_host());
        const ModelResult after = run_model(bf16_storage, be());
        const ModelResult fresh_result = run_model(fresh, be());
        EXPECT_TRUE(BitwiseEqual(after.logits, fresh_result.logits)) << "logits after a step";
        EXPECT_NE(after.loss, got.loss) << "the step changed nothing the test could see";
    }
}

// Decoding in bf16 after an optimizer step reads the new weights: the step recorded before it
// (a CUDA graph on CUDA) reads the bf16 copy in place, and params_changed() refreshes that copy
// before the next step replays. The reference keeps its weights fp32 (no copy to go stale).
TEST_P(Bf16Tensors, RecordedDecodeStepsReadTheWeightsOfTheLastOptimizerStep) {
    Backend::ModeScope bf16(be(), {.precision = Precision::BF16});
    const ModelConfig config = test_config("test-tiny");
    const int64_t V = config.vocab_size, prompt = 4, steps = 3;
    const std::vector<int32_t> tokens = ints(prompt + steps + 1, 0, static_cast<int32_t>(V));
    // The model under test; the reference given the new weights; and one that keeps the old
    // weights: what a stale bf16 copy would decode.
    Model bf16_copy(config, be()), updated(config, be()), stale(config, be());
    updated.set_bf16_storage(false);
    stale.set_bf16_storage(false);
    bf16_copy.init_random(static_cast<uint64_t>(ints(1, 0, 1 << 30)[0]));
    for (Model* m : {&updated, &stale}) m->params_from_host(bf16_copy.params_to_host());
    std::vector<KvCache> caches;
    for (int i = 0; i < 3; ++i) caches.emplace_back(config, be(), 1);
    auto decode = [&](Model& m, KvCache& cache, int64_t pos) {
        const Tensor logits =
            m.forward_cached({tokens[pos]}, 1, 1, {static_cast<int32_t>(pos)}, cache);
        std::vector<float> host(static_cast<size_t>(logits.numel()));
        be().download(logits, host.data());
        return host;
    };
    const std::vector<int32_t> head(tokens.begin(), tokens.begin() + prompt);
    Model* models[] = {&bf16_copy, &updated, &stale};
    for (int i = 0; i < 3; ++i) {
        models[i]->forward_cached(head, 1, prompt, {0}, caches[i]);
        for (int64_t pos = prompt; pos < prompt + steps; ++pos) decode(*models[i], caches[i], pos);
    }

    // An AdamW step from random gradients, announced.
    const int64_t P = bf16_copy.num_params();
    const std::vector<float> g = normal(P);
    be().upload(bf16_copy.grads(), g.data());
    Tensor m = be().alloc({P}), v = be().alloc({P});
    for (const Tensor* t : {&m, &v}) be().fill(*t, 0.0f);
    be().adamw(bf16_copy.params(), bf16_copy.grads(), m, v,
               {.lr = 1e-2f,
                .beta1 = 0.9f,
                .beta2 = 0.95f,
                .eps = 1e-8f,
                .weight_decay = 0.1f,
                .step = 1});
    bf16_copy.params_changed();
    updated.params_from_host(bf16_copy.params_to_host());

    const int64_t last = prompt + steps;
    const std::vector<float> got = decode(bf16_copy, caches[0], last);
    expect_same_result(got, decode(updated, caches[1], last), 1e-5,
                       "logits of the step after the update");
    EXPECT_FALSE(Close(got, decode(stale, caches[2], last), 1e-3))
        << "the step after the update decoded with the old weights; " << trace();
}

// Batched decoding in bf16, generation's default on CUDA: B sequences in one KvCache, prefilled
// together, then a token each per step (steps after the first replay a recording: a CUDA graph
// on CUDA), through the rolling buffer's wrap, against the CPU doing the same in bf16. Both
// round alike, so the logits differ by summation order and the occasional value sent to the
// neighbouring bf16 one: 1e-2 of their scale, as the model tests allow, while a wrong row,
// slot or expert moves them by far more. 8 sequences put 16 slots through the experts'
// matrix-vector path; 17 put 34, past it, onto the tiled kernels.
TEST_P(Bf16Tensors, BatchedDecodingMatchesTheCpuInBf16) {
    Backend::ModeScope bf16(be(), {.precision = Precision::BF16});
    Backend::ModeScope cpu_bf16(cpu(), {.precision = Precision::BF16});
    const ModelConfig config = test_config("test-tiny");
    const int32_t V = static_cast<int32_t>(config.vocab_size);
    const int64_t prompt = 5, steps = 6;  // 11 positions: past the window of 8
    // Weights spread as a trained model's are (init's small ones leave the experts' share of
    // the logits too small for a wrong slot to show).
    auto on_cpu = spread_model(config, cpu(), static_cast<uint64_t>(ints(1, 0, 1 << 30)[0]));
    Model on_be(config, be());
    on_be.params_from_host(on_cpu->params_to_host());
    const auto host = [](Backend& b, const Tensor& t) {
        std::vector<float> h(static_cast<size_t>(t.numel()));
        b.download(t, h.data());
        return h;
    };
    for (int64_t B : {8, 17}) {
        SCOPED_TRACE("batch " + std::to_string(B));
        KvCache cache_cpu(config, cpu(), B), cache_be(config, be(), B);
        const std::vector<int32_t> head = ints(B * prompt, 0, V);
        const std::vector<int32_t> zeros(static_cast<size_t>(B), 0);
        expect_same_result(host(be(), on_be.forward_cached(head, B, prompt, zeros, cache_be)),
                           host(cpu(), on_cpu->forward_cached(head, B, prompt, zeros, cache_cpu)),
                           1e-2, "prefill");
        for (int64_t s = 0; s < steps; ++s) {
            const std::vector<int32_t> next = ints(B, 0, V);
            const std::vector<int32_t> at(static_cast<size_t>(B), static_cast<int32_t>(prompt + s));
            expect_same_result(host(be(), on_be.forward_cached(next, B, 1, at, cache_be)),
                               host(cpu(), on_cpu->forward_cached(next, B, 1, at, cache_cpu)), 1e-2,
                               "decode step " + std::to_string(s));
        }
    }
}

// An op the contract does not list for a BF16 input refuses one, naming the op and the
// argument, before the backend reads two-byte elements as four-byte floats.
TEST_P(Bf16Tensors, OpsOffTheContractRefuseABf16Input) {
    Backend::ModeScope bf16(be(), {.precision = Precision::BF16});
    const Shape shape{4, 8};
    const std::vector<float> host = normal(32);
    const Tensor h = up_bf16(host, shape);
    auto f32 = [&] {
        Tensor t = be().alloc(shape);
        be().upload(t, host.data());
        return t;
    };
    const Tensor a = f32(), b = f32(), out = f32();
    const Tensor one = be().alloc({1}), row = be().alloc({8}), d_row = be().alloc({8});
    const Tensor positions = be().alloc({4}, DType::I32);
    const std::vector<int32_t> pos{0, 1, 2, 3};
    be().upload(positions, pos.data());
    const std::vector<std::pair<std::string, std::function<void()>>> refused = {
        {"add", [&] { be().add(h, b, out); }},
        {"activation_backward", [&] { be().activation_backward(Activation::Gelu, h, b, out); }},
        {"swiglu_backward", [&] { be().swiglu_backward(h, a, b, out, f32()); }},
        {"sum_squares", [&] { be().sum_squares(h, one); }},
        {"scale", [&] { be().scale(h, 2.0f); }},
        {"norm_backward",
         [&] { be().norm_backward(NormType::RmsNorm, h, row, b, 1e-5f, out, d_row, Tensor{}); }},
        {"bias_backward", [&] { be().bias_backward(h, d_row); }},
        {"rope",
         [&] {
             be().rope(h.reshape({4, 2, 4}), positions, 10000.0);
         }},
    };
    for (const auto& [op, call] : refused) {
        try {
            call();
            ADD_FAILURE() << op << " took a bf16 input; " << trace();
        } catch (const std::logic_error& e) {
            const std::string what = e.what();
            EXPECT_NE(what.find(op + ":"), std::string::npos) << what;
            EXPECT_NE(what.find("is bf16, expected f32"), std::string::npos) << what;
        }
    }
    // Nothing was written: the F32 operands still hold their values.
    std::vector<float> after(32);
    be().download(out, after.data());
    EXPECT_TRUE(BitwiseEqual(after, host)) << trace();
}

// A backend without bf16 tensors refuses to allocate one, naming itself; one that holds bf16
// only as a weight format (Vulkan: linear, grouped_matmul and embedding read it as stored)
// allocates it, and an op outside that contract refuses it.
TEST(Bf16TensorsWhereAbsent, AllocatingOneIsAnErrorNamingTheBackend) {
    for (const std::string& name : backend_names()) {
        std::unique_ptr<Backend> be;
        try {
            be = make_backend(name);
        } catch (const Error&) {
            continue;  // not usable on this machine
        }
        if (be->has_bf16_tensors()) continue;
        if (be->supports_weight_format(DType::BF16)) {
            Tensor w = be->alloc({4}, DType::BF16), out = be->alloc({4});
            EXPECT_THROW(be->add(w, w, out), std::logic_error) << name;
            continue;
        }
        try {
            be->alloc({4}, DType::BF16);
            ADD_FAILURE() << name << " allocated a bf16 tensor it cannot use";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(name + " backend has no bf16"), std::string::npos)
                << e.what();
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Backends, Bf16Tensors, ::testing::ValuesIn(backend_names()),
                         backend_param_name);

}  // namespace
}  // namespace tmx::test

// Weights stored in bf16, f16 and Q8_0 on every backend besides the CPU that holds them
// (Backend::supports_weight_format; CUDA: backends/cuda/weights.cuh, Vulkan: shaders/weights.glsl):
// linear, grouped_matmul and gather_rows (the embedding) read them as stored, in the matrix-vector
// paths (decoding's few rows) and the paths for larger products, and equal the CPU backend run on
// the decoded weights. In fp32 precision at fp32's tolerances: the backends multiply the exactly
// decoded weights in fp32, so only the summation order differs, and a wrong unpacking, block
// stride, scale or offset gives errors of the order of the results. In bf16 precision (where a
// backend has it) at bf16's: operands rounded to bf16 (2^-9 relative each). Weights are placed at
// every start a model's packing gives them: a whole word, and half-way into one (an f16 or bf16
// tensor at an odd element, a Q8_0 tensor after an odd number of 34-byte blocks). Sizes are no
// multiple of any tile; Q8_0 rows are whole blocks, as the format requires. Then a model in each
// format against the CPU's f32 model on the same decoded weights, through the forward pass and
// cached decoding.
#include <optional>

#include "engine/compute/weight_format.h"
#include "engine/model/kv_cache.h"
#include "engine/model/model.h"
#include "tests/backends/backend_pair_fixture.h"

namespace tmx::test {
namespace {

constexpr DType kFormats[] = {DType::BF16, DType::F16, DType::Q8_0};

class WeightFormats : public BackendPairTest {
  protected:
    void SetUp() override {
        BackendPairTest::SetUp();
        if (IsSkipped()) return;
        for (DType t : kFormats)
            if (!be().supports_weight_format(t))
                GTEST_SKIP() << "backend " << backend_name() << " holds no " << to_string(t)
                             << " weights";
        // f32 weights (a model's norms and router) read as they are: Vulkan's fp16 copies of
        // them, an inference shortcut, are off in training mode.
        training_.emplace(be(), Backend::Mode{.training = true});
    }
    std::optional<Backend::ModeScope> training_;  // every test; some nest a precision of their own
    // A weight of `shape` in format t on the backend under test: `lead` other values, then the
    // weight's, encoded together in one buffer; the weight is the view after the lead. Its
    // decoded values (what the format holds) go to *decoded.
    Tensor stored(DType t, Shape shape, int64_t lead, std::vector<float>* decoded) {
        const int64_t n = shape_numel(shape);
        const std::vector<float> all = normal(lead + n, 0.5);
        std::vector<uint8_t> bytes(static_cast<size_t>(dtype_bytes(t, lead + n)));
        encode_weights(t, all.data(), lead + n, bytes.data());
        Tensor flat = be().alloc({lead + n}, t);
        be().upload(flat, bytes.data());
        std::vector<float> back(static_cast<size_t>(lead + n));
        decode_weights(t, bytes.data(), lead + n, back.data());
        decoded->assign(back.begin() + lead, back.end());
        return flat.slice(lead, shape);
    }
    // The precisions to run in, each with its tolerance for a sum of K products.
    std::vector<std::pair<Precision, double>> precisions(int64_t K) const {
        std::vector<std::pair<Precision, double>> p = {{Precision::F32, reduction_tol(K)}};
        if (backend_->supports_precision(Precision::BF16))
            p.emplace_back(Precision::BF16, kBf16Tol);
        return p;
    }
    // Two operands rounded to bf16 (each within 2^-9 relative) make each product within 2^-8
    // relative; on random data the sum's error is far below that of its scale.
    static constexpr double kBf16Tol = 1e-2;
    // Leads that start the weight on a whole word and half-way into one.
    static std::vector<int64_t> leads(DType t) {
        if (t == DType::Q8_0) return {0, kQ8_0BlockValues, 2 * kQ8_0BlockValues};
        return {0, 1, 2};
    }
};

TEST_P(WeightFormats, LinearReadsEachFormatAsStoredOnEveryPath) {
    SCOPED_TRACE(trace());
    struct Case {
        int64_t N, K;
        bool q8_0;  // rows are whole Q8_0 blocks
    };
    // K = 45: no multiple of 4 (the matrix-vector shader's one-by-one loop).
    for (const Case c : {Case{37, 96, true}, Case{5, 160, true}, Case{19, 45, false}}) {
        for (const auto& [precision, tol] : precisions(c.K)) {
            Backend::ModeScope mode(be(), {.precision = precision, .training = true});
            Backend::ModeScope cpu_mode(cpu(), {.precision = precision});
            for (DType t : kFormats) {
                if (t == DType::Q8_0 && !c.q8_0) continue;
                for (int64_t lead : leads(t)) {
                    // M <= 16: the matrix-vector paths; above, the tiled (Vulkan) or decoded
                    // (CUDA) ones.
                    for (int64_t M : {1, 4, 16, 17, 45}) {
                        SCOPED_TRACE(std::string(to_string(t)) + " in " + to_string(precision) +
                                     " N " + std::to_string(c.N) + " K " + std::to_string(c.K) +
                                     " lead " + std::to_string(lead) + " M " + std::to_string(M));
                        std::vector<float> w;
                        const Tensor wv = stored(t, {c.N, c.K}, lead, &w);
                        const auto x = normal(M * c.K), bias = normal(c.N), init = normal(M * c.N);
                        Tensor out_be = up(be(), init, {M, c.N}),
                               out_cpu = up(cpu(), init, {M, c.N});
                        be().linear(up(be(), x, {M, c.K}), wv, up(be(), bias, {c.N}), out_be, true);
                        cpu().linear(up(cpu(), x, {M, c.K}), up(cpu(), w, {c.N, c.K}),
                                     up(cpu(), bias, {c.N}), out_cpu, true);
                        EXPECT_TRUE(Close(down(be(), out_be), down(cpu(), out_cpu), tol));
                    }
                }
            }
        }
    }
}

TEST_P(WeightFormats, GroupedMatmulReadsEachFormatAsStoredOnEveryPath) {
    SCOPED_TRACE(trace());
    const int64_t Nout = 37, K = 64;
    // 10 slots: the matrix-vector paths; 64: the tiled (Vulkan) or decoded (CUDA) ones. An
    // expert receives none.
    for (const std::vector<int32_t>& counts :
         {std::vector<int32_t>{3, 0, 6, 1}, std::vector<int32_t>{30, 0, 25, 9}}) {
        const int64_t E = static_cast<int64_t>(counts.size());
        const std::vector<int32_t> offsets = expert_offsets(counts);
        const int64_t S = offsets.back();
        for (const auto& [precision, tol] : precisions(K)) {
            Backend::ModeScope mode(be(), {.precision = precision, .training = true});
            Backend::ModeScope cpu_mode(cpu(), {.precision = precision});
            for (DType t : kFormats) {
                for (int64_t lead : leads(t)) {
                    SCOPED_TRACE(std::string(to_string(t)) + " in " + to_string(precision) + " S " +
                                 std::to_string(S) + " lead " + std::to_string(lead));
                    std::vector<float> w;
                    const Tensor wv = stored(t, {E, Nout, K}, lead, &w);
                    const auto x = normal(S * K), bias = normal(E * Nout);
                    Tensor out_be = poisoned(be(), {S, Nout}), out_cpu = cpu().alloc({S, Nout});
                    be().grouped_matmul(up(be(), x, {S, K}), wv, up(be(), bias, {E, Nout}),
                                        up_ids(be(), offsets, {E + 1}), out_be);
                    cpu().grouped_matmul(up(cpu(), x, {S, K}), up(cpu(), w, {E, Nout, K}),
                                         up(cpu(), bias, {E, Nout}),
                                         up_ids(cpu(), offsets, {E + 1}), out_cpu);
                    EXPECT_TRUE(Close(down(be(), out_be), down(cpu(), out_cpu), tol));
                }
            }
        }
    }
}

// gather_rows from a stored table (the embedding) gives the decoded rows.
TEST_P(WeightFormats, GatheredRowsAreTheDecodedRowsExactly) {
    SCOPED_TRACE(trace());
    const int64_t V = 23, d = 64, S = 40;
    for (DType t : kFormats) {
        for (int64_t lead : leads(t)) {
            SCOPED_TRACE(std::string(to_string(t)) + " lead " + std::to_string(lead));
            std::vector<float> table;
            const Tensor tv = stored(t, {V, d}, lead, &table);
            const std::vector<int32_t> ids = ints(S, 0, static_cast<int32_t>(V));
            Tensor out = be().alloc({S, d});
            be().gather_rows(tv, up_ids(be(), ids, {S}), out);
            const std::vector<float> got = down(be(), out);
            for (int64_t s = 0; s < S; ++s)
                for (int64_t c = 0; c < d; ++c)
                    ASSERT_EQ(got[s * d + c], table[ids[s] * d + c])
                        << "slot " << s << " col " << c;
        }
    }
    // A row outside the table is reported for a stored table as for an fp32 one.
    std::vector<float> table;
    const Tensor tv = stored(DType::Q8_0, {V, d}, kQ8_0BlockValues, &table);
    Tensor out = be().alloc({2, d});
    be().gather_rows(tv, up_ids(be(), std::vector<int32_t>{1, static_cast<int32_t>(V)}, {2}), out);
    const std::string e = error_of([&] { down(be(), out); });
    EXPECT_NE(e.find("row 23 outside [0, 23)"), std::string::npos) << e;
}

// A model holding each format against the CPU's f32 model on the decoded weights, in fp32.
TEST_P(WeightFormats, ModelsInEachFormatMatchTheCpuOnTheDecodedWeights) {
    SCOPED_TRACE(trace());
    Backend::ModeScope mode(be(), {.precision = Precision::F32, .training = true});
    // test-tiny-swiglu's o_proj rows (48) are no whole Q8_0 blocks: they stay f16 in a Q8_0
    // model, so one model mixes formats.
    ModelConfig c = load_config(source_dir() + "/assets/configs/test-tiny-swiglu.json");
    c.d_model = 64;
    c.d_ff = 96;
    const int64_t B = 2, T = 7;
    const std::vector<int32_t> tokens = ints(B * T, 0, static_cast<int32_t>(c.vocab_size));
    const std::vector<float> w = normal(model_param_layout(c).total, 0.1);
    for (DType t : kFormats) {
        SCOPED_TRACE(to_string(t));
        Model on_be(c, be(), t);
        on_be.params_from_host(w);
        ASSERT_EQ(on_be.param("model.embed_tokens.weight").dtype(), t);
        Model on_cpu(c, cpu());
        on_cpu.params_from_host(on_be.params_to_host());
        const std::vector<float> got = down(be(), on_be.forward(tokens, B, T).logits);
        EXPECT_TRUE(Close(got, down(cpu(), on_cpu.forward(tokens, B, T).logits), 1e-4));

        // Token by token through the cache: the chunk's last logits of the first sequence.
        KvCache cache(c, be(), 1);
        Tensor last;
        for (int64_t i = 0; i < T; ++i)
            last = on_be.forward_cached({tokens[i]}, 1, 1, {static_cast<int32_t>(i)}, cache);
        const std::vector<float> whole(got.begin() + (T - 1) * c.vocab_size,
                                       got.begin() + T * c.vocab_size);
        EXPECT_TRUE(Close(down(be(), last), whole, 1e-4));
    }
}

INSTANTIATE_TEST_SUITE_P(Backends, WeightFormats, ::testing::ValuesIn(non_cpu_backend_names()),
                         backend_param_name);
// A build with no backend besides the CPU has nothing to instantiate this suite with.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(WeightFormats);

}  // namespace
}  // namespace tmx::test

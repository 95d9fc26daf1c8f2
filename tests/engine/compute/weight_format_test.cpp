// Weights stored in 16 and 8 bits (engine/compute/weight_format.h): the formats' definitions,
// a model holding its weights in each, and checkpoints that store them.
#include "engine/compute/weight_format.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backends/registry.h"
#include "engine/compute/precision.h"
#include "engine/core/errors.h"
#include "engine/core/file_io.h"
#include "engine/model/checkpoint.h"
#include "engine/model/kv_cache.h"
#include "engine/model/model.h"
#include "tests/test_util.h"

namespace tmx {
namespace {

// The 34 bytes of one Q8_0 block.
std::vector<uint8_t> q8_block(const std::vector<float>& x) {
    std::vector<uint8_t> out(kQ8_0BlockBytes);
    encode_weights(DType::Q8_0, x.data(), kQ8_0BlockValues, out.data());
    return out;
}
float q8_scale(const std::vector<uint8_t>& block) {
    uint16_t d;
    std::memcpy(&d, block.data(), 2);
    return f16_to_f32(d);
}
int q8_value(const std::vector<uint8_t>& block, int j) {
    return static_cast<int8_t>(block[2 + j]);
}

TEST(WeightFormat, ParsesTheFormatsAndNamesTheFlagOtherwise) {
    EXPECT_EQ(parse_weight_format("f32", "--weights"), DType::F32);
    EXPECT_EQ(parse_weight_format("BF16", "--weights"), DType::BF16);
    EXPECT_EQ(parse_weight_format("fp16", "--weights"), DType::F16);
    EXPECT_EQ(parse_weight_format("q8_0", "--weights"), DType::Q8_0);
    const std::string e = test::error_of([] { parse_weight_format("q4_0", "--weights"); });
    EXPECT_NE(e.find("--weights"), std::string::npos) << e;
    EXPECT_NE(e.find("q8_0"), std::string::npos) << e;
}

TEST(WeightFormat, Q8_0BlocksFollowTheFormatOnHandComputedValues) {
    // Zeros: scale 0 and every q 0.
    EXPECT_EQ(q8_block(std::vector<float>(32, 0.0f)), std::vector<uint8_t>(34, 0));

    // max |x| = 127: d = 1 exactly, q = round(x), ties away from zero.
    std::vector<float> x(32);
    for (int j = 0; j < 32; ++j) x[j] = 0.5f * static_cast<float>(j) - 3.0f;  // -3 ... 12.5
    x[0] = -127.0f;
    x[1] = 2.5f;
    x[2] = -2.5f;
    std::vector<uint8_t> b = q8_block(x);
    EXPECT_EQ(q8_scale(b), 1.0f);
    EXPECT_EQ(q8_value(b, 0), -127);
    EXPECT_EQ(q8_value(b, 1), 3);
    EXPECT_EQ(q8_value(b, 2), -3);
    EXPECT_EQ(q8_value(b, 31), 13);  // 12.5 -> 13
    EXPECT_EQ(q8_value(b, 10), 2);   // 2.0

    // One large value: 254 sets d = 2; the ones are halfway (0.5 q) and round away to 1.
    std::vector<float> big(32, 1.0f);
    big[5] = 254.0f;
    b = q8_block(big);
    EXPECT_EQ(q8_scale(b), 2.0f);
    EXPECT_EQ(q8_value(b, 5), 127);
    EXPECT_EQ(q8_value(b, 0), 1);
    std::vector<float> back(32);
    decode_weights(DType::Q8_0, b.data(), 32, back.data());
    EXPECT_EQ(back[5], 254.0f);
    EXPECT_EQ(back[0], 2.0f);

    // Negative extremes keep their sign and saturate at -127.
    std::vector<float> neg(32, -0.25f);
    neg[31] = -508.0f;  // d = 4
    b = q8_block(neg);
    EXPECT_EQ(q8_scale(b), 4.0f);
    EXPECT_EQ(q8_value(b, 31), -127);
    EXPECT_EQ(q8_value(b, 0), 0);  // -0.0625 rounds to 0

    // Rows that are no multiple of 32 are refused, here and by the backend.
    std::vector<float> odd(48, 1.0f);
    std::vector<uint8_t> out(64);
    EXPECT_THROW(encode_weights(DType::Q8_0, odd.data(), 48, out.data()), Error);
    auto be = make_backend("cpu");
    EXPECT_NE(test::error_of([&] {
                  be->alloc({3, 48}, DType::Q8_0);
              }).find("blocks of 32"),
              std::string::npos);
    Tensor w = be->alloc({2, 48}, DType::Q8_0);  // 96 values: whole blocks, rows not
    Tensor x2 = be->alloc({1, 48}), y = be->alloc({1, 2});
    EXPECT_THROW(be->linear(x2, w, Tensor{}, y), std::logic_error);
}

TEST(WeightFormat, SixteenBitFormatsRoundToNearestEven) {
    test::TempDir tmp;
    const float values[] = {1.0f,     1.0f + 0x1.0p-8f, 1.0f + 0x1.8p-8f, 1.0f + 0x1.0p-11f,
                            65504.0f, 70000.0f,         -0x1.0p-20f};
    uint16_t out[7];
    float back[7];
    encode_weights(DType::BF16, values, 7, out);
    decode_weights(DType::BF16, out, 7, back);
    for (int i = 0; i < 7; ++i) EXPECT_EQ(back[i], round_to_bf16(values[i])) << i;
    encode_weights(DType::F16, values, 7, out);
    decode_weights(DType::F16, out, 7, back);
    EXPECT_EQ(back[0], 1.0f);
    EXPECT_EQ(back[3], 1.0f);  // halfway between f16 1 and 1 + 2^-10: the even one
    EXPECT_EQ(back[4], 65504.0f);
    EXPECT_TRUE(std::isinf(back[5]));
    EXPECT_EQ(back[6], -0x1.0p-20f);  // an f16 subnormal, exact
}

ModelConfig small_config(const std::string& name = "test-tiny") {
    ModelConfig c = load_config(test::source_dir() + "/assets/configs/" + name + ".json");
    c.d_model = 64;
    c.d_ff = 96;
    return c;
}

std::vector<float> random_weights(const ModelConfig& c, uint64_t seed) {
    Rng rng(seed);
    std::vector<float> w = test::random_normal(rng, model_param_layout(c).total, 0.1);
    return w;
}

TEST(ModelWeights, EachParameterIsStoredInItsFormatAndRoundTrips) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    auto be = make_backend("cpu");
    // test-tiny-swiglu's o_proj rows (q_dim 48) are not whole Q8_0 blocks: they fall back to F16.
    ModelConfig c = load_config(test::source_dir() + "/assets/configs/test-tiny-swiglu.json");
    const std::vector<float> w = random_weights(c, seed);
    for (DType format : {DType::BF16, DType::F16, DType::Q8_0}) {
        SCOPED_TRACE(to_string(format));
        Model m(c, *be, format);
        m.params_from_host(w);
        EXPECT_EQ(m.param("model.layers.0.self_attn.q_proj.weight").dtype(), format);
        EXPECT_EQ(m.param("model.embed_tokens.weight").dtype(), format);
        EXPECT_EQ(m.param("model.layers.1.self_attn.o_proj.weight").dtype(),
                  format == DType::Q8_0 ? DType::F16 : format);
        EXPECT_EQ(m.param("model.layers.0.block_sparse_moe.gate.weight").dtype(), DType::F32);
        EXPECT_EQ(m.param("model.layers.0.input_layernorm.weight").dtype(), DType::F32);
        // The model holds no f32 copy of its weights: its fp32 tensor is the small rest.
        EXPECT_LT(m.params().numel(), m.num_params() / 10);
        const std::vector<float> back = m.params_to_host();
        for (const ParamSpec& s : m.layout().specs) {
            const DType t = stored_dtype(s, format);
            std::vector<uint8_t> bytes(static_cast<size_t>(dtype_bytes(t, s.numel())));
            std::vector<float> want(static_cast<size_t>(s.numel()));
            encode_weights(t, w.data() + s.offset, s.numel(), bytes.data());
            decode_weights(t, bytes.data(), s.numel(), want.data());
            ASSERT_TRUE(std::equal(want.begin(), want.end(), back.begin() + s.offset)) << s.name;
        }
    }
}

TEST(ModelWeights, FormatModelsDoNotTrain) {
    auto be = make_backend("cpu");
    Model m(small_config(), *be, DType::Q8_0);
    const std::string e = test::error_of([&] { m.grads(); });
    EXPECT_NE(e.find("cannot be trained"), std::string::npos) << e;
}

// The largest |a - b| over two equally long vectors, and the largest |b|.
std::pair<float, float> max_diff(const std::vector<float>& a, const std::vector<float>& b) {
    float diff = 0, scale = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        diff = std::max(diff, std::abs(a[i] - b[i]));
        scale = std::max(scale, std::abs(b[i]));
    }
    return {diff, scale};
}

// Each format's model against an f32 model holding the same (decoded) weights: 16-bit weights
// widen exactly, so only the summation order differs; Q8_0 also quantises the activations the
// matmuls read (to blocks of 32 int8), a relative error of at most 1/254 of a block's largest
// value per element.
TEST(ModelWeights, LogitsMatchAnF32ModelOnTheDecodedWeights) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    auto be = make_backend("cpu");
    for (const char* config : {"test-tiny", "test-tiny-dense", "test-tiny-swiglu"}) {
        const ModelConfig c = small_config(config);
        const std::vector<float> w = random_weights(c, seed);
        Rng rng(seed + 1);
        const int64_t B = 2, T = 9;
        const std::vector<int32_t> tokens =
            test::random_ints(rng, B * T, 0, static_cast<int32_t>(c.vocab_size));
        for (DType format : {DType::BF16, DType::F16, DType::Q8_0}) {
            SCOPED_TRACE(std::string(config) + " " + to_string(format));
            Model m(c, *be, format);
            m.params_from_host(w);
            Model ref(c, *be);
            ref.params_from_host(m.params_to_host());
            std::vector<float> got(static_cast<size_t>(B * T * c.vocab_size)), want(got.size());
            be->download(m.forward(tokens, B, T).logits, got.data());
            be->download(ref.forward(tokens, B, T).logits, want.data());
            const float scale = max_diff(got, want).second;
            const float tol = format == DType::Q8_0 ? 0.03f * scale : 2e-5f * scale;
            EXPECT_GT(scale, 0.1f);
            // A token whose top-k experts nearly tie may route otherwise after Q8_0's rounding,
            // which changes its logits by more than rounding: allow that for one token in six
            // in MoE models (never in a dense one, nor with 16-bit weights).
            int64_t off = 0;
            for (int64_t n = 0; n < B * T; ++n) {
                const auto row = [&](const std::vector<float>& v) {
                    return std::vector<float>(v.begin() + n * c.vocab_size,
                                              v.begin() + (n + 1) * c.vocab_size);
                };
                off += max_diff(row(got), row(want)).first > tol;
            }
            const int64_t allowed = format == DType::Q8_0 && c.is_moe() ? B * T / 6 : 0;
            EXPECT_LE(off, allowed) << "tokens whose logits differ by more than " << tol;

            // Decoding token by token through the cache gives the chunk's last logits.
            KvCache cache(c, *be, 1);
            Tensor last;
            for (int64_t t = 0; t < T; ++t)
                last = m.forward_cached({tokens[t]}, 1, 1, {static_cast<int32_t>(t)}, cache);
            std::vector<float> step(static_cast<size_t>(c.vocab_size));
            be->download(last, step.data());
            const std::vector<float> whole(got.begin() + (T - 1) * c.vocab_size,
                                           got.begin() + T * c.vocab_size);
            EXPECT_LE(max_diff(step, whole).first, 1e-4f * scale);
        }
    }
}

// A checkpoint's header and bytes, parsed here from the file as the safetensors format defines
// it (8-byte little-endian header length, JSON header, data), not through the engine's reader.
struct RawSafetensors {
    nlohmann::json header;
    std::string data;
};
RawSafetensors read_raw_safetensors(const std::string& path) {
    const std::string bytes = read_file(path);
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i)
        n |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[i])) << (8 * i);
    return {nlohmann::json::parse(bytes.substr(8, n)), bytes.substr(8 + n)};
}

TEST(CheckpointWeights, Q8_0IsStoredAsU8BlocksAndLoadsWithoutRequantising) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    test::TempDir tmp;
    auto be = make_backend("cpu");
    const ModelConfig c = small_config();
    const std::vector<float> w = random_weights(c, seed);
    Model m(c, *be);
    m.params_from_host(w);
    save_checkpoint(m, tmp / "q8", {.dtype = StorageType::Q8_0});

    const RawSafetensors file = read_raw_safetensors(tmp / "q8/model.safetensors");
    const ParamLayout& layout = m.layout();
    const ParamSpec& q = *layout.find("model.layers.1.self_attn.q_proj.weight");
    const nlohmann::json& e = file.header.at(q.name);
    EXPECT_EQ(e.at("dtype"), "U8");
    EXPECT_EQ(e.at("shape"), nlohmann::json::array({q.shape[0], q.shape[1] / 32, 34}));
    std::vector<uint8_t> want(static_cast<size_t>(dtype_bytes(DType::Q8_0, q.numel())));
    encode_weights(DType::Q8_0, w.data() + q.offset, q.numel(), want.data());
    const uint64_t begin = e.at("data_offsets")[0], end = e.at("data_offsets")[1];
    ASSERT_EQ(end - begin, want.size());
    EXPECT_EQ(file.data.substr(begin, end - begin),
              std::string(reinterpret_cast<const char*>(want.data()), want.size()));
    EXPECT_EQ(file.header.at("model.layers.0.input_layernorm.weight").at("dtype"), "F32");
    EXPECT_EQ(file.header.at("model.layers.0.block_sparse_moe.gate.weight").at("dtype"), "F32");

    // Loaded as stored: the blocks on the device are the file's bytes.
    EXPECT_EQ(checkpoint_weight_format(tmp / "q8"), DType::Q8_0);
    auto loaded = load_model(tmp / "q8", *be);
    ASSERT_EQ(loaded->weight_format(), DType::Q8_0);
    std::vector<uint8_t> held(want.size());
    be->download(loaded->param(q.name), held.data());
    EXPECT_EQ(held, want);
    // Loaded as f32: the decoded values, and saved again as Q8_0, the same file.
    auto wide = load_model(tmp / "q8", *be, DType::F32);
    EXPECT_EQ(wide->weight_format(), DType::F32);
    EXPECT_EQ(wide->params_to_host(), loaded->params_to_host());
    save_checkpoint(*wide, tmp / "again", {.dtype = StorageType::Q8_0});
    EXPECT_EQ(read_file(tmp / "again/model.safetensors"), read_file(tmp / "q8/model.safetensors"));
}

TEST(CheckpointWeights, AU8TensorThatIsNoQ8_0BlocksIsRefused) {
    test::TempDir tmp;
    auto be = make_backend("cpu");
    Model m(small_config(), *be);
    m.init_random(1);
    save_checkpoint(m, tmp / "q8", {.dtype = StorageType::Q8_0});
    std::string bytes = read_file(tmp / "q8/model.safetensors");
    // q_proj [32, 2, 34] -> [32, 4, 17]: as many bytes, no longer blocks.
    const std::string from = "\"shape\":[32,2,34]", to = "\"shape\":[32,4,17]";
    const size_t at = bytes.find(from);
    ASSERT_NE(at, std::string::npos);
    bytes.replace(at, from.size(), to);
    write_file_atomic(tmp / "q8/model.safetensors", bytes);
    const std::string e = test::error_of([&] { load_model(tmp / "q8", *be); });
    EXPECT_NE(e.find("Q8_0 blocks"), std::string::npos) << e;
}

}  // namespace
}  // namespace tmx

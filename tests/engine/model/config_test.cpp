#include "engine/model/config.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "engine/core/errors.h"
#include "engine/model/model.h"
#include "tests/test_util.h"

namespace tmx {
namespace {

using nlohmann::json;

// The error message config_from_json gives for `j`, or "" when it parses.
std::string config_error(const json& j) {
    try {
        config_from_json(j, "cfg.json");
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

TEST(Config, EmptyObjectTakesTheDesignDefaults) {
    ModelConfig c = config_from_json(json::object(), "cfg.json");
    EXPECT_EQ(c.vocab_size, 32000);
    EXPECT_EQ(c.d_model, 512);
    EXPECT_EQ(c.n_layers, 8);
    EXPECT_EQ(c.n_heads, 8);
    EXPECT_EQ(c.n_kv_heads, 2);
    EXPECT_EQ(c.head_dim, 64);
    EXPECT_EQ(c.ffn_type, FfnType::Mlp);
    EXPECT_EQ(c.activation, Activation::Gelu);
    EXPECT_EQ(c.d_ff, 2048);
    EXPECT_TRUE(c.ffn_bias);
    EXPECT_FALSE(c.attn_bias);
    EXPECT_EQ(c.norm_type, NormType::LayerNorm);
    EXPECT_DOUBLE_EQ(c.norm_eps, 1e-5);
    EXPECT_EQ(c.n_experts, 8);
    EXPECT_EQ(c.top_k, 2);
    EXPECT_DOUBLE_EQ(c.router_aux_loss_coef, 0.02);
    EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
    EXPECT_EQ(c.max_seq_len, 512);
    EXPECT_EQ(c.sliding_window, 256);
    EXPECT_FALSE(c.tie_embeddings);
}

TEST(Config, RoundTripsThroughJson) {
    json j = {{"vocab_size", 300},
              {"d_model", 48},
              {"n_layers", 3},
              {"n_heads", 6},
              {"n_kv_heads", 3},
              {"head_dim", 10},
              {"ffn_type", "swiglu"},
              {"activation", "relu2"},
              {"norm_type", "rmsnorm"},
              {"n_experts", 4},
              {"top_k", 3},
              {"sliding_window", 0},
              {"tie_embeddings", true},
              {"norm_eps", 1e-6}};
    ModelConfig c = config_from_json(j, "cfg.json");
    ModelConfig back = config_from_json(config_to_json(c), "again");
    EXPECT_EQ(config_to_json(back), config_to_json(c));
    EXPECT_EQ(c.ffn_type, FfnType::SwiGlu);
    EXPECT_EQ(c.activation, Activation::Relu2);
    EXPECT_EQ(c.top_k, 3);
}

TEST(Config, UnknownKeyIsAnErrorNamingFileAndKey) {
    std::string e = config_error({{"d_modle", 512}});
    EXPECT_NE(e.find("cfg.json"), std::string::npos) << e;
    EXPECT_NE(e.find("d_modle"), std::string::npos) << e;
}

TEST(Config, WrongTypesNameTheField) {
    EXPECT_NE(config_error({{"d_model", "512"}}).find("'d_model': expected an integer"),
              std::string::npos);
    EXPECT_NE(config_error({{"n_layers", 2.5}}).find("'n_layers'"), std::string::npos);
    EXPECT_NE(config_error({{"ffn_bias", 1}}).find("'ffn_bias': expected true or false"),
              std::string::npos);
    EXPECT_NE(config_error({{"norm_eps", "small"}}).find("'norm_eps'"), std::string::npos);
    EXPECT_NE(config_error({{"activation", "tanh"}}).find("'activation'"), std::string::npos);
    EXPECT_NE(config_error(json::array()).find("cfg.json"), std::string::npos);
}

TEST(Config, ImpossibleValuesNameTheField) {
    struct Case {
        json j;
        const char* field;
    };
    const Case cases[] = {
        {{{"n_heads", 6}, {"n_kv_heads", 4}}, "'n_heads'"},
        {{{"top_k", 9}}, "'top_k'"},
        {{{"top_k", 0}}, "'top_k'"},
        {{{"head_dim", 63}}, "'head_dim'"},
        {{{"d_model", 0}}, "'d_model'"},
        {{{"vocab_size", -5}}, "'vocab_size'"},
        {{{"n_layers", 0}}, "'n_layers'"},
        {{{"d_ff", 0}}, "'d_ff'"},
        {{{"sliding_window", -1}}, "'sliding_window'"},
        {{{"n_experts", -2}}, "'n_experts'"},
        {{{"norm_eps", 0.0}}, "'norm_eps'"},
        {{{"rope_theta", -1.0}}, "'rope_theta'"},
    };
    for (const auto& c : cases) {
        std::string e = config_error(c.j);
        EXPECT_NE(e.find(c.field), std::string::npos) << c.j.dump() << " -> " << e;
        EXPECT_NE(e.find("cfg.json"), std::string::npos) << e;
    }
}

// Sizes that overflow, or that no machine could hold, are refused by the config itself, before
// any command allocates (n_layers 10^12 used to grow memory until killed; d_model 2^62 counted 8
// parameters).
TEST(Config, HugeSizesAreRefusedNamingTheFieldOrTheCount) {
    struct Case {
        json j;
        const char* expected;
    };
    const Case cases[] = {
        {{{"d_model", int64_t{1} << 62}, {"n_heads", 1}, {"n_kv_heads", 1}, {"head_dim", 2}},
         "cfg.json: parameter count: size overflows a 64-bit integer"},
        {{{"n_layers", int64_t{1'000'000'000'000}}}, "field 'n_layers': must be at most 4096"},
        {{{"n_experts", 65536}, {"top_k", 2}}, "field 'n_experts': n_layers x n_experts"},
        {{{"vocab_size", 2'000'000'000}, {"d_model", 1'000'000}},
         "parameters, more than the limit of 281474976710656"},
        {{{"max_seq_len", int64_t{1} << 40}}, "field 'max_seq_len': must be below 2^31"},
        {json::parse(R"({"n_layers": 18446744073709551615})"),
         "field 'n_layers': expected an integer that fits in 64 bits"},
        {json::parse(R"({"d_model": 1e300})"), "field 'd_model': expected an integer"},
    };
    for (const auto& c : cases) {
        const std::string e = config_error(c.j);
        EXPECT_NE(e.find(c.expected), std::string::npos) << c.j.dump() << " -> " << e;
        EXPECT_EQ(e.find("cfg.json"), 0u) << e;
    }
}

// param_count is the count the engine instantiates, for every switch that changes it.
TEST(Config, ParamCountMatchesTheEnginesLayout) {
    const json variants[] = {
        json::object(),
        {{"tie_embeddings", true}, {"ffn_type", "swiglu"}, {"ffn_bias", false}},
        {{"n_experts", 0}, {"attn_bias", true}, {"norm_type", "rmsnorm"}},
        {{"n_heads", 6}, {"n_kv_heads", 3}, {"head_dim", 10}, {"d_ff", 100}, {"n_layers", 3}},
    };
    for (const json& j : variants) {
        const ModelConfig c = config_from_json(j, "cfg.json");
        EXPECT_EQ(param_count(c, "cfg.json"), model_param_layout(c).total) << j.dump();
    }
    // The count of docs/design.md#10-parameters-and-initialisation.
    EXPECT_EQ(param_count(ModelConfig{}, "cfg.json"), 172'442'624);
}

TEST(Config, DenseModelIgnoresTopK) {
    ModelConfig c = config_from_json({{"n_experts", 0}}, "cfg.json");
    EXPECT_FALSE(c.is_moe());
}

TEST(Config, ShippedConfigsParse) {
    for (const char* name : {"tiny-mixtral.json", "tiny-mixtral-swiglu.json", "test-tiny.json",
                             "test-tiny-swiglu.json", "test-tiny-dense.json"}) {
        SCOPED_TRACE(name);
        EXPECT_NO_THROW(load_config(test::source_dir() + "/assets/configs/" + name));
    }
    EXPECT_EQ(config_to_json(load_config(test::source_dir() + "/assets/configs/tiny-mixtral.json")),
              config_to_json(ModelConfig{}));
}

}  // namespace
}  // namespace tmx

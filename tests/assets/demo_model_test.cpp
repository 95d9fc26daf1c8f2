// The shipped demo model loads, carries its tokenizer, and meets its model card's quality bar.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "backends/registry.h"
#include "engine/data/tokenizer.h"
#include "engine/model/checkpoint.h"
#include "tests/test_util.h"

namespace tmx {
namespace {

std::string demo_dir() {
    return test::source_dir() + "/assets/demo";
}

TEST(DemoModel, LoadsWithAMatchingTokenizerWithinTheSizeBudget) {
    auto be = make_backend("cpu");
    auto model = load_model(demo_dir(), *be);
    EXPECT_EQ(model->num_params(), 3554688);
    Tokenizer tok = Tokenizer::load(checkpoint_tokenizer(demo_dir()));
    EXPECT_EQ(tok.vocab_size(), model->config().vocab_size);
    EXPECT_EQ(tok.bos_id(), 1);
    uintmax_t bytes = 0;
    for (const auto& e : std::filesystem::directory_iterator(demo_dir())) bytes += e.file_size();
    EXPECT_LE(bytes, 10u << 20) << "assets/demo must stay within 10 MB";
}

TEST(DemoModel, ScoresAtMost1_20BitsPerByteOnTinyStoriesValid) {
    const std::string shared = test::shared_dir();
    if (shared.empty()) GTEST_SKIP() << "needs ../shared/data/tinystories/valid.txt";
    auto r = test::run_tmx("eval --model " + demo_dir() + " --text-file " + shared +
                           "/data/tinystories/valid.txt --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_LE(j["bits_per_byte"].get<double>(), 1.20);
    EXPECT_NEAR(j["bits_per_byte"].get<double>(), 1.1892, 0.002) << "differs from the model card";
}

}  // namespace
}  // namespace tmx

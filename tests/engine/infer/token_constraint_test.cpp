// Token masks for structured output (engine/infer/token_constraint.h): the masks equal a
// brute-force scan of the vocabulary in every state a random walk over tokens reaches (the
// demo's SentencePiece tokenizer mid-text and at the start of a text, and the real
// tokenizer.json files of Llama 2 and Llama 3 where npm's packages are installed); a mask limits
// a draw to its tokens; and the demo model's constrained generations at temperature 1, batched,
// are valid JSON under their schemas.
#include "engine/infer/token_constraint.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "backends/registry.h"
#include "engine/core/threads.h"
#include "engine/infer/generator.h"
#include "engine/model/checkpoint.h"
#include "tests/engine/infer/json_schema_cases.h"
#include "tests/test_util.h"

namespace tmx {
namespace {

using nlohmann::json;
using test::ojson;

std::string demo_dir() {
    return test::source_dir() + "/assets/demo";
}

// Each token's text in TokenVocabulary is what decoding appends for it: mid-text after "Reply:"
// and as the first piece after a BOS (whole texts decoded by the tokenizer; byte pieces, which
// are single bytes by definition, and byte-level tokens that are not whole characters aside).
void expect_texts_match_the_decoder(const Tokenizer& tok, const TokenVocabulary& vocabulary) {
    const std::vector<int32_t> before = tok.encode("Reply:");
    const std::string before_text = tok.decode(before);
    int checked = 0;
    for (int32_t id = 0; id < tok.vocab_size(); ++id) {
        const Tokenizer::PieceInfo& pi = tok.info(id);
        if (pi.kind == Tokenizer::Kind::Control || pi.kind == Tokenizer::Kind::Unknown) {
            EXPECT_EQ(vocabulary.text(id, false), "") << id;
            continue;
        }
        if (pi.kind == Tokenizer::Kind::Byte) continue;
        std::vector<int32_t> ids = before;
        ids.push_back(id);
        const std::string mid = tok.decode(ids);
        if (mid.find("\xEF\xBF\xBD") != std::string::npos) continue;  // part of a character
        ASSERT_EQ(mid.substr(0, before_text.size()), before_text);
        EXPECT_EQ(vocabulary.text(id, false), mid.substr(before_text.size()))
            << id << " " << tok.piece(id);
        std::vector<int32_t> first = {id};
        if (tok.bos_id() >= 0) first.insert(first.begin(), tok.bos_id());
        EXPECT_EQ(vocabulary.text(id, true), tok.decode(first)) << id << " " << tok.piece(id);
        ++checked;
    }
    EXPECT_GT(checked, tok.vocab_size() / 2);
}

// Walks random tokens through a constraint, comparing each state's mask with a scan of every
// token's text through an automaton of its own.
void expect_masks_match_a_scan(const Tokenizer& tok, const ojson& schema, bool at_start, Rng& rng,
                               int steps) {
    SCOPED_TRACE(schema.dump() + (at_start ? " at the start of a text" : " mid-text"));
    auto grammar = compile_json_schema(schema);
    auto vocabulary = std::make_shared<TokenVocabulary>(tok);
    const std::vector<int32_t> end_ids = {tok.eos_id()};
    TokenConstraint constraint(grammar, vocabulary, end_ids);
    JsonDfa scan(grammar);
    // A prompt of control tokens only leaves the decoder at the start of the text.
    std::vector<int32_t> prompt = {tok.bos_id()};
    if (!at_start) prompt.push_back(tok.encode("Reply:").back());
    TokenConstraint::State state = constraint.start(prompt);
    ASSERT_EQ(state.at_start, at_start);
    std::string text;
    bool first = at_start;
    for (int step = 0; step < steps; ++step) {
        const int32_t s = scan.walk(scan.start(), text);
        ASSERT_NE(s, JsonDfa::kDead) << text;
        const TokenMask& mask = constraint.allowed(state);
        std::vector<int32_t> allowed;
        for (int32_t id = 0; id < tok.vocab_size(); ++id) {
            const std::string& piece = vocabulary->text(id, first);
            const bool want = id == tok.eos_id()
                                  ? scan.accepting(s)
                                  : !piece.empty() && scan.walk(s, piece) != JsonDfa::kDead;
            ASSERT_EQ(mask.contains(id), want)
                << "token " << id << " '" << tok.piece(id) << "' after '" << text << "'";
            if (want && id != tok.eos_id()) allowed.push_back(id);
        }
        ASSERT_EQ(mask.count, static_cast<int64_t>(allowed.size()) + (scan.accepting(s) ? 1 : 0));
        if (allowed.empty() || (scan.accepting(s) && rng.uniform() < 0.2)) return;
        const int32_t id = allowed[rng.next_u64() % allowed.size()];
        state = constraint.advance(state, id);
        EXPECT_FALSE(state.at_start);
        text += vocabulary->text(id, first);
        first = false;
        const int32_t after = scan.walk(scan.start(), text);
        EXPECT_EQ(constraint.finished(state), scan.accepting(after) && !scan.can_continue(after));
    }
}

TEST(TokenConstraint, MasksEqualAScanOfTheDemoVocabulary) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    Rng rng(seed);
    const Tokenizer tok = Tokenizer::load(demo_dir() + "/tokenizer.model");
    expect_texts_match_the_decoder(tok, TokenVocabulary(tok));
    std::vector<ojson> schemas = test::sample_schemas();
    for (int i = 0; i < 4; ++i) schemas.push_back(test::random_schema(rng));
    for (const ojson& schema : schemas)
        for (bool at_start : {false, true})
            expect_masks_match_a_scan(tok, schema, at_start, rng, 12);
}

TEST(TokenConstraint, MasksEqualAScanOfRealTokenizerJsonVocabularies) {
    const std::string npm =
        (std::filesystem::path(TMX_BINARY).parent_path() / "npm/node_modules").string();
    int tested = 0;
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    Rng rng(seed);
    for (const char* name : {"llama2", "llama3"}) {
        const std::string path = npm + "/@lenml/tokenizer-" + name + "/models/tokenizer.json";
        if (!std::filesystem::exists(path)) continue;
        const Tokenizer tok = Tokenizer::load(path);
        if (tok.bos_id() < 0) continue;
        expect_texts_match_the_decoder(tok, TokenVocabulary(tok));
        expect_masks_match_a_scan(tok, test::sample_schemas()[0], false, rng, 6);
        expect_masks_match_a_scan(tok, test::sample_schemas()[1], true, rng, 4);
        ++tested;
    }
    if (tested == 0) GTEST_SKIP() << "npm's @lenml/tokenizer-* packages are not in " << npm;
}

TEST(TokenConstraint, AMaskLimitsTheDrawToItsTokens) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    Rng rng(seed);
    const int64_t V = 300;
    const std::vector<float> logits = test::random_normal(rng, V, 3.0);
    TokenMask mask(V);
    for (int i = 0; i < 20; ++i) mask.insert(static_cast<int32_t>(rng.next_u64() % V));
    SamplingOptions o{.temperature = 0.7, .top_k = 0, .top_p = 1.0, .min_p = 0.0};
    const std::vector<double> p = sampling_distribution(logits.data(), V, o, {}, 0, &mask);
    double total = 0;
    for (int32_t v = 0; v < V; ++v)
        if (mask.contains(v)) total += std::exp(logits[v] / 0.7);
    for (int32_t v = 0; v < V; ++v)
        EXPECT_NEAR(p[v], mask.contains(v) ? std::exp(logits[v] / 0.7) / total : 0.0, 1e-12);
    // Every truncation and greedy keep to the mask too.
    for (SamplingOptions t : {SamplingOptions{}, SamplingOptions{.temperature = 0.0},
                              SamplingOptions{.temperature = 1.0,
                              .top_k = 100,
                              .top_p = 1.0,
                              .min_p = 0.0,
                              .frequency_penalty = 1.0}})
        for (int k = 0; k < 200; ++k) {
            const int32_t id = sample_token(logits.data(), V, t, {1, 2}, 1, rng, &mask);
            ASSERT_TRUE(mask.contains(id)) << id;
        }
}

TEST(TokenConstraint, TheDemoModelWritesValidJsonAtTemperatureOne) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    Rng rng(seed);
    // One thread: OpenMP's teams stall on a machine whose cores other tests keep busy (ctest -j).
    struct OneThread {
        int before = num_threads();
        OneThread() { set_num_threads(1); }
        ~OneThread() { set_num_threads(before); }
    } one_thread;
    auto be = make_backend("cpu");
    auto model = load_model(demo_dir(), *be);
    const Tokenizer tok = Tokenizer::load(demo_dir() + "/tokenizer.model");
    std::vector<ojson> schemas = test::sample_schemas();
    for (int i = 0; i < 3; ++i) schemas.push_back(test::random_schema(rng, 2));
    int complete = 0, total = 0;
    for (const ojson& schema : schemas) {
        SCOPED_TRACE(schema.dump());
        GenerationOptions o;
        o.max_new_tokens = 80;
        o.sampling = {.temperature = 1.0, .top_k = 0, .top_p = 1.0, .min_p = 0.0};
        o.seed = rng.next_u64();
        o.json_grammar = compile_json_schema(schema);
        // Both starts: mid-text after a prompt, and a text's first piece after BOS alone.
        const std::vector<std::string> prompts = {"The answer, as JSON:", "", "Once upon a time",
                                                  "A list:"};
        JsonDfa check(o.json_grammar);
        for (const TextGeneration& g : generate_text(*model, tok, prompts, o)) {
            ++total;
            if (g.tokens.stop_reason == StopReason::Length) {
                EXPECT_NE(check.walk(check.start(), g.text), JsonDfa::kDead) << g.text;
                continue;
            }
            ++complete;
            EXPECT_TRUE(g.tokens.stop_reason == StopReason::Stop ||
                        g.tokens.stop_reason == StopReason::Eos)
                << to_string(g.tokens.stop_reason);
            json value;
            ASSERT_NO_THROW(value = json::parse(g.text)) << g.text;
            EXPECT_TRUE(test::validates(value, schema)) << g.text;
        }
    }
    EXPECT_GT(complete, total / 2);
}

}  // namespace
}  // namespace tmx

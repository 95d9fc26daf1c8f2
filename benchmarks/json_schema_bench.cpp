// Google Benchmark timings of structured output (engine/infer/json_schema.h,
// token_constraint.h) on the demo model's vocabulary (2,048 pieces; Arg 0) and tiny-mixtral's
// 32k SentencePiece vocabulary (../shared/data/tokenizer/llama-32k.model; Arg 1, skipped where
// it is absent; TMX_SHARED_DIR names another ../shared): compiling a schema (per request), building
// a vocabulary's trie (once per server), a state's first mask (a walk of the trie), and per token a
// cached mask's lookup and the masked draw beside the plain one. Run:
// build/benchmarks/tmx_benchmarks --benchmark_filter='Schema|Vocabulary|Mask'
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/rng.h"
#include "engine/data/tokenizer.h"
#include "engine/infer/json_schema.h"
#include "engine/infer/sampling.h"
#include "engine/infer/token_constraint.h"

namespace {

using ojson = nlohmann::ordered_json;

const std::vector<ojson>& schemas() {
    static const std::vector<ojson> s = {
        ojson::parse(R"({"type":"object","properties":{"name":{"type":"string"},
            "age":{"type":"integer"},"email":{"type":"string"}},"required":["name","age"],
            "additionalProperties":false})"),
        ojson::parse(R"({"type":"array","maxItems":8,"items":{"type":"object","properties":{
            "id":{"type":"integer"},"tags":{"type":"array","items":{"enum":["a","b","c"]},
            "maxItems":4},"score":{"anyOf":[{"type":"number"},{"type":"null"}]}},
            "required":["id","tags"]}})"),
        ojson::parse(R"({"type":"object"})"),  // json_object: any object, 6 levels deep
    };
    return s;
}

// The vocabulary of Arg 0 (demo) or 1 (32k); null where the 32k model is absent.
const tmx::Tokenizer* tokenizer(int64_t which) {
    static const std::vector<std::unique_ptr<tmx::Tokenizer>> t = [] {
        std::vector<std::unique_ptr<tmx::Tokenizer>> v;
        v.push_back(std::make_unique<tmx::Tokenizer>(
            tmx::Tokenizer::load(std::string(TMX_SOURCE_DIR) + "/assets/demo/tokenizer.model")));
        // ../shared beside the source tree, or TMX_SHARED_DIR (a worktree's sources sit
        // elsewhere).
        const char* shared = std::getenv("TMX_SHARED_DIR");
        const std::string big =
            (shared ? std::string(shared) : std::string(TMX_SOURCE_DIR) + "/../shared") +
            "/data/tokenizer/llama-32k.model";
        v.push_back(std::filesystem::exists(big)
                        ? std::make_unique<tmx::Tokenizer>(tmx::Tokenizer::load(big))
                        : nullptr);
        return v;
    }();
    return t[static_cast<size_t>(which)].get();
}

std::shared_ptr<const tmx::TokenVocabulary> vocabulary(int64_t which) {
    static std::shared_ptr<const tmx::TokenVocabulary> v[2];
    if (!v[which] && tokenizer(which))
        v[which] = std::make_shared<tmx::TokenVocabulary>(*tokenizer(which));
    return v[which];
}

void BM_SchemaCompile(benchmark::State& state) {
    const ojson& schema = schemas()[static_cast<size_t>(state.range(0))];
    for (auto _ : state) benchmark::DoNotOptimize(tmx::compile_json_schema(schema));
}

void BM_VocabularyTrie(benchmark::State& state) {
    const tmx::Tokenizer* tok = tokenizer(state.range(0));
    if (!tok) return state.SkipWithError("no ../shared/data/tokenizer/llama-32k.model");
    for (auto _ : state) benchmark::DoNotOptimize(tmx::TokenVocabulary(*tok));
}

// The states a record's text passes through: after "{" (a key must come: few tokens), inside a
// string (most tokens), after a number's digit.
tmx::TokenConstraint::State state_after(tmx::TokenConstraint& c, const tmx::Tokenizer& tok,
                                        const std::string& text) {
    const std::vector<int32_t> prompt = {tok.bos_id(), tok.encode("x").back()};
    tmx::TokenConstraint::State s = c.start(prompt);
    for (int32_t id : tok.encode(text)) s = c.advance(s, id);
    if (s.dfa == tmx::JsonDfa::kDead) std::abort();  // the text's tokens must be allowed
    return s;
}
const char* kPrefixes[] = {"{", "{\"name\":\"Ann", "{\"name\":\"Ann\",\"age\":1"};

void BM_MaskFirstVisit(benchmark::State& state) {
    auto vocab = vocabulary(state.range(0));
    if (!vocab) return state.SkipWithError("no ../shared/data/tokenizer/llama-32k.model");
    const tmx::Tokenizer& tok = *tokenizer(state.range(0));
    auto grammar = tmx::compile_json_schema(schemas()[0]);
    int64_t allowed = 0;
    for (auto _ : state) {
        state.PauseTiming();
        tmx::TokenConstraint c(grammar, vocab, {tok.eos_id()});
        const auto s = state_after(c, tok, kPrefixes[state.range(1)]);
        state.ResumeTiming();
        allowed = c.allowed(s).count;
    }
    state.counters["allowed"] = static_cast<double>(allowed);
}

// Per token with the mask cached: its lookup, and the draw at temperature 1 with it (compare
// BM_MaskedDraw/V/-1, the draw without a mask).
void BM_MaskedDraw(benchmark::State& state) {
    auto vocab = vocabulary(state.range(0));
    if (!vocab) return state.SkipWithError("no ../shared/data/tokenizer/llama-32k.model");
    const tmx::Tokenizer& tok = *tokenizer(state.range(0));
    tmx::TokenConstraint c(tmx::compile_json_schema(schemas()[0]), vocab, {tok.eos_id()});
    const int64_t prefix = state.range(1);
    const auto s = state_after(c, tok, prefix >= 0 ? kPrefixes[prefix] : "{");
    const int64_t V = vocab->size();
    tmx::Rng rng(1);
    std::vector<float> logits(static_cast<size_t>(V));
    for (float& x : logits) x = static_cast<float>(3.0 * rng.normal());
    const tmx::SamplingOptions o{.temperature = 1.0, .top_k = 0, .top_p = 1.0, .min_p = 0.0};
    const std::vector<int32_t> history = {1, 2, 3};
    for (auto _ : state) {
        const tmx::TokenMask* mask = prefix >= 0 ? &c.allowed(s) : nullptr;
        benchmark::DoNotOptimize(tmx::sample_token(logits.data(), V, o, history, 0, rng, mask));
    }
}

void BM_MaskLookup(benchmark::State& state) {
    auto vocab = vocabulary(state.range(0));
    if (!vocab) return state.SkipWithError("no ../shared/data/tokenizer/llama-32k.model");
    const tmx::Tokenizer& tok = *tokenizer(state.range(0));
    tmx::TokenConstraint c(tmx::compile_json_schema(schemas()[0]), vocab, {tok.eos_id()});
    const auto s = state_after(c, tok, kPrefixes[1]);
    const std::vector<int32_t> next = tok.encode("Ann");
    for (auto _ : state) {
        benchmark::DoNotOptimize(&c.allowed(s));
        benchmark::DoNotOptimize(c.advance(s, next.back()));
    }
}

BENCHMARK(BM_SchemaCompile)->DenseRange(0, 2)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_VocabularyTrie)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MaskFirstVisit)->ArgsProduct({{0, 1}, {0, 1, 2}})->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_MaskedDraw)->ArgsProduct({{0, 1}, {-1, 0, 1}})->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_MaskLookup)->Arg(0)->Arg(1);

}  // namespace

#include "engine/infer/generator.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <stdexcept>

#include "engine/core/errors.h"
#include "engine/core/rng.h"
#include "engine/infer/text_stream.h"
#include "engine/model/kv_cache.h"

namespace tmx {

uint64_t generation_stream_seed(uint64_t seed, const std::vector<int32_t>& prompt, int copy) {
    std::string name = "generate/" + std::to_string(copy);
    for (int32_t id : prompt) {
        name += ',';
        name += std::to_string(id);
    }
    return stream_seed(seed, name);
}

namespace {

// generate_tokens, each sequence drawing under `constraint` where one is given; with
// on_token_reads_logits false, on_token may be given no logits (SequenceRequest's field).
std::vector<TokenGeneration> run_batch(Model& model,
                                       const std::vector<std::vector<int32_t>>& prompts,
                                       const GenerationOptions& options,
                                       const TokenCallback& on_token,
                                       const std::shared_ptr<TokenConstraint>& constraint,
                                       bool on_token_reads_logits) {
    validate(options.sampling);
    if (options.max_new_tokens < 0) throw UsageError(opt("max_new_tokens") + " must be >= 0");
    std::vector<TokenGeneration> results(prompts.size());
    if (prompts.empty()) return results;
    for (const auto& p : prompts)
        if (p.empty()) throw std::logic_error("generate_tokens: empty prompt");
    SchedulerOptions so;
    so.slots = static_cast<int64_t>(prompts.size());
    so.prefill_chunk = options.prefill_chunk;
    so.prefill_tokens_per_step = 0;  // a batch job: every prefill before the first decode step
    Scheduler scheduler(model, so);
    std::map<std::vector<int32_t>, int> copies_so_far;
    for (size_t b = 0; b < prompts.size(); ++b) {
        SequenceRequest r;
        r.prompt = prompts[b];
        r.max_new_tokens = options.max_new_tokens;
        r.sampling = options.sampling;
        r.stream_seed =
            generation_stream_seed(options.seed, prompts[b], copies_so_far[prompts[b]]++);
        r.end_ids = options.end_ids;
        r.constraint = constraint;
        if (on_token)
            r.on_token = [&on_token, b](int32_t token, std::span<const float> logits) {
                return on_token(b, token, logits);
            };
        r.on_token_reads_logits = on_token_reads_logits;
        r.on_done = [&results, b](TokenGeneration&& g) { results[b] = std::move(g); };
        try {
            scheduler.submit(std::move(r));
        } catch (const Error& e) {
            throw Error("prompt " + std::to_string(b + 1) + ": " + e.text());
        }
    }
    scheduler.run_until_idle();
    for (size_t b = 0; b < results.size(); ++b)
        if (results[b].stop_reason == StopReason::Failed)
            throw Error("prompt " + std::to_string(b + 1) + ": " + results[b].error);
    return results;
}

}  // namespace

std::vector<TokenGeneration> generate_tokens(Model& model,
                                             const std::vector<std::vector<int32_t>>& prompts,
                                             const GenerationOptions& options,
                                             const TokenCallback& on_token) {
    if (options.json_grammar)
        throw std::logic_error("generate_tokens: structured output needs generate_text");
    return run_batch(model, prompts, options, on_token, nullptr, /*on_token_reads_logits=*/true);
}

namespace {

void check_vocabulary(const Model& model, const Tokenizer& tokenizer) {
    if (tokenizer.vocab_size() != model.config().vocab_size)
        throw Error(
            "tokenizer " + tokenizer.path() + " has " + std::to_string(tokenizer.vocab_size()) +
            " pieces but the model's vocab_size is " + std::to_string(model.config().vocab_size));
}

}  // namespace

std::vector<TextGeneration> generate_text(Model& model, const Tokenizer& tokenizer,
                                          const std::vector<std::string>& prompts,
                                          const GenerationOptions& options,
                                          const std::vector<std::string>& stop,
                                          const TextCallback& on_text) {
    check_vocabulary(model, tokenizer);
    std::vector<std::vector<int32_t>> prompt_ids;
    for (const std::string& p : prompts) {
        // After a BOS where the tokenizer has one; without, an empty prompt has nothing to
        // start from.
        if (tokenizer.bos_id() < 0 && p.empty())
            throw Error("tokenizer " + tokenizer.path() +
                        " has no BOS token to start an empty prompt with");
        std::vector<int32_t> ids;
        if (tokenizer.bos_id() >= 0) ids.push_back(tokenizer.bos_id());
        const std::vector<int32_t> body = tokenizer.encode(p);
        ids.insert(ids.end(), body.begin(), body.end());
        prompt_ids.push_back(std::move(ids));
    }
    return generate_text(model, tokenizer, prompts, prompt_ids, options, stop, on_text);
}

std::vector<TextGeneration> generate_text(Model& model, const Tokenizer& tokenizer,
                                          const std::vector<std::string>& prompts,
                                          const std::vector<std::vector<int32_t>>& prompt_ids,
                                          const GenerationOptions& options,
                                          const std::vector<std::string>& stop,
                                          const TextCallback& on_text) {
    check_vocabulary(model, tokenizer);
    if (prompt_ids.size() != prompts.size())
        throw std::logic_error("generate_text: one list of ids per prompt");
    std::vector<TextStream> streams;
    streams.reserve(prompts.size());
    for (const auto& ids : prompt_ids) streams.emplace_back(tokenizer, ids, stop);

    GenerationOptions token_options = options;
    token_options.end_ids.clear();
    if (!options.ignore_eos)
        for (int32_t id : {tokenizer.eos_id(), tokenizer.bos_id()})
            if (id >= 0) token_options.end_ids.push_back(id);
    auto on_token = [&](size_t b, int32_t token, std::span<const float>) {
        if (tokenizer.is_control(token)) return false;  // ends the text, adds none
        const bool stopped = streams[b].push(token);
        if (on_text) {
            const std::string piece = streams[b].take_final();
            if (!piece.empty()) on_text(b, piece);
        }
        return stopped;
    };
    // One constraint for the batch: its per-state token masks are shared.
    std::shared_ptr<TokenConstraint> constraint;
    if (options.json_grammar)
        constraint = std::make_shared<TokenConstraint>(options.json_grammar,
                                                       std::make_shared<TokenVocabulary>(tokenizer),
                                                       token_options.end_ids);
    std::vector<TokenGeneration> tokens =
        run_batch(model, prompt_ids, token_options, on_token, constraint,
                  /*on_token_reads_logits=*/false);

    std::vector<TextGeneration> results;
    for (size_t b = 0; b < prompts.size(); ++b) {
        std::string rest = streams[b].finish();
        if (on_text && !rest.empty()) on_text(b, rest);
        results.push_back({prompts[b], std::move(tokens[b]), streams[b].text()});
    }
    return results;
}

}  // namespace tmx

#include "engine/infer/generator.h"

#include <algorithm>
#include <chrono>
#include <map>

#include "engine/core/errors.h"
#include "engine/core/rng.h"
#include "engine/model/kv_cache.h"

namespace tmx {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Per-sequence decoding state.
struct Sequence {
    Rng rng;
    std::vector<int32_t> history;  // prompt and generated tokens
    int64_t next_position = 0;     // where the last drawn token will be fed
    bool done = false;
};

}  // namespace

const char* to_string(StopReason reason) {
    switch (reason) {
        case StopReason::Eos:
            return "eos";
        case StopReason::Stop:
            return "stop";
        case StopReason::Length:
            return "length";
    }
    return "?";
}

std::vector<TokenGeneration> generate_tokens(Model& model,
                                             const std::vector<std::vector<int32_t>>& prompts,
                                             const GenerationOptions& options,
                                             const TokenCallback& on_token) {
    const ModelConfig& c = model.config();
    Backend& be = model.backend();
    validate(options.sampling);
    if (options.max_new_tokens < 0) throw UsageError("--max-new-tokens must be >= 0");
    const int64_t window = c.sliding_window > 0 ? c.sliding_window : c.max_seq_len;
    const int64_t chunk = options.prefill_chunk > 0 ? options.prefill_chunk : window;
    if (chunk > window)
        throw UsageError("--prefill-chunk " + std::to_string(chunk) +
                         " is larger than the model's attention window (" + std::to_string(window) +
                         ")");
    const int64_t limit = kv_cache_max_positions(c);  // -1: unbounded
    const int64_t B = static_cast<int64_t>(prompts.size());
    std::vector<TokenGeneration> results(prompts.size());
    if (B == 0) return results;
    for (size_t i = 0; i < prompts.size(); ++i) {
        if (prompts[i].empty()) throw std::logic_error("generate_tokens: empty prompt");
        if (limit >= 0 && static_cast<int64_t>(prompts[i].size()) > limit)
            throw Error("prompt " + std::to_string(i + 1) + " has " +
                        std::to_string(prompts[i].size()) +
                        " tokens, more than this full-attention model's max_seq_len (" +
                        std::to_string(limit) + ")");
    }

    KvCache cache(c, be, B);
    const int64_t V = c.vocab_size;
    std::vector<float> logits(static_cast<size_t>(B * V));
    std::vector<Sequence> seqs;
    std::map<std::vector<int32_t>, int> copies_so_far;
    for (int64_t b = 0; b < B; ++b) {
        // The stream of (seed, prompt, how many identical prompts came before it): the same
        // alone as in any batch, yet different for repeated prompts.
        std::string name = "generate/";
        name += std::to_string(copies_so_far[prompts[b]]++);
        for (int32_t id : prompts[b]) {
            name += ',';
            name += std::to_string(id);
        }
        seqs.push_back({Rng(stream_seed(options.seed, name)), prompts[b],
                        static_cast<int64_t>(prompts[b].size())});
    }

    // Draws sequence b's next token from its logits row; marks it done when it stops.
    auto draw = [&](int64_t b, const float* row_logits) {
        Sequence& s = seqs[b];
        TokenGeneration& r = results[b];
        const int32_t token = sample_token(row_logits, V, options.sampling, s.history, s.rng);
        s.history.push_back(token);
        r.ids.push_back(token);
        bool stop = false;
        if (on_token)
            stop = on_token(static_cast<size_t>(b), token,
                            std::span<const float>(row_logits, static_cast<size_t>(V)));
        if (std::find(options.end_ids.begin(), options.end_ids.end(), token) !=
            options.end_ids.end()) {
            r.stop_reason = StopReason::Eos;
            s.done = true;
        } else if (stop) {
            r.stop_reason = StopReason::Stop;
            s.done = true;
        } else if (static_cast<int64_t>(r.ids.size()) >= options.max_new_tokens ||
                   (limit >= 0 && s.next_position >= limit)) {
            r.stop_reason = StopReason::Length;
            s.done = true;
        }
    };

    // Prefill: each prompt alone, in chunks, into its row of the cache.
    for (int64_t b = 0; b < B; ++b) {
        const std::vector<int32_t>& p = prompts[b];
        results[b].prompt_ids = p;
        const auto t0 = std::chrono::steady_clock::now();
        const KvCache row_cache = cache.sequence(b);
        Tensor last;
        for (size_t start = 0; start < p.size(); start += static_cast<size_t>(chunk)) {
            const size_t n = std::min(p.size() - start, static_cast<size_t>(chunk));
            std::vector<int32_t> piece(p.begin() + static_cast<std::ptrdiff_t>(start),
                                       p.begin() + static_cast<std::ptrdiff_t>(start + n));
            last = model.forward_cached(piece, 1, static_cast<int64_t>(n),
                                        {static_cast<int32_t>(start)}, row_cache);
        }
        be.download(last, logits.data());
        results[b].prefill_seconds = seconds_since(t0);
        if (options.max_new_tokens == 0) {
            seqs[b].done = true;
            continue;
        }
        draw(b, logits.data());
    }

    // Decode: every sequence steps together. A finished sequence rides along on its last
    // token and position (its output is ignored), keeping the batch's shape fixed.
    const auto decode_start = std::chrono::steady_clock::now();
    std::vector<int32_t> tokens(static_cast<size_t>(B)), start(static_cast<size_t>(B));
    while (std::any_of(seqs.begin(), seqs.end(), [](const Sequence& s) { return !s.done; })) {
        for (int64_t b = 0; b < B; ++b) {
            tokens[b] = seqs[b].history.back();
            start[b] = static_cast<int32_t>(limit >= 0 ? std::min(seqs[b].next_position, limit - 1)
                                                       : seqs[b].next_position);
        }
        Tensor out = model.forward_cached(tokens, B, 1, start, cache);
        be.download(out, logits.data());
        for (int64_t b = 0; b < B; ++b) {
            if (seqs[b].done) continue;
            ++seqs[b].next_position;
            ++results[b].decode_steps;
            draw(b, logits.data() + b * V);
            if (seqs[b].done) results[b].decode_seconds = seconds_since(decode_start);
        }
    }
    return results;
}

namespace {

// Turns one sequence's tokens into text as they come: decodes incrementally, cuts at the
// first stop string, and holds back a tail that might still become one.
class TextStream {
  public:
    TextStream(const Tokenizer& tok, const std::vector<int32_t>& prompt_ids,
               const std::vector<std::string>& stop)
        : decoder_(tok), stop_(stop) {
        // Decoding the prompt first puts the decoder mid-text, so the continuation keeps the
        // leading space of its first piece.
        for (int32_t id : prompt_ids) decoder_.push(id);
    }

    // Adds a token; returns true when the text now contains a stop string.
    bool push(int32_t id) {
        const size_t old_size = text_.size();
        decoder_.push(id, text_);
        return find_stop(old_size);
    }
    // Text that can no longer change, not yet taken.
    std::string take_final() {
        const size_t end = stopped_ ? text_.size() : text_.size() - held_tail();
        std::string out = text_.substr(emitted_, end - emitted_);
        emitted_ = end;
        return out;
    }
    // At the end of generation: everything not yet taken, held bytes and tail included.
    std::string finish() {
        if (!stopped_) {
            const size_t old_size = text_.size();
            text_ += decoder_.flush();
            find_stop(old_size);
        }
        std::string out = text_.substr(std::min(emitted_, text_.size()));
        emitted_ = text_.size();
        return out;
    }
    const std::string& text() const { return text_; }

  private:
    // Looks for stop strings that end in the text added after old_size; cuts the text at the
    // earliest one.
    bool find_stop(size_t old_size) {
        size_t cut = std::string::npos;
        for (const std::string& s : stop_) {
            if (s.empty()) continue;
            const size_t from = old_size >= s.size() ? old_size - s.size() + 1 : 0;
            cut = std::min(cut, text_.find(s, from));
        }
        if (cut != std::string::npos) {
            text_.resize(cut);
            stopped_ = true;
        }
        return stopped_;
    }
    // The longest suffix of the text that is a proper prefix of a stop string.
    size_t held_tail() const {
        size_t held = 0;
        for (const std::string& s : stop_)
            for (size_t n = std::min(s.size() - (s.empty() ? 0 : 1), text_.size()); n > held; --n)
                if (text_.compare(text_.size() - n, n, s, 0, n) == 0) {
                    held = n;
                    break;
                }
        return std::min(held, text_.size() - emitted_);
    }

    StreamDecoder decoder_;
    const std::vector<std::string>& stop_;
    std::string text_;
    size_t emitted_ = 0;
    bool stopped_ = false;
};

}  // namespace

std::vector<TextGeneration> generate_text(Model& model, const Tokenizer& tokenizer,
                                          const std::vector<std::string>& prompts,
                                          const GenerationOptions& options,
                                          const std::vector<std::string>& stop,
                                          const TextCallback& on_text) {
    if (tokenizer.vocab_size() != model.config().vocab_size)
        throw Error(
            "tokenizer " + tokenizer.path() + " has " + std::to_string(tokenizer.vocab_size()) +
            " pieces but the model's vocab_size is " + std::to_string(model.config().vocab_size));
    if (tokenizer.bos_id() < 0)
        throw Error("tokenizer " + tokenizer.path() + " has no BOS token to start prompts with");
    std::vector<std::vector<int32_t>> prompt_ids;
    for (const std::string& p : prompts) {
        std::vector<int32_t> ids{tokenizer.bos_id()};
        const std::vector<int32_t> body = tokenizer.encode(p);
        ids.insert(ids.end(), body.begin(), body.end());
        prompt_ids.push_back(std::move(ids));
    }
    std::vector<TextStream> streams;
    streams.reserve(prompts.size());
    for (const auto& ids : prompt_ids) streams.emplace_back(tokenizer, ids, stop);

    GenerationOptions token_options = options;
    token_options.end_ids.clear();
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
    std::vector<TokenGeneration> tokens =
        generate_tokens(model, prompt_ids, token_options, on_token);

    std::vector<TextGeneration> results;
    for (size_t b = 0; b < prompts.size(); ++b) {
        std::string rest = streams[b].finish();
        if (on_text && !rest.empty()) on_text(b, rest);
        results.push_back({prompts[b], std::move(tokens[b]), streams[b].text()});
    }
    return results;
}

}  // namespace tmx

// A server's completions on the engine (as vLLM's engine sits behind its API server): each of a
// request's prompts (text after a BOS, or token ids as given) continued `n` times as sequences of
// the serving loop (serve_loop.h), with the choices' text as it becomes final (stop strings cut,
// the prompt echoed), the log-probabilities of the drawn tokens and, with echo, of the prompt's
// own tokens. No HTTP and no API here: apps/serve maps OpenAI's requests onto a completion and
// its choices back into OpenAI's bodies and stream chunks.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/errors.h"
#include "engine/data/tokenizer.h"
#include "engine/infer/sampling.h"
#include "engine/infer/scheduler.h"
#include "engine/infer/serve_loop.h"
#include "engine/infer/text_stream.h"
#include "engine/infer/token_constraint.h"

namespace tmx {

// A token's log-probability under the model (logprobs.h) and the most likely alternatives', as
// text: a drawn token's, or with echo a prompt token's. The first token of a prompt given as ids
// has none: nothing came before it.
struct TokenLogprob {
    std::string token;
    std::optional<double> logprob;
    std::vector<std::pair<std::string, double>> top;
    size_t text_offset = 0;  // where the token's text starts in the choice's text
};

// What to complete, and how.
struct CompletionParams {
    // The prompts: texts, each encoded after a BOS (where the tokenizer has one), or token ids,
    // used as given (no BOS added).
    // Either of the two.
    std::vector<std::string> prompts;
    std::vector<std::vector<int32_t>> prompt_tokens;
    int64_t max_tokens = 16;  // per choice
    SamplingOptions sampling;
    uint64_t seed = 0;
    std::vector<std::string> stop;  // a choice's text ends before the first of these
    int64_t n = 1;                  // choices per prompt, each with its own random stream
    bool echo = false;              // a choice's text starts with its prompt's
    bool ignore_eos = false;        // no end of document ends a choice: max_tokens exactly
    // Log-probabilities of the drawn tokens, each with the `logprobs` most likely alternatives,
    // and with echo of the prompt's tokens too. -1: none.
    int64_t logprobs = -1;
    // Structured output (OpenAI's response_format): every choice is a JSON text this grammar
    // accepts (json_schema.h), ending with StopReason::Stop once the value is complete; cut by
    // max_tokens (StopReason::Length), a prefix of one. Log-probabilities stay the model's.
    std::shared_ptr<const JsonGrammar> json_grammar;
};

// A request the session refuses. what() says why in words a client can be shown; kind and the
// fields after it say which part of the request is at fault.
class CompletionError : public Error {
  public:
    enum class Kind {
        // A prompt token id (prompt_tokens[prompt][position]) or a logit_bias id (`prompt` is
        // kLogitBias) outside the tokenizer's vocabulary.
        TokenOutsideVocabulary,
        // Echo with logprobs would score more prompt tokens than the session's limit.
        TooManyScoredTokens,
        // The scheduler cannot run a prompt (Scheduler::check's reason).
        Unrunnable,
        // The serving loop's queue is full: retry shortly.
        QueueFull,
        // The serving loop stopped because its device failed.
        DeviceFailed,
    };
    static constexpr size_t kLogitBias = static_cast<size_t>(-1);

    CompletionError(Kind kind, const std::string& what) : Error(what), kind(kind) {}

    Kind kind;
    size_t prompt = 0, position = 0;  // TokenOutsideVocabulary: where the token is
    int32_t token = 0;                // TokenOutsideVocabulary: the id
};

// Throws CompletionError (TokenOutsideVocabulary, naming `prompt` and the position) for the
// first of `ids` outside the tokenizer's vocabulary: ids from a client, which decoding would
// refuse.
void check_in_vocabulary(const Tokenizer& tokenizer, const std::vector<int32_t>& ids,
                         size_t prompt = 0);

// The choices of one request, filled by the engine thread, read by the caller's.
class Completion {
  public:
    // One choice; the choices of prompt p are p * n .. p * n + n - 1.
    struct Choice {
        // The echoed prompt, then the final generated text so far (cut before a stop string).
        std::string text;
        std::vector<TokenLogprob> logprobs;  // of text's tokens, when asked for
        std::vector<int32_t> token_ids;      // drawn so far (an end of document included)
        int64_t prompt_tokens = 0;
        bool done = false;
        StopReason stop_reason = StopReason::Length;  // once done
        std::string error;                            // why it failed (StopReason::Failed)
    };

    // What one choice added since the previous next_updates(): final text and its tokens'
    // log-probabilities (the tokens whose text is still held back come with the next text),
    // and whether it has ended.
    struct Update {
        size_t choice = 0;
        bool first = false;  // the choice's first update
        std::string text;
        std::vector<TokenLogprob> logprobs;
        bool done = false;  // ended: stop_reason and error say how
        StopReason stop_reason = StopReason::Length;
        std::string error;
    };
    struct Progress {
        std::vector<Update> updates;
        bool all_done = false;  // every choice has ended (and its end is in an update)
    };

    // Waits up to `timeout` for a choice to have new text or to end, then returns an update for
    // each that has (each end once).
    Progress next_updates(std::chrono::milliseconds timeout);

    // Waits until every choice has ended; after it, choices() may be read.
    void wait();
    // Waits up to `timeout` for that; true when every choice has ended.
    bool wait_for(std::chrono::milliseconds timeout);
    const std::vector<Choice>& choices() const { return choices_; }

    // Whether a choice was cancelled (cancel(), the loop stopping).
    bool cancelled() const;
    // The error of the first choice that failed (StopReason::Failed), if one has.
    std::optional<std::string> failure() const;
    struct Usage {
        int64_t prompt_tokens = 0, completion_tokens = 0;
    };
    Usage usage() const;

    // Cancels the choices still running (e.g. the client left).
    void cancel();

  private:
    friend class CompletionSession;

    // What the engine thread keeps per choice besides what Choice shows.
    struct ChoiceState {
        std::unique_ptr<TextStream> stream;  // engine thread only
        std::string pending;                 // final text not yet in an update
        std::vector<TokenLogprob> pending_logprobs;
        std::chrono::steady_clock::time_point last_token{};
        ServeLoop::Ticket ticket = 0;
        size_t logprob_offset = 0;  // text offset of the next generated token
        // Echo with logprobs: the echoed prompt's tokens, scored as the prefill computes them;
        // the echo is held back until the last one is (release_echo).
        std::vector<TokenLogprob> prompt_logprobs;
        size_t echo_size = 0;     // bytes of the echoed prompt at the start of the text
        size_t first_echoed = 0;  // the prompt id prompt_logprobs[0] is (1 after a BOS we added)
        bool updated = false, end_reported = false;
    };

    Completion(const Tokenizer& tokenizer, ServeLoop& loop, int64_t logprobs,
               std::function<void(bool, double)> on_token_timing)
        : tokenizer_(tokenizer),
          loop_(loop),
          logprobs_(logprobs),
          on_token_timing_(std::move(on_token_timing)) {}

    // The engine thread's calls for choice i (its SequenceRequest's callbacks).
    bool token_drawn(size_t i, int32_t token, std::span<const float> logits);
    // The prompt's token at `position` (an echoed one), scored by the logits before it; the
    // last one releases the echo.
    void prompt_token_scored(size_t i, size_t position, int32_t token, bool last,
                             std::span<const float> logits);
    void ended(size_t i, TokenGeneration&& g);
    // The held echo and its prompt's scores become the choice's first text.
    void release_echo(size_t i);
    bool all_done() const;

    const Tokenizer& tokenizer_;
    ServeLoop& loop_;
    const int64_t logprobs_;  // CompletionParams::logprobs
    const std::function<void(bool first, double seconds)> on_token_timing_;
    const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
    mutable std::mutex mutex_;
    std::condition_variable changed_;
    std::vector<Choice> choices_;
    std::vector<ChoiceState> states_;
};

struct CompletionSessionOptions {
    // Prompt tokens that echo with logprobs may score in one request, over all its choices:
    // each score is held until the completion is read.
    int64_t max_scored_tokens = 65536;
    // Optional, for a server's counters: a sequence's prompt tokens as it is queued (caller's
    // thread), and each drawn token's latency, whether it is its choice's first (the seconds
    // since the request started) or not (since the choice's previous token; engine thread).
    std::function<void(int64_t tokens)> on_prompt_queued;
    std::function<void(bool first, double seconds)> on_token_timing;
};

// Turns requests into sequences of a serving loop. Thread-safe: any thread may start
// completions. The tokenizer and the loop outlive the session and every completion it starts.
class CompletionSession {
  public:
    CompletionSession(const Tokenizer& tokenizer, ServeLoop& loop,
                      CompletionSessionOptions options = {})
        : tokenizer_(tokenizer), loop_(loop), options_(std::move(options)) {}

    // Queues every (prompt, n) sequence of the request; CompletionError when it cannot run
    // (then none of them runs).
    std::shared_ptr<Completion> start(const CompletionParams& params);

  private:
    // A prompt as the model takes it and as it is echoed.
    struct Prompt {
        std::vector<int32_t> ids;
        std::string text;     // what echo returns
        size_t first_echoed;  // ids before it are not part of the text (the BOS we add)
    };
    std::vector<Prompt> read_prompts(const CompletionParams& params) const;
    std::vector<TokenLogprob> echoed_tokens(const Prompt& prompt) const;

    // The vocabulary's token texts and trie for structured output, built on the first request
    // that asks for it and shared by all.
    std::shared_ptr<const TokenVocabulary> vocabulary() const;

    const Tokenizer& tokenizer_;
    ServeLoop& loop_;
    const CompletionSessionOptions options_;
    mutable std::once_flag vocabulary_once_;
    mutable std::shared_ptr<const TokenVocabulary> vocabulary_;
};

// The prefill budget a server runs with (SchedulerOptions::prefill_tokens_per_step): the
// requested one, or by default (0) the model's attention window.
int64_t serving_prefill_budget(const ModelConfig& config, int64_t requested);

}  // namespace tmx

// Continuous batching (docs/design.md#15-layering, serving): one model, a fixed number of slots
// (the rows of one rolling KV cache). A submitted sequence waits for a free slot, is prefilled
// into it in chunks (interleaved with decode steps, so that running sequences keep flowing), then
// decodes with every other running sequence, one token per step each at its own position; a
// sequence that ends (or is cancelled) frees its slot at once for the next one.
// Device-independent: it runs on any Backend.
//
// Each sequence samples from its own random stream (SequenceRequest::stream_seed), and the
// chunks of its prompt are cut at fixed offsets, so what a sequence generates does not depend on
// what else runs beside it. Not thread-safe: one thread owns the scheduler and the model.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/core/rng.h"
#include "engine/infer/sampling.h"
#include "engine/infer/token_constraint.h"
#include "engine/model/kv_cache.h"
#include "engine/model/model.h"

namespace tmx {

// Failed: the sequence could not go on (non-finite logits, a backend error); TokenGeneration's
// error says why.
enum class StopReason { Eos, Stop, Length, Cancelled, Failed };
const char* to_string(StopReason reason);  // "eos", "stop", "length", "cancelled", "failed"

// One sequence's outcome at token level.
struct TokenGeneration {
    std::vector<int32_t> prompt_ids;  // as fed to the model
    std::vector<int32_t> ids;         // generated, EOS included when drawn
    StopReason stop_reason = StopReason::Length;
    double prefill_seconds = 0.0;  // this prompt's prefill chunks
    double decode_seconds = 0.0;   // from its first decode step until it ended
    int64_t decode_steps = 0;      // decode forward passes it took part in
    std::string error;             // why, when stop_reason is Failed
};

struct SequenceRequest {
    std::vector<int32_t> prompt;  // non-empty
    int64_t max_new_tokens = 256;
    SamplingOptions sampling;
    uint64_t stream_seed = 0;      // seeds this sequence's own random stream
    std::vector<int32_t> end_ids;  // drawing one ends the sequence (StopReason::Eos)
    // Where set, each draw takes only tokens the constraint allows (structured output; may be
    // shared by several sequences), and the sequence ends (StopReason::Stop) once its text is a
    // complete value nothing may follow. The mask applies on the host to the logits the step
    // downloads, whatever the backend, before the logit bias, penalties and temperature;
    // on_token still sees the model's own logits (log-probabilities are the model's).
    std::shared_ptr<TokenConstraint> constraint;
    // Each drawn token with the logits it was drawn from; returning true ends the sequence
    // (StopReason::Stop), e.g. when a stop string completed.
    std::function<bool(int32_t token, std::span<const float> logits)> on_token;
    // false: on_token does not read its logits, and may be given none (an empty span): a
    // decode step whose every sequence draws greedily (draws_argmax, no constraint) and reads
    // no logits takes the tokens on the device (Backend::argmax_rows) and downloads only them.
    bool on_token_reads_logits = true;
    // Where set, the logits at every prompt position as the prefill computes them, in order:
    // position p's logits predict prompt[p + 1] (the last position's, the first drawn token).
    // For scoring text (the server's echo with logprobs); costs a LM head over every position.
    std::function<void(int64_t position, std::span<const float> logits)> on_prompt_logits;
    // Once, when the sequence ends for any reason.
    std::function<void(TokenGeneration&& result)> on_done;
};

struct SchedulerOptions {
    int64_t slots = 1;
    // Tokens per prefill chunk: 1 .. the attention window (0 = the window).
    int64_t prefill_chunk = 0;
    // Prompt tokens prefilled between two decode steps, in chunks, oldest request first (at
    // least one chunk per step whatever the budget); 0 = every waiting prefill first (a batch
    // job). A server trades with it: a larger budget gives new requests their first token
    // sooner and fills idle slots at once, a smaller one keeps the running streams' steps short.
    int64_t prefill_tokens_per_step = 0;
};

class Scheduler {
  public:
    using Id = uint64_t;

    // Throws UsageError for options the model cannot take (a chunk beyond the window).
    Scheduler(Model& model, const SchedulerOptions& options);

    // Queues a sequence; a tmx::Error when check() refuses it.
    Id submit(SequenceRequest request);
    // A tmx::Error (UsageError for options) when the request cannot run: an empty prompt, a
    // token outside the vocabulary, a prompt longer than a full-attention model's max_seq_len,
    // invalid sampling options. Reads only what never changes: safe from any thread.
    void check(const SequenceRequest& request) const;
    // Ends the sequence at the next step (StopReason::Cancelled, its on_done called); unknown or
    // finished ids are ignored.
    void cancel(Id id);
    // Ends every sequence in a slot with StopReason::Failed and `why` (after a step threw: the
    // backend failed while they were in it); waiting sequences stay queued.
    void fail_running(const std::string& why);
    // fail_running, and the waiting sequences end the same way.
    void fail_all(const std::string& why);

    // One round: cancellations, admissions into free slots, prefill chunks, one decode step.
    // Returns false when there was nothing to do.
    bool step();
    void run_until_idle() {
        while (step()) {
        }
    }

    int64_t slots() const { return static_cast<int64_t>(slots_.size()); }
    int64_t running() const;  // sequences in a slot
    int64_t waiting() const { return static_cast<int64_t>(queue_.size()); }
    const KvCache& cache() const { return cache_; }

  private:
    struct Sequence {
        Id id = 0;
        SequenceRequest request;
        TokenGeneration result;
        Rng rng{0};
        std::vector<int32_t> history;             // prompt and generated tokens
        TokenConstraint::State constraint_state;  // with request.constraint
        int64_t prefilled = 0;                    // prompt tokens in the cache
        int64_t next_position = 0;                // where the last drawn token will be fed
        std::chrono::steady_clock::time_point decode_start{};
        bool decoding = false;
    };

    void admit();
    void prefill_chunk(size_t slot);
    void decode();
    // The slot's next token drawn from its logits, or -1 when they are not all finite (-2: its
    // constraint allows no token). Touches
    // only the slot's own sequence (its history and random stream): decode() draws for every
    // slot at once on the backend's threads.
    int32_t pick(size_t slot, const float* logits);
    // Takes the token pick() drew (-1: ends the sequence, naming the bad logit), runs the
    // request's on_token, and ends the sequence when it stops. One slot after another.
    void accept(size_t slot, const float* logits, int32_t token);
    // Ends a sequence (its on_done runs); finish() the one in a slot, freeing it.
    void end_sequence(std::unique_ptr<Sequence> s, StopReason reason, std::string error = {});
    void finish(size_t slot, StopReason reason, std::string error = {});

    Model& model_;
    SchedulerOptions options_;
    int64_t chunk_ = 0, limit_ = -1;
    KvCache cache_;
    std::vector<std::unique_ptr<Sequence>> slots_;  // null: free
    std::deque<std::unique_ptr<Sequence>> queue_;
    std::vector<Id> cancelled_;
    std::vector<float> logits_;
    std::vector<float> prompt_logits_;  // a block of a scored prompt's logits, reused
    Id next_id_ = 1;
};

}  // namespace tmx

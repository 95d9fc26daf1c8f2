#include "engine/infer/scheduler.h"

#include <algorithm>
#include <cmath>

#include "engine/core/errors.h"

namespace tmx {

namespace {

// pick()'s answer when the sequence's constraint allows no token of the vocabulary.
constexpr int32_t kNothingAllowed = -2;

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

const char* to_string(StopReason reason) {
    switch (reason) {
        case StopReason::Eos:
            return "eos";
        case StopReason::Stop:
            return "stop";
        case StopReason::Length:
            return "length";
        case StopReason::Cancelled:
            return "cancelled";
        case StopReason::Failed:
            return "failed";
    }
    return "?";
}

Scheduler::Scheduler(Model& model, const SchedulerOptions& options)
    : model_(model), options_(options) {
    const ModelConfig& c = model.config();
    if (options.slots < 1) throw UsageError("the scheduler needs at least one slot");
    const int64_t window = c.sliding_window > 0 ? c.sliding_window : c.max_seq_len;
    chunk_ = options.prefill_chunk > 0 ? options.prefill_chunk : window;
    if (chunk_ > window)
        throw UsageError(opt("prefill_chunk") + " " + std::to_string(chunk_) +
                         " is larger than the model's attention window (" + std::to_string(window) +
                         ")");
    limit_ = kv_cache_max_positions(c);
    cache_ = KvCache(c, model.backend(), options.slots);
    slots_.resize(static_cast<size_t>(options.slots));
    logits_.resize(static_cast<size_t>(options.slots * c.vocab_size));
}

void Scheduler::check(const SequenceRequest& request) const {
    validate(request.sampling);
    if (request.max_new_tokens < 0) throw UsageError("max_new_tokens must be >= 0");
    if (request.prompt.empty()) throw Error("a sequence needs a non-empty prompt");
    if (limit_ >= 0 && static_cast<int64_t>(request.prompt.size()) > limit_)
        throw Error("a prompt of " + std::to_string(request.prompt.size()) +
                    " tokens is longer than this full-attention model's max_seq_len (" +
                    std::to_string(limit_) + ")");
    const int64_t vocab = model_.config().vocab_size;
    for (int32_t id : request.prompt)
        if (id < 0 || id >= vocab)
            throw Error("prompt token " + std::to_string(id) + " is outside the vocabulary (" +
                        std::to_string(vocab) + ")");
}

Scheduler::Id Scheduler::submit(SequenceRequest request) {
    check(request);
    auto s = std::make_unique<Sequence>();
    s->id = next_id_++;
    s->rng = Rng(request.stream_seed);
    s->history = request.prompt;
    s->result.prompt_ids = request.prompt;
    s->next_position = static_cast<int64_t>(request.prompt.size());
    if (request.constraint) s->constraint_state = request.constraint->start(request.prompt);
    s->request = std::move(request);
    const Id id = s->id;
    queue_.push_back(std::move(s));
    return id;
}

void Scheduler::cancel(Id id) {
    cancelled_.push_back(id);
}

int64_t Scheduler::running() const {
    return std::count_if(slots_.begin(), slots_.end(), [](const auto& s) { return s != nullptr; });
}

void Scheduler::end_sequence(std::unique_ptr<Sequence> s, StopReason reason, std::string error) {
    s->result.stop_reason = reason;
    s->result.error = std::move(error);
    if (s->decoding) s->result.decode_seconds = seconds_since(s->decode_start);
    if (s->request.on_done) s->request.on_done(std::move(s->result));
}

void Scheduler::finish(size_t slot, StopReason reason, std::string error) {
    end_sequence(std::move(slots_[slot]), reason, std::move(error));
}

void Scheduler::fail_running(const std::string& why) {
    for (size_t b = 0; b < slots_.size(); ++b)
        if (slots_[b]) finish(b, StopReason::Failed, why);
}

void Scheduler::fail_all(const std::string& why) {
    fail_running(why);
    std::deque<std::unique_ptr<Sequence>> queued;
    queued.swap(queue_);
    for (auto& s : queued) end_sequence(std::move(s), StopReason::Failed, why);
}

void Scheduler::admit() {
    for (size_t b = 0; b < slots_.size() && !queue_.empty(); ++b) {
        if (slots_[b]) continue;
        slots_[b] = std::move(queue_.front());
        queue_.pop_front();
    }
}

int32_t Scheduler::pick(size_t slot, const float* logits) {
    Sequence& s = *slots_[slot];
    const int64_t vocab = model_.config().vocab_size;
    // A NaN or infinity would draw an arbitrary token (or none). Checked over the whole row
    // without an early exit, which vectorises.
    bool finite = true;
#pragma omp simd reduction(&& : finite)
    for (int64_t v = 0; v < vocab; ++v) finite = finite && std::isfinite(logits[v]);
    if (!finite) return -1;
    const TokenMask* allowed = nullptr;
    if (s.request.constraint) {
        allowed = &s.request.constraint->allowed(s.constraint_state);
        if (allowed->count == 0) return kNothingAllowed;
    }
    return sample_token(logits, vocab, s.request.sampling, s.history, s.result.ids.size(), s.rng,
                        allowed);
}

// logits: the row the token was drawn from, or null where the backend took the argmax on the
// device (never for a token < 0: a non-finite row's logits are downloaded to be named).
void Scheduler::accept(size_t slot, const float* logits, int32_t token) {
    Sequence& s = *slots_[slot];
    const int64_t vocab = model_.config().vocab_size;
    if (token == kNothingAllowed) {
        const std::string why = s.request.constraint->failure();
        finish(slot, StopReason::Failed,
               "no token of the vocabulary continues the structured output after " +
                   std::to_string(s.result.ids.size()) + " tokens" +
                   (why.empty() ? "" : " (" + why + ")"));
        return;
    }
    if (token < 0) {  // the sequence ends, visibly
        const int64_t v =
            std::find_if(logits, logits + vocab, [](float x) { return !std::isfinite(x); }) -
            logits;
        // The device's argmax saw a value the download no longer holds (a device fault): the
        // row is named without it.
        const std::string which =
            v < vocab ? " (token " + std::to_string(v) + ": " + std::to_string(logits[v]) + ")"
                      : "";
        finish(slot, StopReason::Failed,
               "the model's logits at position " + std::to_string(s.next_position - 1) +
                   " are not finite" + which);
        return;
    }
    s.history.push_back(token);
    s.result.ids.push_back(token);
    bool stop = false;
    if (s.request.on_token)
        stop = s.request.on_token(
            token, logits ? std::span<const float>(logits, static_cast<size_t>(vocab))
                          : std::span<const float>());
    const auto& ends = s.request.end_ids;
    const bool end = std::find(ends.begin(), ends.end(), token) != ends.end();
    if (s.request.constraint && !end) {
        s.constraint_state = s.request.constraint->advance(s.constraint_state, token);
        // The value is complete and nothing may follow: as a stop string would, it ends here.
        stop = stop || s.request.constraint->finished(s.constraint_state);
    }
    if (end)
        finish(slot, StopReason::Eos);
    else if (stop)
        finish(slot, StopReason::Stop);
    else if (static_cast<int64_t>(s.result.ids.size()) >= s.request.max_new_tokens ||
             (limit_ >= 0 && s.next_position >= limit_))
        finish(slot, StopReason::Length);
}

void Scheduler::prefill_chunk(size_t slot) {
    Sequence& s = *slots_[slot];
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<int32_t>& p = s.request.prompt;
    // Chunks start at multiples of the chunk size whatever else runs, so a prompt's prefill is
    // the same computation alone and in company.
    const size_t start = static_cast<size_t>(s.prefilled);
    const size_t n = std::min(p.size() - start, static_cast<size_t>(chunk_));
    const std::vector<int32_t> piece(p.begin() + static_cast<std::ptrdiff_t>(start),
                                     p.begin() + static_cast<std::ptrdiff_t>(start + n));
    Model::LogitsBlock every_position;
    if (s.request.on_prompt_logits)
        every_position = [&](int64_t first_row, const Tensor& block) {
            const int64_t vocab = model_.config().vocab_size;
            prompt_logits_.resize(static_cast<size_t>(block.numel()));
            model_.backend().download(block, prompt_logits_.data());
            for (int64_t r = 0; r < block.dim(0); ++r)
                s.request.on_prompt_logits(static_cast<int64_t>(start) + first_row + r,
                                           std::span<const float>(prompt_logits_.data() + r * vocab,
                                                                  static_cast<size_t>(vocab)));
        };
    Tensor last =
        model_.forward_cached(piece, 1, static_cast<int64_t>(n), {static_cast<int32_t>(start)},
                              cache_.sequence(static_cast<int64_t>(slot)), every_position);
    s.prefilled += static_cast<int64_t>(n);
    if (s.prefilled < static_cast<int64_t>(p.size())) {
        s.result.prefill_seconds += seconds_since(t0);
        return;
    }
    model_.backend().download(last, logits_.data());
    s.result.prefill_seconds += seconds_since(t0);
    if (s.request.max_new_tokens == 0) {
        finish(slot, StopReason::Length);
        return;
    }
    accept(slot, logits_.data(), pick(slot, logits_.data()));
}

void Scheduler::decode() {
    const int64_t B = slots();
    const int64_t V = model_.config().vocab_size;
    std::vector<int32_t> tokens(static_cast<size_t>(B), 0), start(static_cast<size_t>(B), 0);
    bool any = false;
    for (int64_t b = 0; b < B; ++b) {
        const Sequence* s = slots_[b].get();
        if (!s) continue;  // a free slot rides along at position 0 (its next sequence rewrites it)
        if (s->prefilled < static_cast<int64_t>(s->request.prompt.size())) {
            // Mid-prefill: rides along at the position its next chunk writes first, whose old
            // contents no later query can see.
            tokens[b] = s->request.prompt[static_cast<size_t>(s->prefilled)];
            start[b] = static_cast<int32_t>(s->prefilled);
            continue;
        }
        tokens[b] = s->history.back();
        start[b] = static_cast<int32_t>(s->next_position);
        any = true;
    }
    if (!any) return;
    const auto now = std::chrono::steady_clock::now();
    for (auto& s : slots_)
        if (s && !s->decoding && s->prefilled == static_cast<int64_t>(s->request.prompt.size())) {
            s->decoding = true;
            s->decode_start = now;
        }
    Tensor out = model_.forward_cached(tokens, B, 1, start, cache_);
    std::vector<int32_t> drawn(static_cast<size_t>(B), -1);
    int decoding = 0;
    bool argmax_only = true;
    for (int64_t b = 0; b < B; ++b) {
        const Sequence* s = slots_[b].get();
        if (!s || !s->decoding) continue;
        ++decoding;
        argmax_only = argmax_only && draws_argmax(s->request.sampling) && !s->request.constraint &&
                      !(s->request.on_token && s->request.on_token_reads_logits);
    }
    // Greedy draws that nobody reads the logits of: the backend's argmax, a token a row (rows
    // whose sequence is not decoding are ignored). A non-finite row (-1) fails its sequence,
    // which names the value: then the logits come down after all.
    bool have_logits = false;
    if (argmax_only) {
        drawn = model_.backend().argmax_rows(out);
        for (int64_t b = 0; b < B; ++b)
            if (slots_[b] && slots_[b]->decoding) {
                slots_[b]->rng.uniform();  // as sample_token would: one number a draw
                if (drawn[b] < 0 && !have_logits) {
                    model_.backend().download(out, logits_.data());
                    have_logits = true;
                }
            }
    } else {
        model_.backend().download(out, logits_.data());
        have_logits = true;
        // Every slot's token at once (each draw reads only its own sequence; a vocabulary's
        // row takes tens of microseconds, a batch of them as long as a GPU's decode step), then
        // the callbacks one slot after another, in slot order.
#pragma omp parallel for schedule(dynamic) if (decoding > 1)
        for (int64_t b = 0; b < B; ++b)
            if (slots_[b] && slots_[b]->decoding)
                drawn[b] = pick(static_cast<size_t>(b), logits_.data() + b * V);
    }
    for (int64_t b = 0; b < B; ++b) {
        Sequence* s = slots_[b].get();
        if (!s || !s->decoding) continue;
        ++s->next_position;
        ++s->result.decode_steps;
        accept(static_cast<size_t>(b), have_logits ? logits_.data() + b * V : nullptr, drawn[b]);
    }
}

bool Scheduler::step() {
    for (Id id : cancelled_) {
        auto queued =
            std::find_if(queue_.begin(), queue_.end(), [&](const auto& s) { return s->id == id; });
        if (queued != queue_.end()) {
            std::unique_ptr<Sequence> s = std::move(*queued);
            queue_.erase(queued);
            end_sequence(std::move(s), StopReason::Cancelled);
            continue;
        }
        for (size_t b = 0; b < slots_.size(); ++b)
            if (slots_[b] && slots_[b]->id == id) finish(b, StopReason::Cancelled);
    }
    cancelled_.clear();
    admit();
    if (running() == 0) return false;
    // Prefill chunks within the per-step token budget, the oldest request first (ids grow with
    // submission), so a prompt is never overtaken by a later one that found a lower slot.
    std::vector<size_t> prefilling;
    for (size_t b = 0; b < slots_.size(); ++b)
        if (slots_[b] &&
            slots_[b]->prefilled < static_cast<int64_t>(slots_[b]->request.prompt.size()))
            prefilling.push_back(b);
    std::sort(prefilling.begin(), prefilling.end(),
              [&](size_t x, size_t y) { return slots_[x]->id < slots_[y]->id; });
    const int64_t budget =
        options_.prefill_tokens_per_step > 0 ? options_.prefill_tokens_per_step : INT64_MAX;
    int64_t used = 0;
    bool full = false;
    for (size_t b : prefilling) {
        while (!full && slots_[b] &&
               slots_[b]->prefilled < static_cast<int64_t>(slots_[b]->request.prompt.size())) {
            const int64_t left =
                static_cast<int64_t>(slots_[b]->request.prompt.size()) - slots_[b]->prefilled;
            const int64_t n = std::min(chunk_, left);
            full = used > 0 && n > budget - used;
            if (full) break;
            prefill_chunk(b);
            used += n;
        }
        if (full) break;
    }
    admit();  // sequences that ended at their first token leave room at once
    decode();
    return true;
}

}  // namespace tmx

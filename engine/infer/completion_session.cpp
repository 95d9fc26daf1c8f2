#include "engine/infer/completion_session.h"

#include <algorithm>

#include "engine/infer/generator.h"
#include "engine/infer/logprobs.h"

namespace tmx {

namespace {

CompletionError outside_vocabulary(const Tokenizer& tok, int32_t id, size_t prompt,
                                   size_t position) {
    CompletionError e(CompletionError::Kind::TokenOutsideVocabulary,
                      "token " + std::to_string(id) + " is outside the vocabulary (" +
                          std::to_string(tok.vocab_size()) + " tokens)");
    e.prompt = prompt;
    e.position = position;
    e.token = id;
    return e;
}

// A token as text: its piece with the SentencePiece space marker as a space, a byte piece as
// its byte.
std::string token_text(const Tokenizer& tok, int32_t id) {
    const Tokenizer::PieceInfo& pi = tok.info(id);
    if (pi.kind == Tokenizer::Kind::Byte) return std::string(1, static_cast<char>(pi.byte));
    if (pi.kind == Tokenizer::Kind::Normal) return pi.text;
    return tok.piece(id);
}

// The token's log-probability (logprobs.h) and the `top` most likely tokens', as text.
TokenLogprob token_logprob(const Tokenizer& tok, int32_t token, std::span<const float> logits,
                           int64_t top) {
    ScoredToken score = score_token(logits, token, top);
    TokenLogprob out{token_text(tok, token), score.logprob, {}};
    for (const auto& [id, logprob] : score.top) out.top.emplace_back(token_text(tok, id), logprob);
    return out;
}

}  // namespace

void check_in_vocabulary(const Tokenizer& tokenizer, const std::vector<int32_t>& ids,
                         size_t prompt) {
    for (size_t t = 0; t < ids.size(); ++t)
        if (ids[t] < 0 || ids[t] >= tokenizer.vocab_size())
            throw outside_vocabulary(tokenizer, ids[t], prompt, t);
}

// ---- Completion

bool Completion::token_drawn(size_t i, int32_t token, std::span<const float> logits) {
    std::lock_guard<std::mutex> lock(mutex_);
    Choice& c = choices_[i];
    ChoiceState& state = states_[i];
    const auto now = std::chrono::steady_clock::now();
    const bool first = c.token_ids.empty();
    if (on_token_timing_)
        on_token_timing_(
            first,
            std::chrono::duration<double>(now - (first ? started_ : state.last_token)).count());
    state.last_token = now;
    c.token_ids.push_back(token);
    if (logprobs_ >= 0) {
        c.logprobs.push_back(token_logprob(tokenizer_, token, logits, logprobs_));
        c.logprobs.back().text_offset = state.logprob_offset;
        state.logprob_offset += c.logprobs.back().token.size();
        state.pending_logprobs.push_back(c.logprobs.back());
    }
    if (tokenizer_.is_control(token)) return false;  // ends the text, adds none
    const bool stopped = state.stream->push(token);
    const std::string piece = state.stream->take_final();
    state.pending += piece;
    c.text += piece;
    changed_.notify_all();
    return stopped;
}

void Completion::prompt_token_scored(size_t i, size_t position, int32_t token, bool last,
                                     std::span<const float> logits) {
    const TokenLogprob scored = token_logprob(tokenizer_, token, logits, logprobs_);
    std::lock_guard<std::mutex> lock(mutex_);
    ChoiceState& state = states_[i];
    TokenLogprob& t = state.prompt_logprobs[position - state.first_echoed];
    t.logprob = scored.logprob;
    t.top = scored.top;
    if (last) {
        release_echo(i);
        changed_.notify_all();
    }
}

void Completion::ended(size_t i, TokenGeneration&& g) {
    std::lock_guard<std::mutex> lock(mutex_);
    Choice& c = choices_[i];
    ChoiceState& state = states_[i];
    if (g.stop_reason == StopReason::Failed) c.error = g.error;
    if (g.stop_reason != StopReason::Cancelled && g.stop_reason != StopReason::Failed) {
        const std::string rest = state.stream->finish();
        state.pending += rest;
        c.text += rest;
    }
    c.stop_reason = g.stop_reason;
    c.done = true;
    changed_.notify_all();
}

void Completion::release_echo(size_t i) {
    Choice& c = choices_[i];
    ChoiceState& state = states_[i];
    state.pending += c.text.substr(0, state.echo_size);
    c.logprobs.insert(c.logprobs.begin(), state.prompt_logprobs.begin(),
                      state.prompt_logprobs.end());
    state.pending_logprobs.insert(state.pending_logprobs.begin(), state.prompt_logprobs.begin(),
                                  state.prompt_logprobs.end());
    state.prompt_logprobs.clear();
}

bool Completion::all_done() const {
    for (const Choice& c : choices_)
        if (!c.done) return false;
    return true;
}

Completion::Progress Completion::next_updates(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    auto has_news = [&](size_t i) {
        return !states_[i].pending.empty() || (choices_[i].done && !states_[i].end_reported);
    };
    changed_.wait_for(lock, timeout, [&] {
        for (size_t i = 0; i < choices_.size(); ++i)
            if (has_news(i)) return true;
        return false;
    });
    Progress out;
    for (size_t i = 0; i < choices_.size(); ++i) {
        if (!has_news(i)) continue;
        const Choice& c = choices_[i];
        ChoiceState& state = states_[i];
        Update u{i,
                 !state.updated,
                 std::move(state.pending),
                 std::move(state.pending_logprobs),
                 c.done,
                 c.stop_reason,
                 c.error};
        state.pending.clear();
        state.pending_logprobs.clear();
        state.updated = true;
        state.end_reported = c.done;
        out.updates.push_back(std::move(u));
    }
    out.all_done = all_done();
    return out;
}

void Completion::wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return all_done(); });
}

bool Completion::wait_for(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_for(lock, timeout, [&] { return all_done(); });
}

bool Completion::cancelled() const {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const Choice& c : choices_)
        if (c.done && c.stop_reason == StopReason::Cancelled) return true;
    return false;
}

std::optional<std::string> Completion::failure() const {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const Choice& c : choices_)
        if (!c.error.empty()) return c.error;
    return std::nullopt;
}

Completion::Usage Completion::usage() const {
    std::lock_guard<std::mutex> lock(mutex_);
    Usage u;
    for (const Choice& c : choices_) {
        u.prompt_tokens += c.prompt_tokens;
        u.completion_tokens += static_cast<int64_t>(c.token_ids.size());
    }
    return u;
}

void Completion::cancel() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < choices_.size(); ++i)
        if (states_[i].ticket && !choices_[i].done) loop_.cancel(states_[i].ticket);
}

// ---- CompletionSession

std::vector<CompletionSession::Prompt> CompletionSession::read_prompts(
    const CompletionParams& params) const {
    std::vector<Prompt> out;
    if (!params.prompt_tokens.empty()) {
        for (size_t p = 0; p < params.prompt_tokens.size(); ++p) {
            const std::vector<int32_t>& ids = params.prompt_tokens[p];
            check_in_vocabulary(tokenizer_, ids, p);
            out.push_back({ids, tokenizer_.decode(ids), 0});
        }
        return out;
    }
    // After a BOS where the tokenizer has one (Qwen's, say, has none: the text alone).
    const bool bos = tokenizer_.bos_id() >= 0;
    for (const std::string& text : params.prompts) {
        std::vector<int32_t> ids;
        if (bos) ids.push_back(tokenizer_.bos_id());
        const std::vector<int32_t> body = tokenizer_.encode(text);
        ids.insert(ids.end(), body.begin(), body.end());
        out.push_back({std::move(ids), text, bos ? size_t{1} : size_t{0}});
    }
    return out;
}

// The echoed tokens of a prompt, each with its text and where it starts, not yet scored:
// decoded as a stream, so their texts join into the decoded prompt (a character split over
// byte pieces is the text of its last piece).
std::vector<TokenLogprob> CompletionSession::echoed_tokens(const Prompt& prompt) const {
    std::vector<TokenLogprob> out;
    StreamDecoder decoder(tokenizer_);
    size_t offset = 0;
    for (size_t t = 0; t < prompt.ids.size(); ++t) {
        std::string piece = decoder.push(prompt.ids[t]);
        if (t < prompt.first_echoed) continue;
        const size_t size = piece.size();
        out.push_back({std::move(piece), std::nullopt, {}, offset});
        offset += size;
    }
    if (!out.empty()) out.back().token += decoder.flush();
    return out;
}

std::shared_ptr<Completion> CompletionSession::start(const CompletionParams& params) {
    std::shared_ptr<Completion> completion(
        new Completion(tokenizer_, loop_, params.logprobs, options_.on_token_timing));
    for (const auto& [id, bias] : params.sampling.logit_bias)
        if (id >= tokenizer_.vocab_size())
            throw outside_vocabulary(tokenizer_, id, CompletionError::kLogitBias, 0);
    const std::vector<Prompt> prompts = read_prompts(params);
    // echo with logprobs scores the prompt too: every prompt token's log-probability.
    const bool score_prompt = params.echo && params.logprobs >= 0;
    const size_t n = static_cast<size_t>(params.n);
    if (score_prompt) {
        size_t scored = 0;
        for (const Prompt& p : prompts) scored += p.ids.size() * n;
        if (scored > static_cast<size_t>(options_.max_scored_tokens))
            throw CompletionError(CompletionError::Kind::TooManyScoredTokens,
                                  "echo with logprobs scores at most " +
                                      std::to_string(options_.max_scored_tokens) +
                                      " prompt tokens per request (over all choices); this one "
                                      "has " +
                                      std::to_string(scored));
    }
    // One constraint per request: its choices share the per-state token masks.
    std::shared_ptr<TokenConstraint> constraint;
    std::vector<int32_t> end_ids;
    if (!params.ignore_eos)
        for (int32_t id : {tokenizer_.eos_id(), tokenizer_.bos_id()})
            if (id >= 0) end_ids.push_back(id);
    if (params.json_grammar)
        constraint = std::make_shared<TokenConstraint>(params.json_grammar, vocabulary(), end_ids);
    completion->choices_.resize(prompts.size() * n);
    completion->states_.resize(prompts.size() * n);
    std::vector<SequenceRequest> requests;
    for (size_t p = 0; p < prompts.size(); ++p) {
        const std::vector<int32_t>& ids = prompts[p].ids;
        // The first prompt token with a score: one that has a token before it.
        const size_t scored_from = std::max<size_t>(1, prompts[p].first_echoed);
        for (size_t k = 0; k < n; ++k) {
            const size_t i = p * n + k;
            Completion::Choice& c = completion->choices_[i];
            Completion::ChoiceState& state = completion->states_[i];
            state.stream = std::make_unique<TextStream>(tokenizer_, ids, params.stop);
            c.prompt_tokens = static_cast<int64_t>(ids.size());
            if (options_.on_prompt_queued) options_.on_prompt_queued(c.prompt_tokens);
            if (params.echo) c.text = prompts[p].text;
            state.echo_size = state.logprob_offset = c.text.size();
            if (score_prompt) {
                state.prompt_logprobs = echoed_tokens(prompts[p]);
                state.first_echoed = prompts[p].first_echoed;
                if (scored_from >= ids.size()) completion->release_echo(i);  // nothing to score
            } else if (params.echo) {
                state.pending = c.text;
            }
            SequenceRequest q;
            q.prompt = ids;
            q.max_new_tokens = params.max_tokens;
            q.sampling = params.sampling;
            // As `tmx generate --seed`: the k-th copy of a prompt samples its own stream.
            q.stream_seed = generation_stream_seed(params.seed, ids, static_cast<int>(k));
            q.end_ids = end_ids;
            q.constraint = constraint;
            q.on_token = [completion, i](int32_t token, std::span<const float> logits) {
                return completion->token_drawn(i, token, logits);
            };
            q.on_token_reads_logits = params.logprobs >= 0;  // token_drawn's only use of them
            if (score_prompt && scored_from < ids.size())
                q.on_prompt_logits = [completion, i, scored_from, ids](
                                         int64_t position, std::span<const float> logits) {
                    // Position p's logits score prompt token p + 1 (the last position's, the
                    // first generated token: on_token's).
                    const size_t target = static_cast<size_t>(position) + 1;
                    if (target < scored_from || target >= ids.size()) return;
                    completion->prompt_token_scored(i, target, ids[target],
                                                    target + 1 == ids.size(), logits);
                };
            q.on_done = [completion, i](TokenGeneration&& g) {
                completion->ended(i, std::move(g));
            };
            requests.push_back(std::move(q));
        }
    }
    for (size_t i = 0; i < requests.size(); ++i) {
        std::optional<ServeLoop::Ticket> t;
        try {
            t = loop_.submit(std::move(requests[i]));
        } catch (const Error& e) {
            completion->cancel();
            throw CompletionError(CompletionError::Kind::Unrunnable, e.what());
        }
        if (!t) {
            completion->cancel();
            if (const std::string failure = loop_.failure(); !failure.empty())
                throw CompletionError(CompletionError::Kind::DeviceFailed,
                                      "the server's device failed: " + failure);
            throw CompletionError(CompletionError::Kind::QueueFull,
                                  "the server's queue is full; retry shortly");
        }
        std::lock_guard<std::mutex> lock(completion->mutex_);
        completion->states_[i].ticket = *t;
    }
    return completion;
}

std::shared_ptr<const TokenVocabulary> CompletionSession::vocabulary() const {
    std::call_once(vocabulary_once_,
                   [&] { vocabulary_ = std::make_shared<TokenVocabulary>(tokenizer_); });
    return vocabulary_;
}

int64_t serving_prefill_budget(const ModelConfig& config, int64_t requested) {
    return requested > 0               ? requested
           : config.sliding_window > 0 ? config.sliding_window
                                       : config.max_seq_len;
}

}  // namespace tmx

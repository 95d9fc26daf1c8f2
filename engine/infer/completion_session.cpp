// One choice of a request: its text as it becomes final, filled by the engine thread.
struct Choice {
    std::unique_ptr<TextStream> text;  // engine thread only
    std::string pending;               // final text not yet sent
    std::string all;
    int64_t prompt_tokens = 0, completion_tokens = 0;
    std::string finish_reason;  // "" while running
    std::string error;          // why it failed (StopReason::Failed)
    bool done = false;
    std::chrono::steady_clock::time_point last_token{};
    ServeLoop::Ticket ticket = 0;
    std::vector<serve::TokenLogprob> logprobs, pending_logprobs;  // when asked for
    size_t text_start = 0;      // where the generated text starts (after an echoed prompt)
    size_t logprob_offset = 0;  // text offset of the next generated token
    // echo with logprobs: the echoed prompt's tokens, scored as the prefill computes them; the
    // echo is held back until the last one is (release_echo).
    std::vector<serve::TokenLogprob> prompt_logprobs;
    size_t first_echoed = 0;  // the prompt id prompt_logprobs[0] is (1 after a BOS we added)
};

// A prompt as the model takes it and as it is echoed.
struct Prompt {
    std::vector<int32_t> ids;
    std::string text;     // what echo returns
    size_t first_echoed;  // ids before it are not part of the text (the BOS we add)
};

// The held echo and its prompt's scores become the choice's first text.
void release_echo(Choice& c) {
    c.pending += c.all.substr(0, c.text_start);
    c.logprobs.insert(c.logprobs.begin(), c.prompt_logprobs.begin(), c.prompt_logprobs.end());
    c.pending_logprobs.insert(c.pending_logprobs.begin(), c.prompt_logprobs.begin(),
                              c.prompt_logprobs.end());
    c.prompt_logprobs.clear();
}

// The choices of one HTTP request, shared by its HTTP thread and the engine thread.
struct Job {
    const std::chrono::steady_clock::time_point arrived = std::chrono::steady_clock::now();
    std::mutex mutex;
    std::condition_variable changed;
    std::vector<Choice> choices;
    bool all_done() const {
        for (const Choice& c : choices)
            if (!c.done) return false;
        return true;
    }
};

// The 400 for a client's token id outside the tokenizer's vocabulary, naming `param`.
ApiError outside_vocabulary(const Tokenizer& tok, int32_t id, const std::string& param) {
    return {400,
            "token " + std::to_string(id) + " is outside the vocabulary (" +
                std::to_string(tok.vocab_size()) + " tokens)",
            param, "", "invalid_request_error"};
}

// Throws outside_vocabulary naming `param[t]` for the first such ids[t] (ids come from a client;
// decoding one outside the vocabulary would throw).
void check_in_vocabulary(const Tokenizer& tok, const std::vector<int32_t>& ids,
                         const std::string& param) {
    for (size_t t = 0; t < ids.size(); ++t)
        if (ids[t] < 0 || ids[t] >= tok.vocab_size())
            throw outside_vocabulary(tok, ids[t], param + "[" + std::to_string(t) + "]");
}

// A token as text: its piece with the SentencePiece space marker as a space, a byte piece as
// its byte.
std::string token_text(const Tokenizer& tok, int32_t id) {
    const Tokenizer::PieceInfo& pi = tok.info(id);
    if (pi.kind == Tokenizer::Kind::Byte) return std::string(1, static_cast<char>(pi.byte));
    if (pi.kind == Tokenizer::Kind::Normal) return pi.text;
    return tok.piece(id);
}

// The drawn token's log-probability under the model's distribution (log-softmax of the raw
// logits, in double) and the `top` most likely tokens'.
serve::TokenLogprob token_logprob(const Tokenizer& tok, int32_t token,
                                  std::span<const float> logits, int64_t top) {
    double max = -INFINITY;
    for (float l : logits) max = std::max(max, static_cast<double>(l));
    double sum = 0;
    for (float l : logits) sum += std::exp(static_cast<double>(l) - max);
    const double log_z = max + std::log(sum);
    serve::TokenLogprob out{token_text(tok, token), logits[static_cast<size_t>(token)] - log_z, {}};
    // No alternatives asked for (logprobs 0, often when scoring every prompt token): no sort.
    if (top <= 0) return out;
    std::vector<int32_t> ids(logits.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
    const size_t k = std::min(static_cast<size_t>(top), ids.size());
    std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(),
                      [&](int32_t a, int32_t b) {
                          return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
                      });
    for (size_t i = 0; i < k; ++i)
        out.top.emplace_back(token_text(tok, ids[i]), logits[static_cast<size_t>(ids[i])] - log_z);
    return out;
}

const char* finish_reason(StopReason r) {
    switch (r) {
        case StopReason::Length:
            return "length";
        case StopReason::Cancelled:
            return "cancelled";
        case StopReason::Failed:
            return "error";
        default:
            return "stop";
    }
}

struct Server {
    const Tokenizer& tokenizer;
    ServeLoop& loop;
    std::string model_name, api_key, chat_template;
    serve::ApiLimits limits;
    std::atomic<bool> draining{false};
    std::atomic<uint64_t> next_id{1};
    serve::Metrics metrics;

    // The request's prompts: strings (and chat's rendered messages) encoded after a BOS, ids
    // as given (checked against the vocabulary here: they are decoded for echo).
    std::vector<Prompt> read_prompts(const serve::CompletionRequest& r) const {
        std::vector<Prompt> out;
        if (!r.prompt_tokens.empty()) {
            for (size_t p = 0; p < r.prompt_tokens.size(); ++p) {
                const std::vector<int32_t>& ids = r.prompt_tokens[p];
                check_in_vocabulary(
                    tokenizer, ids,
                    r.prompt_tokens.size() > 1 ? "prompt[" + std::to_string(p) + "]" : "prompt");
                out.push_back({ids, tokenizer.decode(ids), 0});
            }
            return out;
        }
        const std::vector<std::string> texts =
            r.chat ? std::vector<std::string>{serve::render_chat(r.messages, chat_template)}
                   : r.prompts;
        for (const std::string& text : texts) {
            std::vector<int32_t> ids{tokenizer.bos_id()};
            const std::vector<int32_t> body = tokenizer.encode(text);
            ids.insert(ids.end(), body.begin(), body.end());
            out.push_back({std::move(ids), text, 1});
        }
        return out;
    }

    // The echoed tokens of a prompt, each with its text and where it starts, not yet scored:
    // decoded as a stream, so their texts join into the decoded prompt (a character split over
    // byte pieces is the text of its last piece).
    std::vector<serve::TokenLogprob> echoed_tokens(const Prompt& prompt) const {
        std::vector<serve::TokenLogprob> out;
        StreamDecoder decoder(tokenizer);
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

    // Queues every (prompt, n) sequence of the request; ApiError when one cannot run.
    std::shared_ptr<Job> start(const serve::CompletionRequest& r) {
        auto job = std::make_shared<Job>();
        for (const auto& [id, bias] : r.sampling.logit_bias)
            if (id >= tokenizer.vocab_size())
                throw outside_vocabulary(tokenizer, id, "logit_bias." + std::to_string(id));
        const std::vector<Prompt> prompts = read_prompts(r);
        // echo with logprobs scores the prompt too: every prompt token's log-probability.
        const bool score_prompt = !r.chat && r.echo && r.logprobs >= 0;
        if (score_prompt) {
            size_t scored = 0;
            for (const Prompt& p : prompts) scored += p.ids.size() * static_cast<size_t>(r.n);
            if (scored > static_cast<size_t>(limits.max_scored_tokens))
                throw ApiError{400,
                               "echo with logprobs scores at most " +
                                   std::to_string(limits.max_scored_tokens) +
                                   " prompt tokens per request (over all choices); this one has " +
                                   std::to_string(scored),
                               "prompt", "", "invalid_request_error"};
        }
        job->choices.resize(prompts.size() * static_cast<size_t>(r.n));
        std::vector<SequenceRequest> requests;
        for (size_t p = 0; p < prompts.size(); ++p) {
            const std::vector<int32_t>& ids = prompts[p].ids;
            for (int64_t k = 0; k < r.n; ++k) {
                const size_t i = p * static_cast<size_t>(r.n) + static_cast<size_t>(k);
                Choice& c = job->choices[i];
                c.text = std::make_unique<TextStream>(tokenizer, ids, r.stop);
                c.prompt_tokens = static_cast<int64_t>(ids.size());
                metrics.prompt_tokens += ids.size();
                if (r.echo) c.all = prompts[p].text;
                c.text_start = c.logprob_offset = c.all.size();
                // The first prompt token with a score: one that has a token before it.
                const size_t scored_from = std::max<size_t>(1, prompts[p].first_echoed);
                if (score_prompt) {
                    c.prompt_logprobs = echoed_tokens(prompts[p]);
                    c.first_echoed = prompts[p].first_echoed;
                    if (scored_from >= ids.size()) release_echo(c);  // nothing to score
                } else if (r.echo) {
                    c.pending = c.all;
                }
                SequenceRequest q;
                q.prompt = ids;
                q.max_new_tokens = r.max_tokens;
                q.sampling = r.sampling;
                // As `tmx generate --seed`: the k-th copy of a prompt samples its own stream.
                q.stream_seed = generation_stream_seed(r.seed, ids, static_cast<int>(k));
                if (!r.ignore_eos)
                    for (int32_t id : {tokenizer.eos_id(), tokenizer.bos_id()})
                        if (id >= 0) q.end_ids.push_back(id);
                q.on_token = [this, job, i, lp = r.logprobs](int32_t token,
                                                             std::span<const float> logits) {
                    std::lock_guard<std::mutex> lock(job->mutex);
                    Choice& c = job->choices[i];
                    const auto now = std::chrono::steady_clock::now();
                    metrics.completion_tokens++;
                    (c.completion_tokens == 0 ? metrics.time_to_first_token
                                              : metrics.time_per_token)
                        .observe(std::chrono::duration<double>(
                                     now - (c.completion_tokens == 0 ? job->arrived : c.last_token))
                                     .count());
                    c.last_token = now;
                    ++c.completion_tokens;
                    if (lp >= 0) {
                        c.logprobs.push_back(token_logprob(tokenizer, token, logits, lp));
                        c.logprobs.back().text_offset = c.logprob_offset;
                        c.logprob_offset += c.logprobs.back().token.size();
                        c.pending_logprobs.push_back(c.logprobs.back());
                    }
                    if (tokenizer.is_control(token)) return false;
                    const bool stopped = c.text->push(token);
                    const std::string piece = c.text->take_final();
                    c.pending += piece;
                    c.all += piece;
                    job->changed.notify_all();
                    return stopped;
                };
                if (score_prompt && scored_from < ids.size())
                    q.on_prompt_logits = [this, job, i, scored_from, lp = r.logprobs, ids](
                                             int64_t position, std::span<const float> logits) {
                        // Position p's logits score prompt token p + 1 (the last position's,
                        // the first generated token: on_token's).
                        const size_t target = static_cast<size_t>(position) + 1;
                        if (target < scored_from || target >= ids.size()) return;
                        const serve::TokenLogprob scored =
                            token_logprob(tokenizer, ids[target], logits, lp);
                        std::lock_guard<std::mutex> lock(job->mutex);
                        Choice& c = job->choices[i];
                        serve::TokenLogprob& t = c.prompt_logprobs[target - c.first_echoed];
                        t.logprob = scored.logprob;
                        t.top = scored.top;
                        if (target + 1 == ids.size()) {
                            release_echo(c);
                            job->changed.notify_all();
                        }
                    };
                q.on_done = [job, i](TokenGeneration&& g) {
                    std::lock_guard<std::mutex> lock(job->mutex);
                    Choice& c = job->choices[i];
                    if (g.stop_reason == StopReason::Failed) c.error = g.error;
                    if (g.stop_reason != StopReason::Cancelled &&
                        g.stop_reason != StopReason::Failed) {
                        const std::string rest = c.text->finish();
                        c.pending += rest;
                        c.all += rest;
                    }
                    c.finish_reason = finish_reason(g.stop_reason);
                    c.done = true;
                    job->changed.notify_all();
                };
                requests.push_back(std::move(q));
            }
        }
        for (size_t i = 0; i < requests.size(); ++i) {
            std::optional<ServeLoop::Ticket> t;
            try {
                t = loop.submit(std::move(requests[i]));
            } catch (const Error& e) {
                cancel(*job);
                throw ApiError{400, e.what(), r.chat ? "messages" : "prompt", "", ""};
            }
            if (!t) {
                cancel(*job);
                if (const std::string failure = loop.failure(); !failure.empty())
                    throw ApiError{503, "the server's device failed: " + failure, "",
                                   "backend_error", "server_error"};
                throw ApiError{429, "the server's queue is full; retry shortly", "", "queue_full",
                               "rate_limit_error"};
            }
            std::lock_guard<std::mutex> lock(job->mutex);
            job->choices[i].ticket = *t;
        }
        return job;
    }

    void cancel(Job& job) {
        std::lock_guard<std::mutex> lock(job.mutex);
        for (const Choice& c : job.choices)
            if (c.ticket && !c.done) loop.cancel(c.ticket);
    }

    // The error of a job one of whose sequences failed (StopReason::Failed). The caller holds
    // job.mutex.
    static std::optional<ApiError> failed(const Job& job) {
        for (const Choice& c : job.choices)
            if (!c.error.empty())
                return ApiError{500, "generation failed: " + c.error, "", "backend_error",
                                "server_error"};
        return std::nullopt;
    }

    json usage(const Job& job) const {
        int64_t prompt = 0, completion = 0;
        for (size_t i = 0; i < job.choices.size(); ++i) {
            completion += job.choices[i].completion_tokens;
            prompt += job.choices[i].prompt_tokens;
        }
        return {{"prompt_tokens", prompt},
                {"completion_tokens", completion},
                {"total_tokens", prompt + completion}};
    }
};


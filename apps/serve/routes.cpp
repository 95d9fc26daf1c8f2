int64_t unix_time() {
    return std::chrono::duration_cast<std::chrono::seconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

// JSON text; bytes that are not UTF-8 (a client's stop string cut by nobody) become U+FFFD
// rather than an exception.
std::string dump(const json& j) {
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

void send_error(httplib::Response& res, const ApiError& e, serve::Metrics* metrics = nullptr) {
    if (metrics)
        metrics->count_request(e.status == 429   ? "queue_full"
                               : e.status >= 500 ? "server_error"
                                                 : "client_error");
    res.status = e.status;
    if (e.status == 429) res.set_header("Retry-After", "1");
    res.set_content(dump(e.body()), "application/json");
}

        http.set_pre_routing_handler([&](const httplib::Request& req, httplib::Response& res) {
            const bool api = req.path.rfind("/v1/", 0) == 0 || req.path == "/tokenize" ||
                             req.path == "/detokenize";
            if (api && !srv.api_key.empty() &&
                req.get_header_value("Authorization") != "Bearer " + srv.api_key) {
                send_error(res, {401, "a valid API key is required (Authorization: Bearer KEY)", "",
                                 "invalid_api_key", "invalid_request_error"});
                return httplib::Server::HandlerResponse::Handled;
            }
            if (srv.draining && api) {
                send_error(
                    res, {503, "the server is shutting down", "", "shutting_down", "server_error"});
                return httplib::Server::HandlerResponse::Handled;
            }
            return httplib::Server::HandlerResponse::Unhandled;
        });
        http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
            if (!res.body.empty()) return;
            const int s = res.status;
            ApiError e{s,
                       s == 404   ? "unknown endpoint " + req.method + " " + req.path
                       : s == 413 ? "the request body is larger than the server takes (--max-body)"
                       : s == 405 ? "method not allowed"
                                  : "HTTP error " + std::to_string(s),
                       "", "", "invalid_request_error"};
            res.set_content(e.body().dump(), "application/json");
        });
        http.Get("/health", [&](const httplib::Request&, httplib::Response& res) {
            const std::string failure = loop.failure();
            res.status = failure.empty() ? 200 : 503;
            res.set_content(json{{"status", failure.empty() ? "ok" : "error"}}.dump(),
                            "application/json");
        });
        http.Get("/", [](const httplib::Request&, httplib::Response& res) {
            res.set_content(serve::kPlaygroundHtml, "text/html; charset=utf-8");
        });
        http.Get("/metrics", [&](const httplib::Request&, httplib::Response& res) {
            const ServeLoop::Stats st = loop.stats();
            res.set_content(srv.metrics.render(st.running, st.waiting, st.slots),
                            "text/plain; version=0.0.4");
        });
        http.Post("/tokenize", [&](const httplib::Request& req, httplib::Response& res) {
            try {
                const serve::TokenizeRequest r = serve::parse_tokenize_request(req.body);
                std::vector<int32_t> ids;
                if (r.add_special_tokens) ids.push_back(tokenizer.bos_id());
                const std::vector<int32_t> body = tokenizer.encode(r.prompt);
                ids.insert(ids.end(), body.begin(), body.end());
                res.set_content(json{{"tokens", ids}, {"count", ids.size()}}.dump(),
                                "application/json");
            } catch (const ApiError& e) {
                send_error(res, e);
            }
        });
        http.Post("/detokenize", [&](const httplib::Request& req, httplib::Response& res) {
            try {
                const std::vector<int32_t> ids = serve::parse_detokenize_request(req.body);
                check_in_vocabulary(tokenizer, ids, "tokens");
                res.set_content(dump(json{{"prompt", tokenizer.decode(ids)}}), "application/json");
            } catch (const ApiError& e) {
                send_error(res, e);
            }
        });
        http.Get("/v1/models", [&](const httplib::Request&, httplib::Response& res) {
            json m = {{"id", srv.model_name},
                      {"object", "model"},
                      {"created", unix_time()},
                      {"owned_by", "tmx"}};
            res.set_content(json{{"object", "list"}, {"data", {m}}}.dump(), "application/json");
        });
        auto completions = [&](bool chat) {
            return [&, chat](const httplib::Request& req, httplib::Response& res) {
                serve::CompletionRequest r;
                std::shared_ptr<Job> job;
                try {
                    r = serve::parse_completion_request(req.body, chat, srv.limits);
                    job = srv.start(r);
                } catch (const ApiError& e) {
                    send_error(res, e, &srv.metrics);
                    return;
                }
                const std::string id =
                    std::string(chat ? "chatcmpl-" : "cmpl-") + std::to_string(srv.next_id++);
                const int64_t created = unix_time();
                const std::string object = chat ? "chat.completion" : "text_completion";
                if (!r.stream) {
                    std::unique_lock<std::mutex> lock(job->mutex);
                    job->changed.wait(lock, [&] { return job->all_done(); });
                    if (const std::optional<ApiError> e = Server::failed(*job)) {
                        send_error(res, *e, &srv.metrics);
                        return;
                    }
                    bool cancelled = false;
                    for (const Choice& c : job->choices)
                        cancelled = cancelled || c.finish_reason == "cancelled";
                    if (cancelled) {
                        send_error(res,
                                   {503,
                                    "the request was cancelled (the server is shutting down "
                                    "or its device failed)",
                                    "", "cancelled", "server_error"},
                                   &srv.metrics);
                        return;
                    }
                    srv.metrics.count_request("ok");
                    json choices = json::array();
                    for (size_t i = 0; i < job->choices.size(); ++i) {
                        const Choice& c = job->choices[i];
                        json ch = {{"index", i}, {"finish_reason", c.finish_reason}};
                        if (chat)
                            ch["message"] = {{"role", "assistant"}, {"content", c.all}};
                        else
                            ch["text"] = c.all;
                        ch["logprobs"] = r.logprobs >= 0 ? serve::logprobs_json(c.logprobs, chat)
                                                         : json(nullptr);
                        choices.push_back(ch);
                    }
                    res.set_content(dump(json{{"id", id},
                                              {"object", object},
                                              {"created", created},
                                              {"model", srv.model_name},
                                              {"choices", choices},
                                              {"usage", srv.usage(*job)}}),
                                    "application/json");
                    return;
                }
                res.set_header("Cache-Control", "no-cache");
                res.set_chunked_content_provider(
                    "text/event-stream",
                    [&srv, job, id, created, chat, want_logprobs = r.logprobs >= 0,
                     stream_usage = r.stream_usage,
                     object = object + (chat ? ".chunk" : "")](size_t, httplib::DataSink& sink) {
                        auto send = [&](const json& j) {
                            const std::string line = "data: " + dump(j) + "\n\n";
                            return sink.write(line.data(), line.size());
                        };
                        std::vector<bool> announced(job->choices.size(), false),
                            finished(job->choices.size(), false);
                        while (true) {
                            std::vector<json> chunks;
                            bool all = false;
                            {
                                std::unique_lock<std::mutex> lock(job->mutex);
                                job->changed.wait_for(lock, std::chrono::milliseconds(500), [&] {
                                    for (size_t i = 0; i < job->choices.size(); ++i)
                                        if (!job->choices[i].pending.empty() ||
                                            (job->choices[i].done && !finished[i]))
                                            return true;
                                    return false;
                                });
                                for (size_t i = 0; i < job->choices.size(); ++i) {
                                    Choice& c = job->choices[i];
                                    if (c.pending.empty() && !(c.done && !finished[i])) continue;
                                    if (c.pending.empty() && !c.error.empty()) {
                                        finished[i] = true;  // its error event ends the stream
                                        continue;
                                    }
                                    json ch = {{"index", i}, {"finish_reason", nullptr}};
                                    if (chat) {
                                        ch["delta"] = json::object();
                                        if (!announced[i]) ch["delta"]["role"] = "assistant";
                                        if (!c.pending.empty()) ch["delta"]["content"] = c.pending;
                                    } else {
                                        ch["text"] = c.pending;
                                    }
                                    ch["logprobs"] = want_logprobs ? serve::logprobs_json(
                                                                         c.pending_logprobs, chat)
                                                                   : json(nullptr);
                                    c.pending_logprobs.clear();
                                    announced[i] = true;
                                    c.pending.clear();
                                    if (c.done) {
                                        // A failed choice has no OpenAI finish_reason: the
                                        // error event after it says what happened.
                                        if (c.error.empty()) ch["finish_reason"] = c.finish_reason;
                                        finished[i] = true;
                                    }
                                    chunks.push_back(ch);
                                }
                                all = job->all_done();
                            }
                            for (const json& ch : chunks) {
                                json body = {{"id", id},
                                             {"object", object},
                                             {"created", created},
                                             {"model", srv.model_name},
                                             {"choices", {ch}}};
                                if (stream_usage) body["usage"] = nullptr;
                                if (!send(body)) {  // the client left: free its slots
                                    srv.metrics.count_request("cancelled");
                                    srv.cancel(*job);
                                    return false;
                                }
                            }
                            if (!sink.is_writable()) {
                                srv.metrics.count_request("cancelled");
                                srv.cancel(*job);
                                return false;
                            }
                            if (all) {
                                bool cancelled = false;
                                std::optional<ApiError> failed;
                                {
                                    std::lock_guard<std::mutex> lock(job->mutex);
                                    for (const Choice& c : job->choices)
                                        cancelled = cancelled || c.finish_reason == "cancelled";
                                    failed = Server::failed(*job);
                                }
                                if (failed) {
                                    srv.metrics.count_request("server_error");
                                    send(failed->body());
                                } else {
                                    srv.metrics.count_request(cancelled ? "cancelled" : "ok");
                                    if (stream_usage && !cancelled) {
                                        std::lock_guard<std::mutex> lock(job->mutex);
                                        send({{"id", id},
                                              {"object", object},
                                              {"created", created},
                                              {"model", srv.model_name},
                                              {"choices", json::array()},
                                              {"usage", srv.usage(*job)}});
                                    }
                                }
                                if (cancelled && !failed)
                                    send(ApiError{500,
                                                  "the request was cancelled (the server is "
                                                  "shutting down or its device failed)",
                                                  "", "cancelled", "server_error"}
                                             .body());
                                const std::string done = "data: [DONE]\n\n";
                                sink.write(done.data(), done.size());
                                sink.done();
                                return true;
                            }
                        }
                    },
                    [&srv, job](bool success) {
                        if (!success) srv.cancel(*job);
                    });
            };
        };
        http.Post("/v1/completions", completions(false));
        http.Post("/v1/chat/completions", completions(true));

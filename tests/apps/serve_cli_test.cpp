// tmx serve over real HTTP on loopback: the OpenAI endpoints streaming and not, the error
// object for each kind of bad request, continuous batching giving each request what it gives
// alone, a disconnected client freeing its slot, SIGTERM with streams running, the official
// client and the playground. The HTTP front end's own tests (deadlines, limits, the rarer parts
// of HTTP/1.1) are serve_connections_test.cpp.
#include "tests/apps/serve_fixture.h"

namespace tmx {
namespace {

using namespace serve_test;
using nlohmann::json;

TEST_F(ServeCli, CompletionsStreamingAndNotAgreeAndCountUsage) {
    ASSERT_GT(start("--parallel 2"), 0);
    auto c = client();
    auto health = c.Get("/health");
    ASSERT_TRUE(health);
    EXPECT_EQ(json::parse(health->body)["status"], "ok");
    const json models = json::parse(c.Get("/v1/models")->body);
    EXPECT_EQ(models["object"], "list");
    EXPECT_EQ(models["data"][0]["object"], "model");

    const json req = {{"prompt", "once upon a time"},
                      {"max_tokens", 20},
                      {"seed", 7},
                      {"temperature", 0.9},
                      {"ignore_eos", true}};
    const json a = post("/v1/completions", req);
    EXPECT_EQ(a["object"], "text_completion");
    ASSERT_EQ(a["choices"].size(), 1u);
    const std::string text = a["choices"][0]["text"];
    EXPECT_EQ(a["choices"][0]["finish_reason"], "length");
    EXPECT_EQ(a["usage"]["completion_tokens"], 20);
    EXPECT_EQ(a["usage"]["total_tokens"].get<int>(), a["usage"]["prompt_tokens"].get<int>() + 20);
    // The same seed gives the same text; streamed, its pieces concatenate to it.
    EXPECT_EQ(post("/v1/completions", req)["choices"][0]["text"], text);
    std::string streamed;
    std::string finish;
    for (const json& e : stream("/v1/completions", req)) {
        EXPECT_EQ(e["object"], "text_completion");
        streamed += e["choices"][0]["text"].get<std::string>();
        if (!e["choices"][0]["finish_reason"].is_null()) finish = e["choices"][0]["finish_reason"];
    }
    EXPECT_EQ(streamed, text);
    EXPECT_EQ(finish, "length");
    // stream_options.include_usage: "usage": null on each chunk, then one with no choices and
    // the request's usage.
    json with_usage = req;
    with_usage["stream_options"] = {{"include_usage", true}};
    const std::vector<json> events = stream("/v1/completions", with_usage);
    ASSERT_GE(events.size(), 2u);
    for (size_t e = 0; e + 1 < events.size(); ++e) {
        EXPECT_TRUE(events[e].contains("usage") && events[e]["usage"].is_null()) << e;
        EXPECT_EQ(events[e]["choices"].size(), 1u);
    }
    EXPECT_EQ(events.back()["choices"], json::array());
    EXPECT_EQ(events.back()["usage"], a["usage"]);
    with_usage.erase("stream");
    EXPECT_EQ(post("/v1/completions", with_usage, 400)["error"]["param"], "stream_options");

    // A stop string across token boundaries: the text ends before it, finish_reason stop.
    if (text.size() > 8) {
        // Four characters from the third on (whole UTF-8 characters, bytes of one never split).
        auto next_char = [&](size_t i) {
            do ++i;
            while (i < text.size() && (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80);
            return i;
        };
        size_t from = 0, to = 0;
        for (int k = 0; k < 3; ++k) from = next_char(from);
        to = from;
        for (int k = 0; k < 4 && to < text.size(); ++k) to = next_char(to);
        const std::string stop = text.substr(from, to - from);
        json s = req;
        s["stop"] = {stop, "never-there"};
        const json r = post("/v1/completions", s);
        EXPECT_EQ(r["choices"][0]["text"], text.substr(0, text.find(stop)));
        EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
        std::string st;
        for (const json& e : stream("/v1/completions", s))
            st += e["choices"][0]["text"].get<std::string>();
        EXPECT_EQ(st, text.substr(0, text.find(stop)));
    }
    // Several prompts, n choices each, echo.
    const json many = post("/v1/completions", {{"prompt", {"the fox", "green woods"}},
                                               {"n", 2},
                                               {"max_tokens", 5},
                                               {"echo", true},
                                               {"seed", 1}});
    ASSERT_EQ(many["choices"].size(), 4u);
    EXPECT_EQ(many["choices"][0]["text"].get<std::string>().rfind("the fox", 0), 0u);
    EXPECT_EQ(many["choices"][2]["text"].get<std::string>().rfind("green woods", 0), 0u);
    EXPECT_NE(many["choices"][0]["text"], many["choices"][1]["text"]);  // own streams

    // Prometheus text: the requests above by outcome, tokens, the slots, the histograms.
    post("/v1/completions", {{"prompt", 5}}, 400);
    auto metrics = c.Get("/metrics");
    ASSERT_TRUE(metrics);
    EXPECT_EQ(metrics->status, 200);
    const std::string m = metrics->body;
    auto value = [&](const std::string& series) -> double {
        const size_t at = m.find("\n" + series + " ");
        if (at == std::string::npos) return -1;
        return std::stod(m.substr(at + series.size() + 2));
    };
    const int ok = text.size() > 8 ? 7 : 5;  // completions above, streamed or not
    EXPECT_EQ(value("tmx_requests_total{outcome=\"ok\"}"), ok) << m;
    EXPECT_EQ(value("tmx_requests_total{outcome=\"client_error\"}"), 2) << m;
    EXPECT_EQ(value("tmx_slots"), 2) << m;
    EXPECT_LE(value("tmx_active_slots"), 2) << m;  // updated after the engine's step
    EXPECT_GE(value("tmx_completion_tokens_total"), 60 + 20) << m;
    EXPECT_GE(value("tmx_time_to_first_token_seconds_count"), ok) << m;
    EXPECT_EQ(value("tmx_time_to_first_token_seconds_bucket{le=\"+Inf\"}"),
              value("tmx_time_to_first_token_seconds_count"));
    EXPECT_NE(m.find("# TYPE tmx_time_per_token_seconds histogram"), std::string::npos);
    EXPECT_EQ(stop(), 0);
}

// logprobs: one entry per generated token, log-probabilities of the model's distribution; with
// greedy decoding the drawn token is the most likely; streamed pieces add up to the whole.
TEST_F(ServeCli, LogprobsDescribeEachDrawnToken) {
    ASSERT_GT(start(), 0);
    const json req = {{"prompt", "the little fox"},
                      {"max_tokens", 6},
                      {"temperature", 0},
                      {"logprobs", 3},
                      {"ignore_eos", true}};
    const json a = post("/v1/completions", req);
    const json& lp = a["choices"][0]["logprobs"];
    ASSERT_EQ(lp["tokens"].size(), 6u) << a.dump();
    ASSERT_EQ(lp["token_logprobs"].size(), 6u);
    size_t offset = 0;
    for (size_t i = 0; i < 6; ++i) {
        const double l = lp["token_logprobs"][i];
        EXPECT_LE(l, 0.0);
        // Up to 3: alternatives with the same text (a byte piece and a piece) share one key.
        ASSERT_GE(lp["top_logprobs"][i].size(), 1u);
        ASSERT_LE(lp["top_logprobs"][i].size(), 3u);
        double best = -1e300, mass = 0;
        for (const auto& [tok, v] : lp["top_logprobs"][i].items()) {
            best = std::max(best, v.get<double>());
            mass += std::exp(v.get<double>());
        }
        EXPECT_NEAR(l, best, 1e-9) << "greedy draws the most likely token";
        EXPECT_LE(mass, 1.0 + 1e-9);
        EXPECT_EQ(lp["text_offset"][i], offset);
        offset += lp["tokens"][i].get<std::string>().size();
    }
    std::vector<std::string> streamed;
    for (const json& e : stream("/v1/completions", req))
        for (const json& t : e["choices"][0]["logprobs"]["tokens"]) streamed.push_back(t);
    EXPECT_EQ(json(streamed), lp["tokens"]);

    const json chat =
        post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                                      {"max_tokens", 3},
                                      {"logprobs", true},
                                      {"top_logprobs", 2},
                                      {"ignore_eos", true}});
    const json& content = chat["choices"][0]["logprobs"]["content"];
    ASSERT_EQ(content.size(), 3u) << chat.dump();
    EXPECT_EQ(content[0]["top_logprobs"].size(), 2u);
    EXPECT_TRUE(content[0]["bytes"].is_array());
    post("/v1/chat/completions",
         {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"top_logprobs", 2}}, 400);
    post("/v1/completions", {{"prompt", "x"}, {"logprobs", 6}}, 400);
}

// echo with logprobs scores the prompt, as OpenAI's completions do (and lm-evaluation-harness
// relies on): one entry per prompt token, then the generated ones; a prompt given as ids has
// nothing before its first token (null). Each prompt position's alternatives are those the
// model gives for the next token after that prefix alone.
TEST_F(ServeCli, EchoWithLogprobsScoresThePrompt) {
    ASSERT_GT(start(), 0);
    const std::string text = "the little fox ran to the tree";
    const json a = post("/v1/completions", {{"prompt", text},
                                            {"max_tokens", 3},
                                            {"temperature", 0},
                                            {"echo", true},
                                            {"logprobs", 2},
                                            {"ignore_eos", true}});
    const json& choice = a["choices"][0];
    const json& lp = choice["logprobs"];
    ASSERT_EQ(choice["text"].get<std::string>().rfind(text, 0), 0u) << a.dump();
    const size_t prompt_count = lp["tokens"].size() - 3;
    EXPECT_EQ(a["usage"]["prompt_tokens"], prompt_count + 1) << "the BOS is not echoed";
    std::string joined;
    for (size_t t = 0; t < lp["tokens"].size(); ++t) {
        EXPECT_EQ(lp["text_offset"][t], joined.size()) << t;
        joined += lp["tokens"][t].get<std::string>();
        ASSERT_TRUE(lp["token_logprobs"][t].is_number()) << t << " " << lp.dump();
        EXPECT_LE(lp["token_logprobs"][t].get<double>(), 0.0);
        EXPECT_GE(lp["top_logprobs"][t].size(), 1u);
    }
    EXPECT_EQ(joined, choice["text"]);
    // Streamed: the same entries, the echo first.
    std::vector<json> streamed;
    std::string streamed_text;
    for (const json& e : stream("/v1/completions", {{"prompt", text},
                                                    {"max_tokens", 3},
                                                    {"temperature", 0},
                                                    {"echo", true},
                                                    {"logprobs", 2},
                                                    {"ignore_eos", true}})) {
        streamed_text += e["choices"][0]["text"].get<std::string>();
        const json& l = e["choices"][0]["logprobs"];
        for (size_t t = 0; t < l["tokens"].size(); ++t)
            streamed.push_back({l["tokens"][t], l["token_logprobs"][t], l["text_offset"][t]});
    }
    EXPECT_EQ(streamed_text, choice["text"]);
    ASSERT_EQ(streamed.size(), lp["tokens"].size());
    for (size_t t = 0; t < streamed.size(); ++t) {
        EXPECT_EQ(streamed[t][0], lp["tokens"][t]) << t;
        EXPECT_NEAR(streamed[t][1].get<double>(), lp["token_logprobs"][t].get<double>(), 1e-9);
        EXPECT_EQ(streamed[t][2], lp["text_offset"][t]) << t;
    }

    // Ids as given: 8 random tokens, scored without generating (max_tokens 0).
    Rng rng(test::fresh_seed());
    const std::vector<int32_t> ids = test::random_ints(rng, 8, 3, 300);
    const json b = post(
        "/v1/completions",
        {{"prompt", ids}, {"max_tokens", 0}, {"echo", true}, {"logprobs", 5}, {"temperature", 0}});
    const json& scored = b["choices"][0]["logprobs"];
    ASSERT_EQ(scored["tokens"].size(), 8u) << b.dump();
    EXPECT_TRUE(scored["token_logprobs"][0].is_null());
    EXPECT_TRUE(scored["top_logprobs"][0].is_null());
    EXPECT_EQ(b["usage"]["completion_tokens"], 0);
    EXPECT_EQ(b["choices"][0]["finish_reason"], "length");
    for (const size_t m : {size_t{1}, size_t{4}, size_t{7}}) {
        SCOPED_TRACE("prefix of " + std::to_string(m));
        ASSERT_TRUE(scored["token_logprobs"][m].is_number()) << scored.dump();
        const json next =
            post("/v1/completions", {{"prompt", std::vector<int32_t>(ids.begin(), ids.begin() + m)},
                                     {"max_tokens", 1},
                                     {"logprobs", 5},
                                     {"temperature", 0},
                                     {"ignore_eos", true}});
        const json& want = next["choices"][0]["logprobs"]["top_logprobs"][0];
        const json& got = scored["top_logprobs"][m];
        ASSERT_EQ(got.size(), want.size()) << got.dump() << " vs " << want.dump();
        for (const auto& [token, value] : want.items()) {
            ASSERT_TRUE(got.contains(token)) << token;
            EXPECT_NEAR(got[token].get<double>(), value.get<double>(), 1e-4) << token;
        }
        // The scored token is at most as likely as the likeliest.
        double best = -INFINITY;
        for (const auto& [token, value] : want.items()) best = std::max(best, value.get<double>());
        EXPECT_LE(scored["token_logprobs"][m].get<double>(), best + 1e-4);
    }
    // Scoring holds every prompt token's score: at most 65,536 per request.
    const json too_many = post("/v1/completions",
                               {{"prompt", std::vector<int32_t>(8193, 7)},
                                {"n", 8},
                                {"echo", true},
                                {"logprobs", 0},
                                {"max_tokens", 0}},
                               400);
    EXPECT_EQ(too_many["error"]["param"], "prompt") << too_many.dump();
}

// logit_bias and OpenAI's penalties reach the sampler. One token lifted by 100 takes every
// greedy step. Two lifted by 60 take every step between them; with a frequency penalty of 2 a
// token drawn three times has lost 6, more than this random model's logits of two tokens
// differ by, so both appear in four tokens.
TEST_F(ServeCli, LogitBiasAndPenaltiesShapeTheAnswer) {
    ASSERT_GT(start(), 0);
    auto tokens = [&](const json& extra) {
        json req = {{"prompt", "the fox"},
                    {"max_tokens", 4},
                    {"temperature", 0},
                    {"logprobs", 0},
                    {"ignore_eos", true}};
        req.update(extra);
        const json a = post("/v1/completions", req);
        std::set<std::string> distinct;
        for (const json& t : a["choices"][0]["logprobs"]["tokens"]) distinct.insert(t);
        EXPECT_EQ(a["choices"][0]["logprobs"]["tokens"].size(), 4u) << a.dump();
        return std::make_pair(distinct, a["choices"][0]["logprobs"]["tokens"]);
    };
    const auto [one, one_tokens] = tokens({{"logit_bias", {{"280", 100}}}});
    EXPECT_EQ(one.size(), 1u) << one_tokens.dump();
    const auto [unbiased, unbiased_tokens] = tokens(json::object());
    EXPECT_NE(unbiased_tokens, one_tokens);
    const auto [two, two_tokens] =
        tokens({{"logit_bias", {{"280", 60}, {"290", 60}}}, {"frequency_penalty", 2}});
    EXPECT_EQ(two.size(), 2u) << two_tokens.dump();
    EXPECT_TRUE(two.count(*one.begin())) << two_tokens.dump();
}

// /tokenize and /detokenize (as vLLM's server has them): the ids a string prompt is given
// (the BOS first by default), which as a prompt of ids give the same answer as the string.
TEST_F(ServeCli, TokenizeGivesTheIdsAStringPromptRunsOn) {
    ASSERT_GT(start(), 0);
    const std::string text = "the little fox ran";
    const json with_bos = post("/tokenize", {{"prompt", text}});
    const json bare = post("/tokenize", {{"prompt", text}, {"add_special_tokens", false}});
    ASSERT_EQ(with_bos["tokens"].size(), bare["tokens"].size() + 1) << with_bos.dump();
    EXPECT_EQ(with_bos["count"], with_bos["tokens"].size());
    EXPECT_EQ(json(std::vector<json>(with_bos["tokens"].begin() + 1, with_bos["tokens"].end())),
              bare["tokens"]);
    EXPECT_EQ(post("/detokenize", {{"tokens", with_bos["tokens"]}})["prompt"], text);
    EXPECT_EQ(post("/detokenize", {{"tokens", json::array()}})["prompt"], "");
    const json by_text =
        post("/v1/completions",
             {{"prompt", text}, {"max_tokens", 8}, {"temperature", 0}, {"ignore_eos", true}});
    const json by_ids = post("/v1/completions", {{"prompt", with_bos["tokens"]},
                                                 {"max_tokens", 8},
                                                 {"temperature", 0},
                                                 {"ignore_eos", true}});
    EXPECT_EQ(by_ids["choices"][0]["text"], by_text["choices"][0]["text"]);
    EXPECT_EQ(by_ids["usage"], by_text["usage"]);
}

// A prompt scored through the server (echo, logprobs, no new token) has the mean loss `tmx
// eval` gives the same ids: 30 tokens, past the attention window of 8, prefilled in chunks
// through the rolling buffer by one and computed whole by the other.
TEST_F(ServeCli, ScoringAPromptAgreesWithTmxEval) {
    ASSERT_GT(start("--weights f32"), 0);
    Rng rng(test::fresh_seed());
    const std::vector<int32_t> ids = test::random_ints(rng, 30, 3, 300);
    std::string list;
    for (int32_t id : ids) list += (list.empty() ? "" : ",") + std::to_string(id);
    const auto eval =
        test::run_tmx("eval --model " + *dir_ / "ckpt" + " --tokens " + list + " --json");
    ASSERT_EQ(eval.exit_code, 0) << eval.err;
    const double loss = json::parse(eval.out)["loss"];
    const json scored = post("/v1/completions",
                             {{"prompt", ids}, {"max_tokens", 0}, {"echo", true}, {"logprobs", 0}});
    const json& lps = scored["choices"][0]["logprobs"]["token_logprobs"];
    ASSERT_EQ(lps.size(), 30u) << scored.dump();
    double sum = 0;
    for (size_t t = 1; t < lps.size(); ++t) sum -= lps[t].get<double>();
    EXPECT_NEAR(sum / 29, loss, 1e-5 * loss);
}

// A chat template (--chat-template here; a checkpoint's tokenizer_config.json the same way):
// the prompt is its rendering, tokenized with "<s>" as BOS; a conversation it refuses
// (raise_exception) is a 400 with the template's own message; the start-up line names it.
TEST_F(ServeCli, ChatTemplatesMakeThePromptAndTheirRefusalsAre400s) {
    const std::string tmpl = *dir_ / "chat.jinja";
    test::write_text(tmpl,
                     "{{ bos_token }}{% for m in messages %}"
                     "{% if m.role == 'system' and not loop.first %}"
                     "{{ raise_exception('the system message must come first') }}{% endif %}"
                     "[{{ m.role }}] {{ m.content }}\n{% endfor %}"
                     "{% if add_generation_prompt %}[assistant]{% endif %}");
    ASSERT_GT(start("--chat-template " + tmpl), 0);
    const json ok = post(
        "/v1/chat/completions",
        {{"messages", {{{"role", "user"}, {"content", "tell me of the fox"}}}}, {"max_tokens", 2}});
    // BOS, then the rendered text as tmx tokenizer encode gives it ("<s>" stripped: the BOS).
    const auto ids = test::run_tmx("tokenizer encode --tokenizer " + *dir_ / "ckpt" +
                                   " --text '[user] tell me of the fox\n[assistant]'");
    ASSERT_EQ(ids.exit_code, 0) << ids.err;
    const size_t n = static_cast<size_t>(std::count(ids.out.begin(), ids.out.end(), ',')) + 1;
    EXPECT_EQ(ok["usage"]["prompt_tokens"], n + 1) << ok.dump();
    auto c = client();
    const json bad = {
        {"messages",
         {{{"role", "user"}, {"content", "hi"}}, {{"role", "system"}, {"content", "late"}}}}};
    auto res = c.Post("/v1/chat/completions", bad.dump(), "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 400);
    const json err = json::parse(res->body)["error"];
    EXPECT_EQ(err["message"], "the system message must come first");
    EXPECT_EQ(err["param"], "messages");
    EXPECT_EQ(stop(), 0);
    std::ifstream in(log_);
    std::stringstream log;
    log << in.rdbuf();
    EXPECT_NE(log.str().find("chat template: " + tmpl), std::string::npos) << log.str();
}

TEST_F(ServeCli, ChatCompletionsStreamDeltas) {
    ASSERT_GT(start(), 0);
    const json req = {{"messages",
                       {{{"role", "system"}, {"content", "be brief"}},
                        {{"role", "user"}, {"content", "tell me of the fox"}}}},
                      {"max_tokens", 8},
                      {"seed", 2}};
    const json a = post("/v1/chat/completions", req);
    EXPECT_EQ(a["object"], "chat.completion");
    EXPECT_EQ(a["choices"][0]["message"]["role"], "assistant");
    const std::string content = a["choices"][0]["message"]["content"];
    std::string streamed;
    const std::vector<json> events = stream("/v1/chat/completions", req);
    ASSERT_FALSE(events.empty());
    EXPECT_EQ(events[0]["choices"][0]["delta"]["role"], "assistant");
    for (const json& e : events) {
        EXPECT_EQ(e["object"], "chat.completion.chunk");
        if (e["choices"][0]["delta"].contains("content"))
            streamed += e["choices"][0]["delta"]["content"].get<std::string>();
    }
    EXPECT_EQ(streamed, content);
}

// The server on every other backend of this build (Vulkan on lavapipe here, CUDA and Vulkan on
// a GPU) gives the CPU's answers: two streams decoded together, greedy, each token's log-
// probability within 1e-3 of the CPU's. A token may differ only where the CPU's two best were
// that close (a near tie the backend's rounding can break the other way); the comparison of
// that answer stops there.
TEST_F(ServeCli, EveryBackendServesWhatTheCpuServes) {
    const std::vector<std::string> prompts = {"the little fox", "once upon a time there was"};
    auto answers = [&] {
        std::vector<std::future<std::vector<json>>> streams;
        for (const std::string& p : prompts)
            streams.push_back(std::async(std::launch::async, [&, p] {
                return stream("/v1/completions", {{"prompt", p},
                                                  {"max_tokens", 12},
                                                  {"temperature", 0},
                                                  {"logprobs", 5},
                                                  {"ignore_eos", true}});
            }));
        // Per prompt: each token's text, log-probability and the gap to the runner-up.
        std::vector<std::vector<std::tuple<std::string, double, double>>> out;
        for (auto& s : streams) {
            out.emplace_back();
            for (const json& e : s.get()) {
                const json& lp = e["choices"][0]["logprobs"];
                if (lp.is_null()) continue;
                for (size_t i = 0; i < lp["tokens"].size(); ++i) {
                    std::vector<double> top;
                    for (const auto& [tok, v] : lp["top_logprobs"][i].items())
                        top.push_back(v.get<double>());
                    std::sort(top.rbegin(), top.rend());
                    const double gap = top.size() > 1 ? top[0] - top[1] : INFINITY;
                    out.back().emplace_back(lp["tokens"][i].get<std::string>(),
                                            lp["token_logprobs"][i].get<double>(), gap);
                }
            }
            EXPECT_EQ(out.back().size(), 12u);
        }
        return out;
    };
    ASSERT_GT(start("--parallel 2"), 0);
    const auto cpu = answers();
    EXPECT_EQ(stop(), 0);
    int compared = 0;
    for (const std::string& backend : backend_names()) {
        if (backend == "cpu" || !test::backend_opens(backend)) continue;
        ASSERT_GT(start("--parallel 2 --precision fp32", "", backend), 0) << backend;
        const auto there = answers();
        EXPECT_EQ(stop(), 0) << backend;
        ASSERT_EQ(there.size(), cpu.size());
        for (size_t p = 0; p < cpu.size(); ++p)
            for (size_t t = 0; t < std::min(cpu[p].size(), there[p].size()); ++t) {
                const auto& [text, logprob, gap] = cpu[p][t];
                if (std::get<0>(there[p][t]) != text) {
                    EXPECT_LT(gap, 1e-3)
                        << backend << ": prompt " << p << " token " << t << " is '"
                        << std::get<0>(there[p][t]) << "', the CPU's '" << text << "'";
                    break;
                }
                EXPECT_NEAR(std::get<1>(there[p][t]), logprob, 1e-3)
                    << backend << ": prompt " << p << " token " << t;
                ++compared;
            }
    }
    if (compared == 0) GTEST_SKIP() << "no backend besides the CPU opens here";
}

TEST_F(ServeCli, BadRequestsGetTheErrorObjectNamingTheField) {
    ASSERT_GT(start("--api-key sekret --max-tokens-limit 50 --max-body 4096"), 0);
    const httplib::Headers key = {{"Authorization", "Bearer sekret"}};
    auto expect_error = [&](const json& e, const std::string& param) {
        ASSERT_TRUE(e.contains("error")) << e.dump();
        EXPECT_TRUE(e["error"]["message"].is_string());
        EXPECT_EQ(e["error"]["type"], "invalid_request_error") << e.dump();
        if (param.empty()) {
            EXPECT_TRUE(e["error"]["param"].is_null()) << e.dump();
        } else {
            EXPECT_EQ(e["error"]["param"], param) << e.dump();
        }
        EXPECT_TRUE(e["error"].contains("code"));
    };
    expect_error(post("/v1/completions", {{"prompt", "x"}}, 401), "");
    expect_error(post("/tokenize", {{"prompt", "x"}}, 401), "");
    expect_error(post("/tokenize", json::object(), 400, key), "prompt");
    expect_error(post("/detokenize", {{"tokens", {1, 300}}}, 400, key), "tokens[1]");
    expect_error(post("/detokenize", {{"tokens", "1"}}, 400, key), "tokens");
    expect_error(
        post("/v1/completions", {{"prompt", "x"}}, 401, {{"Authorization", "Bearer wrong"}}), "");
    auto c = client();
    auto res = c.Post("/v1/completions", key, "{not json", "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 400);
    expect_error(json::parse(res->body), "");
    expect_error(post("/v1/completions", {{"max_tokens", 3}}, 400, key), "prompt");
    expect_error(post("/v1/completions", {{"prompt", 5}}, 400, key), "prompt");
    // Prompts as token ids: each an id in the vocabulary (300 here).
    expect_error(post("/v1/completions", {{"prompt", {5, "a"}}}, 400, key), "prompt[1]");
    expect_error(post("/v1/completions", {{"prompt", {5, -1}}}, 400, key), "prompt[1]");
    expect_error(post("/v1/completions", {{"prompt", {{5, 6}, {7, 300}}}}, 400, key),
                 "prompt[1][1]");
    expect_error(post("/v1/completions", {{"prompt", {{5, 6}, json::array()}}}, 400, key),
                 "prompt[1]");
    expect_error(post("/v1/completions", {{"prompt", "x"}, {"frequency_penalty", 2.5}}, 400, key),
                 "frequency_penalty");
    expect_error(post("/v1/completions", {{"prompt", "x"}, {"presence_penalty", "1"}}, 400, key),
                 "presence_penalty");
    expect_error(post("/v1/completions", {{"prompt", "x"}, {"logit_bias", {{"7", 101}}}}, 400, key),
                 "logit_bias.7");
    expect_error(post("/v1/completions", {{"prompt", "x"}, {"logit_bias", {{"x7", 1}}}}, 400, key),
                 "logit_bias.x7");
    expect_error(post("/v1/completions", {{"prompt", "x"}, {"logit_bias", {{"300", 1}}}}, 400, key),
                 "logit_bias.300");
    expect_error(post("/v1/completions", {{"prompt", "x"}, {"suffix", "end"}}, 400, key), "suffix");
    expect_error(post("/v1/completions", {{"prompt", "x"}, {"best_of", 3}}, 400, key), "best_of");
    expect_error(post("/v1/completions", {{"prompt", "x"}, {"max_tokens", "3"}}, 400, key),
                 "max_tokens");
    expect_error(post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 51}}, 400, key),
                 "max_tokens");
    expect_error(post("/v1/completions", {{"prompt", "x"}, {"n", 99}}, 400, key), "n");
    // 0 parses as an unsigned literal: the lower bound holds for those too.
    expect_error(post("/v1/completions", {{"prompt", "x"}, {"n", 0}}, 400, key), "n");
    expect_error(post("/v1/completions", {{"prompt", "x"}, {"temperature", 3}}, 400, key),
                 "temperature");
    expect_error(post("/v1/completions", {{"prompt", "x"}, {"stop", {1}}}, 400, key), "stop[0]");
    expect_error(post("/v1/chat/completions", {{"messages", {{{"role", "user"}}}}}, 400, key),
                 "messages[0].content");
    expect_error(post("/v1/chat/completions",
                      {{"messages", {{{"role", "robot"}, {"content", "x"}}}}}, 400, key),
                 "messages[0].role");
    res = c.Post("/v1/completions", key, json{{"prompt", std::string(8000, 'a')}}.dump(),
                 "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 413);
    expect_error(json::parse(res->body), "");
    res = c.Get("/v1/nothing", key);
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 404);
    expect_error(json::parse(res->body), "");
    // The server is still well.
    EXPECT_EQ(post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 2}}, 200,
                   key)["usage"]["completion_tokens"],
              2);
}

// Eight requests at once on four slots, with fixed seeds, give what each gives alone; a full
// queue answers 429 with Retry-After.
TEST_F(ServeCli, ConcurrentRequestsGiveWhatEachGivesAloneAndAFullQueueIs429) {
    ASSERT_GT(start("--parallel 4 --queue 8"), 0);
    std::vector<json> reqs;
    for (int i = 0; i < 8; ++i)
        reqs.push_back({{"prompt", std::string(i % 2 ? "the green" : "a little fox") +
                                       std::string(static_cast<size_t>(i), '!')},
                        {"max_tokens", 6 + 3 * i},
                        {"seed", 100 + i}});
    std::vector<std::future<json>> together;
    for (const json& r : reqs)
        together.push_back(std::async(std::launch::async, [&, r] {
            auto c = client();
            auto res = c.Post("/v1/completions", r.dump(), "application/json");
            return res && res->status == 200 ? json::parse(res->body) : json();
        }));
    std::vector<std::string> texts;
    for (auto& f : together) {
        const json j = f.get();
        ASSERT_TRUE(j.contains("choices"));
        texts.push_back(j["choices"][0]["text"]);
    }
    for (size_t i = 0; i < reqs.size(); ++i)
        EXPECT_EQ(post("/v1/completions", reqs[i])["choices"][0]["text"], texts[i]) << i;
    EXPECT_EQ(stop(), 0);

    ASSERT_GT(start("--parallel 1 --queue 0 --max-tokens-limit 1000000"), 0);
    std::thread hog([&] {
        auto c = client();
        c.Post(
            "/v1/completions",
            json{{"prompt", "x"}, {"max_tokens", 1000000}, {"ignore_eos", true}, {"stream", true}}
                .dump(),
            "application/json");
    });
    // Until the hog holds the slot (a fixed wait is too short on a loaded machine).
    auto c = client();
    for (int i = 0; i < 600; ++i) {
        auto m = c.Get("/metrics");
        if (m && m->body.find("\ntmx_active_slots 1\n") != std::string::npos) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    auto res = c.Post("/v1/completions", json{{"prompt", "y"}, {"max_tokens", 2}}.dump(),
                      "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 429);
    EXPECT_EQ(res->get_header_value("Retry-After"), "1");
    EXPECT_EQ(json::parse(res->body)["error"]["type"], "rate_limit_error");
    EXPECT_EQ(stop(), 0);  // SIGTERM with the stream running: it ends, the server exits 0
    hog.join();
}

// A client that leaves mid-stream frees its slot: with one slot, the next request is served at
// once, not after the abandoned one's million tokens.
TEST_F(ServeCli, ADisconnectedStreamFreesItsSlot) {
    ASSERT_GT(start("--parallel 1 --max-tokens-limit 1000000"), 0);
    {
        auto c = client();
        int events = 0;
        httplib::Request req;
        req.method = "POST";
        req.path = "/v1/completions";
        req.body =
            json{{"prompt", "x"}, {"max_tokens", 1000000}, {"ignore_eos", true}, {"stream", true}}
                .dump();
        req.set_header("Content-Type", "application/json");
        req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
            return ++events < 3;  // then hang up
        };
        c.send(req);
        EXPECT_GE(events, 3);
    }
    const auto t0 = std::chrono::steady_clock::now();
    const json r =
        post("/v1/completions", {{"prompt", "the fox"}, {"max_tokens", 4}, {"ignore_eos", true}});
    EXPECT_EQ(r["usage"]["completion_tokens"], 4);
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 20.0);
}

// A client that leaves before its non-streamed answer is ready frees its slot too: with one slot
// and no queue, /metrics counts it cancelled with the slot free, and the next request is served
// instead of getting 429 until the abandoned one's million tokens are written.
TEST_F(ServeCli, ADisconnectedNonStreamedRequestFreesItsSlot) {
    ASSERT_GT(start("--parallel 1 --queue 0 --max-tokens-limit 1000000"), 0);
    auto c = client();
    auto metrics_show = [&](std::initializer_list<const char*> lines) {
        auto m = c.Get("/metrics");
        return m && std::all_of(lines.begin(), lines.end(), [&](const char* line) {
                   return m->body.find(line) != std::string::npos;
               });
    };
    // Polls up to 60 s (a loaded machine is slow, but the answer never comes by itself).
    auto eventually = [&](std::initializer_list<const char*> lines) {
        for (int i = 0; i < 1200; ++i) {
            if (metrics_show(lines)) return true;
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        return false;
    };
    const std::string body =
        json{{"prompt", "x"}, {"max_tokens", 1000000}, {"ignore_eos", true}}.dump();
    const std::string request =
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: " +
        std::to_string(body.size()) + "\r\n\r\n" + body;
    {
        RawConnection raw(port_);
        ASSERT_TRUE(raw.connected());
        ASSERT_TRUE(raw.send(request));
        ASSERT_TRUE(eventually({"\ntmx_active_slots 1\n"}));
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }  // the client hangs up
    EXPECT_TRUE(
        eventually({"tmx_requests_total{outcome=\"cancelled\"} 1\n", "\ntmx_active_slots 0\n"}));
    const json r =
        post("/v1/completions", {{"prompt", "the fox"}, {"max_tokens", 4}, {"ignore_eos", true}});
    EXPECT_EQ(r["usage"]["completion_tokens"], 4);
    EXPECT_TRUE(metrics_show({"tmx_requests_total{outcome=\"ok\"} 1\n",
                              "tmx_requests_total{outcome=\"queue_full\"} 0\n"}));
    // A client that closes only its sending side counts as gone as well; it reads why. (The
    // answered request's slot is freed just after its answer: wait for it, or with no queue
    // the next request may be a 429, as it was once under the sanitizers.)
    ASSERT_TRUE(eventually({"\ntmx_active_slots 0\n"}));
    RawConnection half(port_);
    ASSERT_TRUE(half.send(request));
    ASSERT_TRUE(eventually({"\ntmx_active_slots 1\n"}));
    half.shut_writes();
    const RawConnection::Response answer = half.read_response();
    EXPECT_EQ(answer.status, 499);
    EXPECT_EQ(json::parse(answer.body)["error"]["code"], "cancelled") << answer.body;
    EXPECT_TRUE(
        eventually({"tmx_requests_total{outcome=\"cancelled\"} 2\n", "\ntmx_active_slots 0\n"}));
    EXPECT_EQ(stop(), 0);
}

// A model whose logits are not finite (one output row overflows fp32): each request fails with a
// 500 and the error object (a stream: an error event, then [DONE]); the server stays up.
TEST_F(ServeCli, ARequestTheModelFailsOnGetsA500AndTheServerStaysUp) {
    namespace fs = std::filesystem;
    const fs::path bad = fs::path(*dir_ / "poisoned");
    fs::remove_all(bad);
    fs::copy(fs::path(*dir_ / "ckpt"), bad, fs::copy_options::recursive);
    {
        std::string bytes = read_file(bad / "model.safetensors");
        uint64_t n = 0;
        std::memcpy(&n, bytes.data(), 8);
        const json header = json::parse(bytes.substr(8, n));
        const json& e = header.at("model.embed_tokens.weight");  // tied: also the output rows
        ASSERT_EQ(e.at("dtype"), "F32");
        const int64_t d = e.at("shape")[1];
        const size_t row = 8 + n + e.at("data_offsets")[0].get<size_t>() + 17 * d * 4;
        for (int64_t i = 0; i < d; ++i) {
            const float v = (i % 2 ? -3e38f : 3e38f);
            std::memcpy(bytes.data() + row + 4 * i, &v, 4);
        }
        write_file_atomic(bad / "model.safetensors", bytes);
    }
    ASSERT_GT(start("", bad.string()), 0);
    const json body = {{"prompt", "the fox"}, {"max_tokens", 4}};
    const json r = post("/v1/completions", body, 500);
    EXPECT_EQ(r["error"]["type"], "server_error") << r.dump();
    EXPECT_EQ(r["error"]["code"], "backend_error") << r.dump();
    EXPECT_NE(r["error"]["message"].get<std::string>().find("not finite"), std::string::npos)
        << r.dump();
    bool done = false;
    const std::vector<json> events = stream("/v1/completions", body, &done);
    EXPECT_TRUE(done);
    ASSERT_FALSE(events.empty());
    EXPECT_EQ(events.back()["error"]["code"], "backend_error") << events.back().dump();
    for (size_t i = 0; i + 1 < events.size(); ++i)  // no finish_reason OpenAI does not define
        EXPECT_TRUE(events[i]["choices"][0]["finish_reason"].is_null()) << events[i].dump();
    auto c = client();
    auto health = c.Get("/health");
    ASSERT_TRUE(health);
    EXPECT_EQ(health->status, 200);
    auto metrics = c.Get("/metrics");
    ASSERT_TRUE(metrics);
    EXPECT_NE(metrics->body.find("outcome=\"server_error\"} 2"), std::string::npos)
        << metrics->body;
    EXPECT_EQ(stop(), 0);
    // tmx generate, on the same scheduler, stops with the same reason.
    const test::CommandResult g =
        test::run_tmx("generate --model " + bad.string() + " --prompt fox --max-new-tokens 3");
    EXPECT_EQ(g.exit_code, 1);
    EXPECT_NE(g.err.find("not finite"), std::string::npos) << g.err;
}

// SIGTERM with streams running: each gets a complete answer (finished within the grace period)
// or an error event, then [DONE]; the process exits 0.
TEST_F(ServeCli, SigtermWithStreamsRunningEndsEachStreamAndExitsZero) {
    ASSERT_GT(start("--parallel 2 --shutdown-grace 1 --max-tokens-limit 1000000"), 0);
    std::vector<std::future<std::vector<json>>> streams;
    std::vector<bool> done(3, false);
    for (int i = 0; i < 3; ++i)
        streams.push_back(std::async(std::launch::async, [&, i] {
            bool seen = false;
            auto events = stream(
                "/v1/completions",
                {{"prompt", "x"}, {"max_tokens", i == 0 ? 3 : 1000000}, {"ignore_eos", true}},
                &seen);
            done[static_cast<size_t>(i)] = seen;
            return events;
        }));
    std::this_thread::sleep_for(std::chrono::milliseconds(800));
    EXPECT_EQ(stop(), 0);
    for (int i = 0; i < 3; ++i) {
        const std::vector<json> events = streams[static_cast<size_t>(i)].get();
        ASSERT_FALSE(events.empty()) << i;
        const json& last = events.back();
        const bool complete =
            last.contains("choices") && !last["choices"][0]["finish_reason"].is_null();
        EXPECT_TRUE(complete || last.contains("error")) << last.dump();
        EXPECT_TRUE(done[static_cast<size_t>(i)]) << i;
    }
}

// A client nobody here wrote: the official OpenAI Node.js SDK (scripts/test.sh installs npm's
// `openai` into build/npm), streaming and not, completions and chat.
TEST_F(ServeCli, TheOfficialOpenAINodeClientWorksWithIt) {
    const std::string package =
        (std::filesystem::path(TMX_BINARY).parent_path() / "npm/node_modules/openai").string();
    if (std::system("node --version >/dev/null 2>&1") != 0)
        GTEST_SKIP() << "node is not installed (scripts/test.sh installs it)";
    if (!std::filesystem::exists(package + "/package.json"))
        GTEST_SKIP() << "npm's openai package is not in " << package
                     << " (scripts/test.sh installs it)";
    ASSERT_GT(start("--parallel 2"), 0);
    const std::string out = *dir_ / "sdk.out";
    const std::string cmd = "TMX_BASE_URL=http://127.0.0.1:" + std::to_string(port_) +
                            "/v1 TMX_OPENAI_PACKAGE=" + package + " node " + test::source_dir() +
                            "/tests/clients/openai_sdk.cjs >" + out + " 2>&1";
    const int status = std::system(cmd.c_str());
    std::ifstream in(out);
    std::stringstream ss;
    ss << in.rdbuf();
    EXPECT_EQ(status, 0) << ss.str();
    EXPECT_NE(ss.str().find("openai sdk: ok"), std::string::npos) << ss.str();
}

// The playground page in a real browser: headless Chromium (Debian's chromium, driven by npm's
// playwright-core; scripts/test.sh installs both) loads GET /, submits a prompt, and sees the
// streamed text appear.
TEST_F(ServeCli, ThePlaygroundPageStreamsInABrowser) {
    const std::string package =
        (std::filesystem::path(TMX_BINARY).parent_path() / "npm/node_modules/playwright-core")
            .string();
    const std::string browser = "/usr/bin/chromium";
    if (std::system("node --version >/dev/null 2>&1") != 0)
        GTEST_SKIP() << "node is not installed (scripts/test.sh installs it)";
    if (!std::filesystem::exists(package + "/package.json"))
        GTEST_SKIP() << "npm's playwright-core is not in " << package
                     << " (scripts/test.sh installs it)";
    if (!std::filesystem::exists(browser))
        GTEST_SKIP() << "Debian's chromium is not installed (scripts/test.sh installs it)";
    ASSERT_GT(start(), 0);
    auto page = client().Get("/");
    ASSERT_TRUE(page);
    EXPECT_EQ(page->status, 200);
    EXPECT_EQ(page->get_header_value("Content-Type"), "text/html; charset=utf-8");
    const std::string out = *dir_ / "browser.out";
    const std::string cmd = "TMX_BASE_URL=http://127.0.0.1:" + std::to_string(port_) +
                            " TMX_PLAYWRIGHT_PACKAGE=" + package + " TMX_CHROMIUM=" + browser +
                            " node " + test::source_dir() +
                            "/tests/clients/playground_browser.cjs >" + out + " 2>&1";
    const int status = std::system(cmd.c_str());
    std::ifstream in(out);
    std::stringstream ss;
    ss << in.rdbuf();
    EXPECT_EQ(status, 0) << ss.str();
    EXPECT_NE(ss.str().find("playground: ok"), std::string::npos) << ss.str();
}

}  // namespace
}  // namespace tmx

// Structured output over HTTP (response_format on /v1/completions and /v1/chat/completions):
// the demo model at temperature 1, many seeds and choices, for hand-picked and random schemas,
// on the CPU and Vulkan backends; every choice that ends (finish_reason "stop") is JSON valid
// under its schema by npm's ajv (tests/clients/json_schema_validate.cjs) and by the tests' own
// validator; one cut by max_tokens ("length") is a prefix of such a text; streaming gives the
// same text; an unsupported schema is a 400 naming the keyword's path.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/infer/json_schema.h"
#include "tests/engine/infer/json_schema_cases.h"
#include "tests/test_util.h"

namespace tmx {
namespace {

using nlohmann::json;
using test::ojson;

std::string npm_package(const std::string& name) {
    return (std::filesystem::path(TMX_BINARY).parent_path() / "npm/node_modules" / name).string();
}

// Why ajv cannot run here, or "" when it can.
std::string ajv_missing() {
    if (std::system("node --version >/dev/null 2>&1") != 0)
        return "node is not installed (scripts/test.sh installs it)";
    if (!std::filesystem::exists(npm_package("ajv") + "/package.json"))
        return "npm's ajv is not in " + npm_package("ajv") + " (scripts/test.sh installs it)";
    return "";
}

// `tmx serve` of the demo model on a free port.
class StructuredOutput : public ::testing::Test {
  protected:
    void start(const std::string& backend = "cpu") {
        log_ = dir_ / "serve.log";
        pid_ = ::fork();
        if (pid_ == 0) {
            const std::string cmd = std::string(TMX_BINARY) + " serve --model " +
                                    test::source_dir() + "/assets/demo --backend " + backend +
                                    " --port 0 --parallel 4 --threads 1 2>" + log_ +
                                    " >/dev/null </dev/null";
            ::execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), nullptr);
            ::_exit(127);
        }
        for (int i = 0; i < 1500; ++i) {
            std::ifstream in(log_);
            std::stringstream ss;
            ss << in.rdbuf();
            const size_t at = ss.str().find("listening on http://127.0.0.1:");
            if (at != std::string::npos) {
                port_ = std::stoi(ss.str().substr(at + 30));
                return;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        FAIL() << "the server did not start";
    }
    void TearDown() override {
        if (pid_ <= 0) return;
        ::kill(pid_, SIGTERM);
        int status = 0;
        ::waitpid(pid_, &status, 0);
    }
    // Ordered: a schema's properties go in its order (nlohmann::json would sort them).
    json post(const std::string& path, const ojson& body, int expect_status = 200) {
        httplib::Client c("127.0.0.1", port_);
        c.set_read_timeout(120);
        auto res = c.Post(path, body.dump(), "application/json");
        EXPECT_TRUE(res) << "no response";
        if (!res) return {};
        EXPECT_EQ(res->status, expect_status) << res->body;
        return json::parse(res->body);
    }

    // Asks for `n` choices under the schema (json_object mode for a null schema) on both
    // endpoints; checks each with the tests' validator (a finished one) or the automaton (one
    // cut by max_tokens) and keeps the finished ones' texts for ajv. Returns how many finished.
    int ask(const ojson& schema, uint64_t seed, json& ajv_cases, int n = 8, int max_tokens = 96) {
        SCOPED_TRACE(schema.dump());
        const ojson format =
            schema.is_null()
                ? ojson{{"type", "json_object"}}
                : ojson{{"type", "json_schema"},
                        {"json_schema", {{"name", "t"}, {"strict", true}, {"schema", schema}}}};
        JsonDfa prefixes(schema.is_null() ? json_object_grammar() : compile_json_schema(schema));
        json texts = json::array();
        int finished = 0;
        for (bool chat : {false, true}) {
            ojson body = {{"max_tokens", max_tokens},
                          {"temperature", 1.0},
                          {"top_p", 1.0},
                          {"n", n},
                          {"seed", seed},
                          {"response_format", format}};
            if (chat)
                body["messages"] = {{{"role", "user"}, {"content", "Answer in JSON."}}};
            else
                body["prompt"] = seed % 2 ? "The data:" : "";  // "": the text's first piece
            const json r = post(chat ? "/v1/chat/completions" : "/v1/completions", body);
            if (!r.contains("choices")) return finished;
            for (const json& c : r["choices"]) {
                const std::string text = chat ? c["message"]["content"].get<std::string>()
                                              : c["text"].get<std::string>();
                if (c["finish_reason"] == "length") {
                    EXPECT_NE(prefixes.walk(prefixes.start(), text), JsonDfa::kDead) << text;
                    continue;
                }
                EXPECT_EQ(c["finish_reason"], "stop");
                ++finished;
                texts.push_back(text);
                json value;
                try {
                    value = json::parse(text);
                } catch (const json::exception&) {
                    ADD_FAILURE() << "not JSON: " << text;
                    continue;
                }
                EXPECT_TRUE(schema.is_null() ? value.is_object() : test::validates(value, schema))
                    << text;
            }
        }
        ajv_cases.push_back(
            {{"schema", schema.is_null() ? json{{"type", "object"}} : json::parse(schema.dump())},
             {"texts", texts}});
        return finished;
    }

    // Every text valid by ajv; a skip (after the checks above ran) where ajv is missing.
    void expect_ajv_accepts(const json& cases) {
        if (const std::string why = ajv_missing(); !why.empty()) GTEST_SKIP() << why;
        const std::string in = dir_ / "cases.json", out = dir_ / "ajv.out";
        test::write_text(in, cases.dump());
        const std::string cmd = "TMX_AJV_PACKAGE=" + npm_package("ajv") + " node " +
                                test::source_dir() + "/tests/clients/json_schema_validate.cjs " +
                                in + " >" + out + " 2>&1";
        const int status = std::system(cmd.c_str());
        std::ifstream f(out);
        std::stringstream ss;
        ss << f.rdbuf();
        ASSERT_EQ(status, 0) << ss.str();
        const json results = json::parse(ss.str());
        ASSERT_EQ(results.size(), cases.size());
        size_t checked = 0;
        for (size_t i = 0; i < results.size(); ++i)
            for (size_t k = 0; k < results[i].size(); ++k, ++checked)
                EXPECT_TRUE(results[i][k].is_null())
                    << results[i][k] << "\n"
                    << cases[i]["texts"][k] << "\nschema " << cases[i]["schema"];
        EXPECT_GT(checked, 0u);
    }

    test::TempDir dir_;
    std::string log_;
    pid_t pid_ = -1;
    int port_ = -1;
};

TEST_F(StructuredOutput, EveryChoiceOfTheDemoModelValidatesOnTheCpu) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    Rng rng(seed);
    start("cpu");
    ASSERT_GT(port_, 0);
    std::vector<ojson> schemas = test::sample_schemas();
    for (int i = 0; i < 4; ++i) schemas.push_back(test::random_schema(rng, 2));
    schemas.push_back(ojson());  // json_object
    json cases = json::array();
    int finished = 0, asked = 0;
    for (const ojson& schema : schemas) {
        finished += ask(schema, rng.next_u64(), cases);
        asked += 16;
    }
    EXPECT_GT(finished, asked / 2);
    expect_ajv_accepts(cases);
}

TEST_F(StructuredOutput, EveryChoiceOfTheDemoModelValidatesOnVulkan) {
    if (!test::backend_opens("vulkan")) TMX_SKIP_UNAVAILABLE("vulkan", "it does not open");
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    Rng rng(seed);
    start("vulkan");
    ASSERT_GT(port_, 0);
    json cases = json::array();
    int finished = 0;
    // Lavapipe is slow: fewer and shorter answers.
    for (const ojson& schema :
         {test::sample_schemas()[1], test::sample_schemas()[2], test::random_schema(rng, 1)})
        finished += ask(schema, rng.next_u64(), cases, 3, 48);
    EXPECT_GT(finished, 6);
    expect_ajv_accepts(cases);
}

TEST_F(StructuredOutput, StreamedTextIsTheWholeAnswersAndMaxTokensCutsItWithLength) {
    start("cpu");
    ASSERT_GT(port_, 0);
    const json format = {
        {"type", "json_schema"},
        {"json_schema", {{"schema", json::parse(test::sample_schemas()[1].dump())}}}};
    json body = {{"prompt", "Colours:"},
                 {"max_tokens", 96},
                 {"temperature", 1.0},
                 {"seed", 7},
                 {"response_format", format}};
    const json whole = post("/v1/completions", body);
    body["stream"] = true;
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(60);
    auto res = c.Post("/v1/completions", body.dump(), "application/json");
    ASSERT_TRUE(res);
    std::string streamed, finish;
    std::istringstream in(res->body);
    for (std::string line; std::getline(in, line);) {
        if (line.rfind("data: {", 0) != 0) continue;
        const json e = json::parse(line.substr(6));
        streamed += e["choices"][0]["text"].get<std::string>();
        if (!e["choices"][0]["finish_reason"].is_null())
            finish = e["choices"][0]["finish_reason"].get<std::string>();
    }
    EXPECT_EQ(streamed, whole["choices"][0]["text"].get<std::string>());
    EXPECT_EQ(finish, whole["choices"][0]["finish_reason"].get<std::string>());
    // Four tokens cannot finish the object: "length", and the text so far.
    body.erase("stream");
    body["max_tokens"] = 4;
    const json cut = post("/v1/completions", body);
    EXPECT_EQ(cut["choices"][0]["finish_reason"], "length");
    EXPECT_EQ(cut["usage"]["completion_tokens"], 4);
    JsonDfa dfa(compile_json_schema(test::sample_schemas()[1]));
    const std::string text = cut["choices"][0]["text"].get<std::string>();
    EXPECT_NE(dfa.walk(dfa.start(), text), JsonDfa::kDead) << text;
    EXPECT_FALSE(dfa.accepts(text)) << text;
}

TEST_F(StructuredOutput, AnUnsupportedSchemaIsA400NamingTheKeywordsPath) {
    start("cpu");
    ASSERT_GT(port_, 0);
    const json schema =
        json::parse(R"({"type":"object","properties":{"age":{"type":"integer","minimum":0}}})");
    for (const char* path : {"/v1/completions", "/v1/chat/completions"}) {
        json body = {
            {"response_format",
             {{"type", "json_schema"}, {"json_schema", {{"name", "p"}, {"schema", schema}}}}}};
        if (std::string(path) == "/v1/completions")
            body["prompt"] = "x";
        else
            body["messages"] = {{{"role", "user"}, {"content", "x"}}};
        const json e = post(path, body, 400)["error"];
        EXPECT_EQ(e["param"], "response_format.json_schema.schema.properties.age.minimum");
        EXPECT_NE(e["message"].get<std::string>().find("'minimum'"), std::string::npos) << e;
        // A `$ref` to nothing: the param is the `$ref`'s path.
        body["response_format"]["json_schema"]["schema"] = json::parse(
            R"({"type":"object","properties":{"pet":{"$ref":"#/$defs/Pet"}},"$defs":{}})");
        const json r = post(path, body, 400)["error"];
        EXPECT_EQ(r["param"], "response_format.json_schema.schema.properties.pet.$ref");
        EXPECT_NE(r["message"].get<std::string>().find("$ref"), std::string::npos) << r;
        body["response_format"] = {{"type", "xml"}};
        EXPECT_EQ(post(path, body, 400)["error"]["param"], "response_format.type");
        body["response_format"] = {{"type", "json_schema"}};
        EXPECT_EQ(post(path, body, 400)["error"]["param"], "response_format.json_schema");
    }
}

}  // namespace
}  // namespace tmx

// tmx eval: score tokens with a checkpoint (mean next-token cross-entropy and perplexity).
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "apps/commands.h"
#include "engine/checkpoint.h"
#include "engine/errors.h"
#include "engine/model.h"

namespace tmx::cli {
namespace {

std::vector<int32_t> parse_token_list(const std::string& text) {
    std::vector<int32_t> out;
    size_t i = 0;
    while (i <= text.size()) {
        size_t j = text.find(',', i);
        if (j == std::string::npos) j = text.size();
        std::string item = text.substr(i, j - i);
        size_t a = item.find_first_not_of(" \t"), b = item.find_last_not_of(" \t");
        item = a == std::string::npos ? "" : item.substr(a, b - a + 1);
        char* end = nullptr;
        long long v = item.empty() ? -1 : std::strtoll(item.c_str(), &end, 10);
        if (item.empty() || *end != '\0' || v < 0 || v > INT32_MAX)
            throw UsageError("--tokens: expected comma-separated token ids, got '" + item + "'");
        out.push_back(static_cast<int32_t>(v));
        i = j + 1;
    }
    return out;
}

}  // namespace

void add_eval_command(CLI::App& app, CommonOptions& common) {
    struct Options {
        std::string model, tokens, backend = "cpu";
        bool json = false;
    };
    auto opts = std::make_shared<Options>();
    CLI::App* sub = app.add_subcommand(
        "eval", "Mean next-token cross-entropy and perplexity of a checkpoint on given tokens");
    sub->add_option("--model", opts->model, "Checkpoint directory")->required();
    sub->add_option("--tokens", opts->tokens, "Comma-separated token ids, e.g. 1,415,2217,29889")
        ->required();
    sub->add_option("--backend", opts->backend, "Backend to run on")->capture_default_str();
    sub->add_flag("--json", opts->json, "Print one JSON object");
    add_common_options(*sub, common);
    sub->callback([opts]() {
        std::vector<int32_t> tokens = parse_token_list(opts->tokens);
        if (tokens.size() < 2) throw UsageError("--tokens: need at least 2 tokens to score");
        auto backend = make_backend(opts->backend);
        auto model = load_model(opts->model, *backend);
        TokenScore s = score_tokens(*model, tokens, model->config().max_seq_len);
        const double loss = s.total_nats / static_cast<double>(s.tokens);
        if (opts->json) {
            nlohmann::json j = {{"loss", loss}, {"ppl", std::exp(loss)}, {"tokens", s.tokens}};
            std::printf("%s\n", j.dump().c_str());
        } else {
            std::printf("loss %.6f  ppl %.4f  tokens %lld\n", loss, std::exp(loss),
                        static_cast<long long>(s.tokens));
        }
    });
}

}  // namespace tmx::cli

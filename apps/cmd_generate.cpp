// tmx generate: continue text prompts with a checkpoint (rolling KV cache, batched prompts).
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "apps/commands.h"
#include "engine/core/errors.h"
#include "engine/core/file_io.h"
#include "engine/data/tokenizer.h"
#include "engine/infer/chat_template.h"
#include "engine/infer/generator.h"
#include "engine/infer/json_schema.h"
#include "engine/model/checkpoint.h"

namespace tmx::cli {
namespace {

// One prompt per line; blank lines are skipped.
std::vector<std::string> read_prompts_file(const std::string& path) {
    std::vector<std::string> prompts;
    const std::string text = read_file(path);
    size_t i = 0;
    while (i < text.size()) {
        size_t j = text.find('\n', i);
        if (j == std::string::npos) j = text.size();
        std::string line = text.substr(i, j - i);
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.find_first_not_of(" \t") != std::string::npos) prompts.push_back(line);
        i = j + 1;
    }
    if (prompts.empty()) throw Error(path + ": no prompts (one prompt per line expected)");
    return prompts;
}

double per_second(double count, double seconds) {
    return seconds > 0 ? count / seconds : 0.0;
}

}  // namespace

void add_generate_command(CLI::App& app, CommonOptions& common) {
    struct Options {
        std::string model, prompt, prompts_file, tokenizer, system, chat_template, json_schema;
        bool chat = false, json_object = false;
        BackendChoice backend;
        WeightsChoice weights;
        std::vector<std::string> stop;
        GenerationOptions gen;
        bool json = false;
    };
    auto opts = std::make_shared<Options>();
    GenerationOptions& g = opts->gen;
    SamplingOptions& s = g.sampling;
    CLI::App* sub = app.add_subcommand(
        "generate",
        "Continue a prompt (or a batch of prompts) with a checkpoint; the text streams to stdout "
        "and timing goes to stderr");
    sub->add_option("--model", opts->model, "Checkpoint directory (with tokenizer.model)")
        ->required();
    auto* prompt =
        sub->add_option("--prompt", opts->prompt, "Text to continue (\"\" = start from BOS alone)");
    auto* file = sub->add_option("--prompts-file", opts->prompts_file,
                                 "File with one prompt per line (blank lines skipped), generated "
                                 "as one batch; each result prints when the batch is done")
                     ->check(CLI::ExistingFile);
    prompt->excludes(file);
    sub->add_flag("--chat", opts->chat,
                  "Each prompt is a user's message: the model's chat template (its "
                  "tokenizer_config.json's chat_template) makes the conversation's prompt and "
                  "the reply prints");
    sub->add_option("--system", opts->system, "With --chat: a system message before the user's")
        ->needs("--chat");
    sub->add_option("--chat-template", opts->chat_template,
                    "With --chat: a Jinja chat template file to use instead of the model's own")
        ->check(CLI::ExistingFile)
        ->needs("--chat");
    sub->add_option("--max-new-tokens", g.max_new_tokens,
                    "Tokens to generate at most per prompt (generation also stops at the end "
                    "of a document: EOS, or BOS starting the next)")
        ->check(in_range<int64_t>(0))
        ->capture_default_str();
    sub->add_flag("--ignore-eos", g.ignore_eos,
                  "Keep generating past the end of a document, to --max-new-tokens (or a --stop "
                  "string): for benchmarks and comparisons of a fixed length");
    sub->add_option("--temperature", s.temperature, "Sampling temperature (0 = greedy)")
        ->capture_default_str();
    sub->add_option("--top-k", s.top_k, "Keep the k most likely tokens (0 = off)")
        ->check(in_range<int64_t>(0))
        ->capture_default_str();
    sub->add_option("--top-p", s.top_p,
                    "Keep the most likely tokens up to this cumulative probability (1 = off)")
        ->capture_default_str();
    sub->add_option("--min-p", s.min_p,
                    "Drop tokens less likely than this fraction of the top token (0 = off)")
        ->capture_default_str();
    sub->add_option("--repetition-penalty", s.repetition_penalty,
                    "Penalise tokens already in the text, prompt included: positive logits "
                    "divided by it, negative ones multiplied (1 = off)")
        ->capture_default_str();
    sub->add_option("--frequency-penalty", s.frequency_penalty,
                    "Subtract this times the number of times a token was generated from its "
                    "logit, as OpenAI's API does (-2 .. 2; 0 = off)")
        ->capture_default_str();
    sub->add_option("--presence-penalty", s.presence_penalty,
                    "Subtract this from the logit of every token generated at least once, as "
                    "OpenAI's API does (-2 .. 2; 0 = off)")
        ->capture_default_str();
    sub->add_option("--seed", g.seed,
                    "Random seed; a prompt samples the same in a batch as alone (repeats of a "
                    "prompt in one batch sample differently)")
        ->check(in_range<uint64_t>(0))
        ->capture_default_str();
    sub->add_option("--stop", opts->stop,
                    "Stop when the continuation contains this text (repeatable); the text is cut "
                    "before it");
    sub->add_option("--prefill-chunk", g.prefill_chunk,
                    "Prompt tokens per prefill step, 1 .. the attention window (default: the "
                    "window)")
        ->check(in_range<int64_t>(1));
    sub->add_option("--tokenizer", opts->tokenizer,
                    "SentencePiece model to use instead of the checkpoint's tokenizer.model")
        ->check(CLI::ExistingFile);
    auto* schema = sub->add_option("--json-schema", opts->json_schema,
                                   "Structured output: each continuation is JSON valid under this "
                                   "JSON Schema file (docs/serve.md#structured-output); it ends "
                                   "when the value is complete")
                       ->check(CLI::ExistingFile);
    sub->add_flag("--json-object", opts->json_object,
                  "Structured output: each continuation is a JSON object")
        ->excludes(schema);
    add_backend_options(*sub, opts->backend);
    add_weights_option(*sub, opts->weights);
    sub->add_flag("--json", opts->json,
                  "Print one JSON object per prompt (prompt, prompt_ids, text, ids, stop_reason, "
                  "prefill_tokens_per_s, decode_tokens_per_s) and nothing else on stdout");
    add_common_options(*sub, common);

    sub->callback([opts]() {
        std::vector<std::string> prompts = opts->prompts_file.empty()
                                               ? std::vector<std::string>{opts->prompt}
                                               : read_prompts_file(opts->prompts_file);
        validate(opts->gen.sampling);
        if (opts->json_object) opts->gen.json_grammar = json_object_grammar();
        if (!opts->json_schema.empty()) {
            nlohmann::ordered_json schema;
            try {
                schema = nlohmann::ordered_json::parse(read_file(opts->json_schema));
            } catch (const nlohmann::json::exception& e) {
                throw Error(opts->json_schema + ": not JSON (" + e.what() + ")");
            }
            try {
                opts->gen.json_grammar = compile_json_schema(schema);
            } catch (const JsonSchemaError& e) {
                throw Error(opts->json_schema + ": " + e.what());
            }
        }
        const std::string tok_path =
            opts->tokenizer.empty() ? checkpoint_tokenizer(opts->model) : opts->tokenizer;
        load_checkpoint_config(opts->model);  // a clear error for a missing directory first
        if (tok_path.empty())
            throw Error(
                opts->model +
                ": the checkpoint has no tokenizer.model or tokenizer.json (copy one in, or pass "
                "--tokenizer FILE)");
        const Tokenizer tokenizer = Tokenizer::load(tok_path);
        // With --chat, each prompt as a conversation's tokens, rendered by the chat template.
        std::vector<std::vector<int32_t>> chat_ids;
        if (opts->chat) {
            const ChatPrompt chat =
                ChatPrompt::for_tokenizer(tokenizer, tok_path, opts->chat_template);
            std::fprintf(stderr, "chat template: %s\n", chat.source().c_str());
            for (const std::string& p : prompts) {
                std::vector<ChatMessage> messages;
                if (!opts->system.empty()) messages.push_back({"system", opts->system});
                messages.push_back({"user", p});
                chat_ids.push_back(chat.tokens(messages));
            }
        }
        auto backend = opts->backend.open();
        auto model = opts->weights.load(opts->model, *backend);

        const bool single = prompts.size() == 1;
        TextCallback stream;
        if (!opts->json && single) {
            if (!opts->chat) std::fputs(prompts[0].c_str(), stdout);  // a chat prints the reply
            std::fflush(stdout);
            stream = [](size_t, std::string_view text) {
                std::fwrite(text.data(), 1, text.size(), stdout);
                std::fflush(stdout);
            };
        }
        const auto t0 = std::chrono::steady_clock::now();
        const std::vector<TextGeneration> results =
            opts->chat
                ? generate_text(*model, tokenizer, prompts, chat_ids, opts->gen, opts->stop, stream)
                : generate_text(*model, tokenizer, prompts, opts->gen, opts->stop, stream);
        const double wall =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

        int64_t prompt_tokens = 0, new_tokens = 0;
        double prefill_seconds = 0;
        for (size_t i = 0; i < results.size(); ++i) {
            const TextGeneration& r = results[i];
            const TokenGeneration& t = r.tokens;
            prompt_tokens += static_cast<int64_t>(t.prompt_ids.size());
            new_tokens += static_cast<int64_t>(t.ids.size());
            prefill_seconds += t.prefill_seconds;
            const double prefill_rate =
                per_second(static_cast<double>(t.prompt_ids.size()), t.prefill_seconds);
            const double decode_rate =
                per_second(static_cast<double>(t.decode_steps), t.decode_seconds);
            if (opts->json) {
                nlohmann::json j = {{"prompt", r.prompt},
                                    {"prompt_ids", t.prompt_ids},
                                    {"text", r.text},
                                    {"ids", t.ids},
                                    {"stop_reason", to_string(t.stop_reason)},
                                    {"prefill_tokens_per_s", prefill_rate},
                                    {"decode_tokens_per_s", decode_rate},
                                    {"backend", backend->name()},
                                    {"precision", to_string(backend->matmul_precision())}};
                std::printf(
                    "%s\n",
                    j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
            } else if (single) {
                std::printf("\n");
            } else {
                std::printf("%s[%zu] %s%s\n", i ? "\n" : "", i + 1, r.prompt.c_str(),
                            r.text.c_str());
            }
            std::fflush(stdout);  // the text before its stats line, when both are piped
            if (!opts->json)
                std::fprintf(stderr,
                             "[%zu] %zu prompt tokens, %zu new, stop: %s; prefill %.1f tokens/s, "
                             "decode %.1f tokens/s\n",
                             i + 1, t.prompt_ids.size(), t.ids.size(), to_string(t.stop_reason),
                             prefill_rate, decode_rate);
        }
        std::fflush(stdout);
        if (!opts->json && !single)
            std::fprintf(stderr,
                         "batch of %zu: %lld prompt tokens, %lld new tokens in %.2f s (%.1f new "
                         "tokens/s after %.2f s of prefill)\n",
                         results.size(), static_cast<long long>(prompt_tokens),
                         static_cast<long long>(new_tokens), wall,
                         per_second(static_cast<double>(new_tokens), wall - prefill_seconds),
                         prefill_seconds);
    });
}

}  // namespace tmx::cli

// tmx eval: score tokens with a checkpoint (mean next-token cross-entropy and perplexity).
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "apps/commands.h"
#include "engine/core/errors.h"
#include "engine/core/file_io.h"
#include "engine/data/corpus.h"
#include "engine/data/dataset.h"
#include "engine/data/tokenizer.h"
#include "engine/model/checkpoint.h"
#include "engine/model/model.h"

namespace tmx::cli {

// The text of a file as the model sees it: documents split as `tmx prepare` splits them, each
// starting with BOS, concatenated. Also returns the documents' UTF-8 bytes.
std::vector<int32_t> tokenize_text_file(const std::string& path, const Tokenizer& tok,
                                        int64_t& bytes) {
    const std::string text = read_file(path);
    CorpusStats stats;
    const std::vector<std::string> docs = split_documents(text, CorpusFormat::Auto, &stats, path);
    if (docs.empty()) throw Error(path + ": no documents to score (empty file?)");
    std::vector<int32_t> tokens, piece;
    bytes = 0;
    for (const std::string& doc : docs) {
        tokens.push_back(tok.bos_id());
        tok.encode(doc, piece);
        tokens.insert(tokens.end(), piece.begin(), piece.end());
        bytes += static_cast<int64_t>(doc.size());
    }
    if (stats.invalid_utf8 > 0)
        std::fprintf(stderr, "%s: skipped %lld documents with invalid UTF-8\n", path.c_str(),
                     static_cast<long long>(stats.invalid_utf8));
    return tokens;
}

void add_eval_command(CLI::App& app, CommonOptions& common) {
    struct Options {
        std::string model, tokens, data, split = "val", text_file;
        BackendChoice backend;
        WeightsChoice weights;
        bool json = false;
    };
    auto opts = std::make_shared<Options>();
    CLI::App* sub = app.add_subcommand(
        "eval",
        "Mean next-token cross-entropy, perplexity (and bits per byte for text) of a checkpoint");
    sub->add_option("--model", opts->model, "Checkpoint directory")->required();
    auto* tokens = sub->add_option("--tokens", opts->tokens,
                                   "Comma-separated token ids, e.g. 1,415,2217,29889");
    auto* data = sub->add_option("--data", opts->data, "Token dataset directory (tmx prepare)");
    sub->add_option("--split", opts->split, "Split of --data to score: val or train")
        ->check(CLI::IsMember({"val", "train"}))
        ->capture_default_str();
    auto* text = sub->add_option("--text-file", opts->text_file,
                                 "Text file: documents split as tmx prepare splits them, scored "
                                 "with the checkpoint's tokenizer; reports bits per byte")
                     ->check(CLI::ExistingFile);
    tokens->excludes(data)->excludes(text);
    data->excludes(text);
    add_backend_options(*sub, opts->backend);
    add_weights_option(*sub, opts->weights);
    sub->add_flag("--json", opts->json, "Print one JSON object");
    add_common_options(*sub, common);
    sub->callback([opts]() {
        if (opts->tokens.empty() && opts->data.empty() && opts->text_file.empty())
            throw UsageError("give what to score: --tokens, --data or --text-file");
        auto backend = opts->backend.open();
        auto model = opts->weights.load(opts->model, *backend);
        const ModelConfig& c = model->config();
        std::vector<int32_t> tokens;
        int64_t bytes = 0;
        if (!opts->tokens.empty()) {
            tokens = parse_id_list(opts->tokens, "--tokens", c.vocab_size);
            if (tokens.size() < 2) throw UsageError("--tokens: need at least 2 tokens to score");
        } else if (!opts->data.empty()) {
            TokenDataset d = open_dataset(opts->data, opts->split);
            if (static_cast<int64_t>(d.vocab_size()) != c.vocab_size)
                throw Error(opts->data + ": its tokens use a vocabulary of " +
                            std::to_string(d.vocab_size()) + " but the model's vocab_size is " +
                            std::to_string(c.vocab_size));
            tokens = d.to_vector();
        } else {
            const std::string tok_path = checkpoint_tokenizer(opts->model);
            if (tok_path.empty())
                throw Error(opts->model +
                            ": the checkpoint has no tokenizer.model or tokenizer.json (needed to "
                            "score text; add one with tmx init --tokenizer)");
            Tokenizer tok = Tokenizer::load(tok_path);
            if (tok.vocab_size() != c.vocab_size)
                throw Error(tok_path + ": the tokenizer has " + std::to_string(tok.vocab_size()) +
                            " pieces but the model's vocab_size is " +
                            std::to_string(c.vocab_size));
            tokens = tokenize_text_file(opts->text_file, tok, bytes);
        }
        TokenScore s = score_tokens(*model, tokens, c.max_seq_len);
        const double loss = s.total_nats / static_cast<double>(s.tokens);
        // The backend and precision: a bf16 loss differs from the fp32 one a run reported.
        nlohmann::json j = {{"loss", loss},
                            {"ppl", std::exp(loss)},
                            {"tokens", s.tokens},
                            {"backend", backend->name()},
                            {"precision", to_string(backend->matmul_precision())}};
        if (bytes > 0) {
            j["bytes"] = bytes;
            j["bits_per_byte"] = s.total_nats / std::log(2.0) / static_cast<double>(bytes);
        }
        if (opts->json) {
            std::printf("%s\n", j.dump().c_str());
        } else {
            std::printf("loss %.6f  ppl %.4f  tokens %lld", loss, std::exp(loss),
                        static_cast<long long>(s.tokens));
            if (bytes > 0)
                std::printf("  bytes %lld  bits/byte %.4f", static_cast<long long>(bytes),
                            j["bits_per_byte"].get<double>());
            std::printf("\n");
        }
    });
}

}  // namespace tmx::cli

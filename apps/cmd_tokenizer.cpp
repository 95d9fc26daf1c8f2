// tmx tokenizer: train a SentencePiece BPE tokenizer on a corpus; encode, decode, inspect (a
// SentencePiece model or a tokenizer.json).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "apps/commands.h"
#include "engine/core/errors.h"
#include "engine/core/file_io.h"
#include "engine/core/sha256.h"
#include "engine/core/threads.h"
#include "engine/data/corpus.h"
#include "engine/data/token_shards.h"
#include "engine/data/tokenizer.h"

namespace tmx::cli {
namespace {

std::string format_bytes(double b) {
    char buf[64];
    if (b >= 1e9)
        std::snprintf(buf, sizeof buf, "%.2f GB", b / 1e9);
    else if (b >= 1e6)
        std::snprintf(buf, sizeof buf, "%.1f MB", b / 1e6);
    else
        std::snprintf(buf, sizeof buf, "%.1f KB", b / 1e3);
    return buf;
}

void add_train(CLI::App& parent, CommonOptions& common) {
    struct Options {
        CorpusOptions corpus;
        int vocab_size = 0;
        std::string out;
        int64_t max_sentences = 1'000'000;
        double character_coverage = 0.9995;
        bool force = false, verbose = false;
    };
    auto opts = std::make_shared<Options>();
    CLI::App* sub = parent.add_subcommand(
        "train", "Train a byte-fallback BPE SentencePiece tokenizer on text files");
    add_corpus_options(*sub, opts->corpus);
    sub->add_option("--vocab-size", opts->vocab_size, "Number of pieces, e.g. 512 or 4096")
        ->required()
        ->check(in_range(1, INT32_MAX));
    sub->add_option("--out", opts->out, "SentencePiece model file to write, e.g. tok.model")
        ->required();
    sub->add_option("--max-sentences", opts->max_sentences,
                    "Lines sampled from the whole corpus for training (bounds memory)")
        ->check(in_range<int64_t>(1))
        ->capture_default_str();
    sub->add_option("--character-coverage", opts->character_coverage,
                    "Share of characters that get their own piece; the rest use byte fallback")
        ->check(CLI::Range(0.9, 1.0))
        ->capture_default_str();
    sub->add_flag("--force", opts->force, "Replace an existing --out file");
    sub->add_flag("--verbose", opts->verbose, "Show SentencePiece's own training log");
    add_common_options(*sub, common);
    sub->callback([opts]() {
        TokenizerTrainOptions o;
        o.max_sentences = opts->max_sentences;
        o.format = parse_corpus_format(opts->corpus.format);
        o.character_coverage = opts->character_coverage;
        o.overwrite = opts->force;
        o.verbose = opts->verbose;
        const bool tty = ::isatty(STDERR_FILENO);
        std::fprintf(stderr, "training a %d-piece BPE tokenizer on %d threads\n", opts->vocab_size,
                     num_threads());
        // Reading the corpus is the long part on a big corpus; then SentencePiece learns the
        // merges from its sample. On a terminal, a line updated in place; otherwise a line now
        // and then.
        struct State {
            bool finished = false;
            double last = 0;
            std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
        };
        auto state = std::make_shared<State>();
        o.progress = [state, tty](uint64_t done, uint64_t total) {
            if (state->finished) return;
            const double t =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - state->t0).count();
            const bool end = done >= total;
            if (!tty && !end && t - state->last < 30.0) return;
            state->last = t;
            std::fprintf(
                stderr, "%sreading corpus: %s / %s (%.0f%%)%s", tty ? "\r" : "",
                format_bytes(static_cast<double>(done)).c_str(),
                format_bytes(static_cast<double>(total)).c_str(),
                total ? 100.0 * static_cast<double>(done) / static_cast<double>(total) : 100.0,
                tty ? "   " : "\n");
            if (end) {
                std::fprintf(stderr, "%slearning merges...\n", tty ? "\n" : "");
                state->finished = true;
            }
        };
        TokenizerTrainReport r;
        try {
            r = train_tokenizer(opts->corpus.inputs, opts->vocab_size, opts->out, o);
        } catch (const VocabSizeError& e) {
            if (e.largest > 0)
                throw UsageError("--vocab-size " + std::to_string(e.requested) +
                                 " is too large for this corpus; the largest that works is " +
                                 std::to_string(e.largest));
            throw UsageError("--vocab-size " + std::to_string(e.requested) +
                             " is too small for this corpus; it needs at least " +
                             std::to_string(e.smallest) +
                             " (256 byte pieces, 3 special pieces and its characters)");
        }
        std::printf("wrote %s: %d pieces (BPE, byte fallback; unk=0 bos=1 eos=2)\n",
                    opts->out.c_str(), r.vocab_size);
        std::printf("corpus: %lld documents, %s, %lld lines (at most %lld sampled) in %.1f s\n",
                    static_cast<long long>(r.corpus.documents),
                    format_bytes(static_cast<double>(r.corpus.bytes)).c_str(),
                    static_cast<long long>(r.sentences),
                    static_cast<long long>(opts->max_sentences), r.seconds);
        if (r.corpus.invalid_utf8 > 0)
            std::printf("skipped %lld documents with invalid UTF-8\n",
                        static_cast<long long>(r.corpus.invalid_utf8));
    });
}

void add_encode(CLI::App& parent, CommonOptions& common) {
    struct Options {
        std::string tokenizer, text, file;
        bool pieces = false, bos = false;
    };
    auto opts = std::make_shared<Options>();
    CLI::App* sub = parent.add_subcommand("encode", "Print the token ids of a text");
    sub->add_option("--tokenizer", opts->tokenizer,
                    "SentencePiece .model file or tokenizer.json (or a checkpoint directory)")
        ->required();
    auto* text = sub->add_option("--text", opts->text, "Text to encode");
    auto* file = sub->add_option("--file", opts->file, "File whose whole contents to encode")
                     ->check(CLI::ExistingFile);
    text->excludes(file);
    sub->add_flag("--pieces", opts->pieces, "Print the pieces (space-separated) instead of ids");
    sub->add_flag("--bos", opts->bos, "Start with the BOS id, as documents in a dataset do");
    add_common_options(*sub, common);
    sub->callback([opts, text, file]() {
        if (text->count() == 0 && file->count() == 0)
            throw UsageError("tokenizer encode: give --text or --file");
        Tokenizer tok = Tokenizer::load(opts->tokenizer);
        const std::string input = file->count() ? read_file(opts->file) : opts->text;
        std::vector<int32_t> ids = tok.encode(input);
        if (opts->bos && tok.bos_id() >= 0) ids.insert(ids.begin(), tok.bos_id());
        std::string line;
        for (size_t i = 0; i < ids.size(); ++i) {
            if (i) line += opts->pieces ? " " : ",";
            line += opts->pieces ? tok.piece(ids[i]) : std::to_string(ids[i]);
        }
        std::printf("%s\n", line.c_str());
    });
}

void add_decode(CLI::App& parent, CommonOptions& common) {
    struct Options {
        std::string tokenizer, ids;
    };
    auto opts = std::make_shared<Options>();
    CLI::App* sub = parent.add_subcommand("decode", "Print the text of token ids");
    sub->add_option("--tokenizer", opts->tokenizer,
                    "SentencePiece .model file or tokenizer.json (or a checkpoint directory)")
        ->required();
    sub->add_option("--ids", opts->ids, "Comma-separated token ids, e.g. 1,15043,3186")->required();
    add_common_options(*sub, common);
    sub->callback([opts]() {
        Tokenizer tok = Tokenizer::load(opts->tokenizer);
        const std::vector<int32_t> ids = parse_id_list(opts->ids, "--ids", tok.vocab_size());
        std::printf("%s\n", tok.decode(ids).c_str());
    });
}

void add_info(CLI::App& parent, CommonOptions& common) {
    auto path = std::make_shared<std::string>();
    CLI::App* sub = parent.add_subcommand("info", "Describe a tokenizer");
    sub->add_option("--tokenizer", *path,
                    "SentencePiece .model file or tokenizer.json (or a checkpoint directory)")
        ->required();
    add_common_options(*sub, common);
    sub->callback([path]() {
        Tokenizer tok = Tokenizer::load(*path);
        const std::string bytes = read_file(tok.path());
        std::printf("tokenizer   %s (%s)\n", tok.path().c_str(),
                    tok.is_sentencepiece() ? "SentencePiece" : "tokenizer.json");
        std::printf("vocab size  %d\n", tok.vocab_size());
        std::printf("special     unk=%d bos=%d eos=%d pad=%d\n", tok.unk_id(), tok.bos_id(),
                    tok.eos_id(), tok.pad_id());
        std::printf("byte pieces %d%s\n", tok.byte_pieces(),
                    tok.byte_pieces() == 256 ? " (byte fallback)" : "");
        std::printf("sha256      %s\n", sha256_hex(bytes).c_str());
    });
}

}  // namespace

void add_tokenizer_command(CLI::App& app, CommonOptions& common) {
    CLI::App* sub = app.add_subcommand(
        "tokenizer",
        "Train SentencePiece tokenizers; inspect and apply them and tokenizer.json files");
    sub->require_subcommand(1);
    add_train(*sub, common);
    add_encode(*sub, common);
    add_decode(*sub, common);
    add_info(*sub, common);
}

}  // namespace tmx::cli

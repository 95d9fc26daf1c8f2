// tmx prepare: tokenize a text corpus into a token dataset (shards + meta.json).
#include <unistd.h>

#include <cstdio>
#include <memory>

#include "apps/commands.h"
#include "engine/core/errors.h"
#include "engine/core/threads.h"
#include "engine/data/corpus.h"
#include "engine/data/prepare.h"
#include "engine/data/token_shards.h"

namespace tmx::cli {
namespace {

std::string with_commas(uint64_t v) {
    const std::string digits = std::to_string(v);
    std::string s;
    for (size_t i = 0; i < digits.size(); ++i) {
        if (i > 0 && (digits.size() - i) % 3 == 0) s.push_back(',');
        s.push_back(digits[i]);
    }
    return s;
}

std::string human(double v, const char* unit) {
    char buf[64];
    if (v >= 1e9)
        std::snprintf(buf, sizeof buf, "%.2f G%s", v / 1e9, unit);
    else if (v >= 1e6)
        std::snprintf(buf, sizeof buf, "%.1f M%s", v / 1e6, unit);
    else if (v >= 1e3)
        std::snprintf(buf, sizeof buf, "%.1f K%s", v / 1e3, unit);
    else
        std::snprintf(buf, sizeof buf, "%.0f %s", v, unit);
    return buf;
}

std::string progress_line(const PrepareProgress& p) {
    const double pct = p.total_bytes ? 100.0 * static_cast<double>(p.bytes_read) /
                                           static_cast<double>(p.total_bytes)
                                     : 100.0;
    const double rate = p.seconds > 0 ? static_cast<double>(p.bytes_read) / p.seconds : 0.0;
    char buf[256];
    std::snprintf(buf, sizeof buf, "prepare: %5.1f%%  %s / %s  %s docs  %s tokens  %s/s", pct,
                  human(static_cast<double>(p.bytes_read), "B").c_str(),
                  human(static_cast<double>(p.total_bytes), "B").c_str(),
                  with_commas(static_cast<uint64_t>(p.documents)).c_str(),
                  human(static_cast<double>(p.tokens), "").c_str(), human(rate, "B").c_str());
    std::string s = buf;
    if (rate > 0 && p.bytes_read < p.total_bytes) {
        std::snprintf(buf, sizeof buf, "  ETA %.0f s",
                      static_cast<double>(p.total_bytes - p.bytes_read) / rate);
        s += buf;
    }
    return s;
}

}  // namespace

void add_prepare_command(CLI::App& app, CommonOptions& common) {
    struct Options {
        CorpusOptions corpus;
        std::string tokenizer, out;
        double val_fraction = 0.01;
        uint64_t shard_tokens = kDefaultShardTokens;
        bool force = false, quiet = false;
    };
    auto opts = std::make_shared<Options>();
    CLI::App* sub = app.add_subcommand(
        "prepare", "Tokenize text files into a token dataset (train/val shards + meta.json)");
    add_corpus_options(*sub, opts->corpus);
    sub->add_option(
           "--tokenizer", opts->tokenizer,
           "SentencePiece .model file or tokenizer.json (or a checkpoint directory holding one)")
        ->required();
    sub->add_option("--out", opts->out, "Dataset directory to write")->required();
    sub->add_option("--val-fraction", opts->val_fraction,
                    "Share of documents put in the val split (every k-th document; 0: none)")
        ->check(CLI::Range(0.0, 1.0))
        ->capture_default_str();
    sub->add_option("--shard-tokens", opts->shard_tokens, "Most tokens in one shard file")
        ->check(in_range<uint64_t>(1))
        ->capture_default_str();
    sub->add_flag("--force", opts->force, "Replace an existing dataset in --out");
    sub->add_flag("--quiet", opts->quiet, "No progress on stderr");
    add_common_options(*sub, common);
    sub->callback([opts]() {
        PrepareOptions o;
        o.inputs = opts->corpus.inputs;
        o.tokenizer = opts->tokenizer;
        o.out_dir = opts->out;
        o.val_fraction = opts->val_fraction;
        o.format = parse_corpus_format(opts->corpus.format);
        o.overwrite = opts->force;
        o.max_shard_tokens = opts->shard_tokens;

        const bool tty = ::isatty(STDERR_FILENO);
        double last_line = 0;
        bool drew = false;
        auto progress = [&](const PrepareProgress& p) {
            if (opts->quiet) return;
            if (tty) {
                std::fprintf(stderr, "\r%-100s", progress_line(p).c_str());
                std::fflush(stderr);
                drew = true;
            } else if (p.seconds - last_line >= 15.0) {
                std::fprintf(stderr, "%s\n", progress_line(p).c_str());
                last_line = p.seconds;
            }
        };
        if (!opts->quiet)
            std::fprintf(stderr, "prepare: tokenizing on %d threads\n", num_threads());
        PrepareReport r;
        try {
            r = prepare_dataset(o, progress);
        } catch (...) {
            if (drew) std::fprintf(stderr, "\n");
            throw;
        }
        if (drew) std::fprintf(stderr, "\n");

        const uint64_t tokens = r.train.tokens + r.val.tokens;
        const int64_t docs = r.train.documents + r.val.documents;
        std::printf(
            "wrote %s: %s documents, %s tokens (vocab %d, %s tokens)\n", opts->out.c_str(),
            with_commas(static_cast<uint64_t>(docs)).c_str(), with_commas(tokens).c_str(),
            r.vocab_size,
            bytes_per_token_for(static_cast<uint64_t>(r.vocab_size)) == 2 ? "uint16" : "uint32");
        auto split_line = [](const char* name, const DatasetSplitInfo& s) {
            std::printf("  %-5s %14s documents %16s tokens  %zu shard%s\n", name,
                        with_commas(static_cast<uint64_t>(s.documents)).c_str(),
                        with_commas(s.tokens).c_str(), s.shards.size(),
                        s.shards.size() == 1 ? "" : "s");
        };
        split_line("train", r.train);
        split_line("val", r.val);
        if (r.corpus.invalid_utf8 > 0)
            std::printf("skipped %s documents with invalid UTF-8\n",
                        with_commas(static_cast<uint64_t>(r.corpus.invalid_utf8)).c_str());
        else
            std::printf("skipped no documents\n");
        std::string formats;
        for (const CorpusFileInfo& f : r.files) {
            std::string fmt = to_string(f.format);
            if (formats.find(fmt) == std::string::npos)
                formats += (formats.empty() ? "" : ", ") + fmt;
        }
        const double secs = r.seconds > 0 ? r.seconds : 1e-9;
        std::printf("read %s from %zu file%s (%s) in %.1f s: %s/s, %s tokens/s\n",
                    human(static_cast<double>(r.corpus.bytes), "B").c_str(), r.files.size(),
                    r.files.size() == 1 ? "" : "s", formats.c_str(), r.seconds,
                    human(static_cast<double>(r.corpus.bytes) / secs, "B").c_str(),
                    human(static_cast<double>(tokens) / secs, "").c_str());
    });
}

}  // namespace tmx::cli

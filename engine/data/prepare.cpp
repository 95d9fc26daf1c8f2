// The prepare pipeline behind `tmx prepare`: DatasetWriter (documents to shards, splits and
// meta.json, moved into place whole) and prepare_dataset (corpus -> tokenizer -> DatasetWriter).
#include "engine/data/prepare.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <future>
#include <mutex>
#include <nlohmann/json.hpp>
#include <utility>

#include "engine/core/errors.h"
#include "engine/core/file_io.h"
#include "engine/core/sha256.h"
#include "engine/data/tokenizer.h"
#include "engine/model/checkpoint.h"

namespace tmx {
namespace fs = std::filesystem;

namespace {

std::string shard_name(Split split, size_t index) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%s_%06zu.bin", to_string(split), index);
    return buf;
}

nlohmann::json split_to_json(const DatasetSplitInfo& s) {
    return {{"documents", s.documents}, {"tokens", s.tokens}, {"shards", s.shards}};
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// DatasetWriter

DatasetWriter::DatasetWriter(const std::string& dir, uint64_t vocab_size,
                             DatasetWriterOptions options)
    : vocab_size_(vocab_size), options_(options) {
    if (options_.max_shard_tokens == 0) throw UsageError("shard size must be at least 1 token");
    fs::path d = fs::absolute(dir).lexically_normal();
    if (d.filename().empty()) d = d.parent_path();  // "out/" -> "out"
    dir_ = d.string();
    std::error_code ec;
    if (fs::exists(d, ec)) {
        if (!fs::is_directory(d, ec)) throw Error(dir + ": exists and is not a directory");
        if (!fs::is_empty(d, ec)) {
            if (!is_dataset_dir(dir_))
                throw Error(dir +
                            ": exists, is not empty and is not a token dataset (no "
                            "meta.json); refusing to write into it");
            if (!options_.overwrite)
                throw Error(dir + ": a dataset already exists there (use " + opt("overwrite") +
                            " to replace it)");
        }
    }
    fs::create_directories(d.parent_path(), ec);
    tmp_ = dir_ + ".tmp-" + std::to_string(::getpid());
    fs::remove_all(tmp_, ec);
    if (!fs::create_directory(tmp_, ec) || ec)
        throw Error(tmp_ + ": cannot create directory: " + ec.message());
}

DatasetWriter::~DatasetWriter() {
    if (committed_) return;
    train_part_.writer.reset();
    val_part_.writer.reset();
    std::error_code ec;
    fs::remove_all(tmp_, ec);
}

void DatasetWriter::close_shard(Part& p) {
    if (!p.writer) return;
    p.writer->close();
    p.writer.reset();
}

void DatasetWriter::add_document(Split split, const int32_t* tokens, size_t n) {
    begin_document(split);
    append(tokens, n);
    end_document();
}

void DatasetWriter::begin_document(Split split) {
    if (document_) throw Error(dir_ + ": internal error: a document is already open");
    Part& p = part(split);
    const size_t shards = p.info->shards.size();
    // The first token goes to the open shard, or else to the next one.
    document_ = p.writer ? OpenDocument{split, shards - 1, p.writer->token_count(), p.info->tokens}
                         : OpenDocument{split, shards, 0, p.info->tokens};
}

void DatasetWriter::append(const int32_t* tokens, size_t n) {
    if (!document_) throw Error(dir_ + ": internal error: no document is open");
    Part& p = part(document_->split);
    while (n > 0) {
        if (!p.writer) {
            std::string name = shard_name(document_->split, p.info->shards.size());
            p.writer = std::make_unique<ShardWriter>((fs::path(tmp_) / name).string(), vocab_size_);
            p.info->shards.push_back(name);
        }
        const uint64_t room = options_.max_shard_tokens - p.writer->token_count();
        const size_t take = static_cast<size_t>(std::min<uint64_t>(room, n));
        p.writer->append(tokens, take);
        tokens += take;
        n -= take;
        p.info->tokens += take;
        if (p.writer->token_count() >= options_.max_shard_tokens) close_shard(p);
    }
}

void DatasetWriter::end_document() {
    if (!document_) throw Error(dir_ + ": internal error: no document is open");
    ++part(document_->split).info->documents;
    document_.reset();
}

void DatasetWriter::discard_document() {
    if (!document_) throw Error(dir_ + ": internal error: no document is open");
    const OpenDocument d = *document_;
    document_.reset();
    Part& p = part(d.split);
    // Remove the shards the document began (the open one, if any, is the last), then cut the
    // shard it started in back to where it started.
    const size_t keep = d.shard_start > 0 ? d.shard + 1 : d.shard;
    while (p.info->shards.size() > keep) {
        const std::string path = (fs::path(tmp_) / p.info->shards.back()).string();
        if (p.writer)
            p.writer.reset();  // an unclosed writer removes its temporary file
        else if (::unlink(path.c_str()) != 0)
            throw Error(path + ": cannot remove: " + std::strerror(errno));
        p.info->shards.pop_back();
    }
    if (d.shard_start > 0) {
        if (p.writer)
            p.writer->truncate(d.shard_start);
        else
            p.writer = ShardWriter::reopen((fs::path(tmp_) / p.info->shards.back()).string(),
                                           vocab_size_, d.shard_start);
    }
    p.info->tokens = d.split_tokens;
}

void DatasetWriter::add_file(const std::string& name, std::string_view bytes) {
    write_file_atomic((fs::path(tmp_) / name).string(), bytes);
}

void DatasetWriter::commit(const nlohmann::json& meta) {
    if (committed_) throw Error(dir_ + ": dataset already committed");
    if (document_) throw Error(dir_ + ": internal error: a document is still open");
    close_shard(train_part_);
    close_shard(val_part_);
    nlohmann::json j = meta.is_object() ? meta : nlohmann::json::object();
    j["format"] = kDatasetFormat;
    j["version"] = kDatasetVersion;
    j["vocab_size"] = vocab_size_;
    j["bytes_per_token"] = bytes_per_token_for(vocab_size_);
    j["documents"] = train_.documents + val_.documents;
    j["tokens"] = train_.tokens + val_.tokens;
    j["splits"] = {{"train", split_to_json(train_)}, {"val", split_to_json(val_)}};
    j["max_shard_tokens"] = options_.max_shard_tokens;
    write_file_atomic((fs::path(tmp_) / "meta.json").string(), j.dump(2) + "\n");
    const std::string previous =
        replace_directory(tmp_, dir_, "dataset", WithoutExchange::MoveAside);
    committed_ = true;
    std::error_code ec;
    if (!previous.empty()) fs::remove_all(previous, ec);  // the old dataset
}

// ---------------------------------------------------------------------------------------------
// prepare

bool is_validation_document(int64_t index, double fraction) {
    if (fraction <= 0) return false;
    if (fraction >= 1) return true;
    const double i = static_cast<double>(index);
    return std::floor((i + 1) * fraction) > std::floor(i * fraction);
}

PrepareReport prepare_dataset(const PrepareOptions& options,
                              const std::function<void(const PrepareProgress&)>& progress) {
    const auto t0 = std::chrono::steady_clock::now();
    auto elapsed = [&] {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    if (!(options.val_fraction >= 0.0 && options.val_fraction <= 1.0))
        throw UsageError(opt("val_fraction") + " must be between 0 and 1, got " +
                         std::to_string(options.val_fraction));
    if (options.inputs.empty()) throw UsageError("no input files given");

    Tokenizer tok = Tokenizer::load(options.tokenizer);
    const int32_t bos = tok.bos_id();
    if (bos < 0) throw Error(tok.path() + ": the tokenizer has no BOS piece");
    // The tokenizer's files as the dataset keeps them (tokenizer.model; or tokenizer.json and
    // its tokenizer_config.json), the first being the tokenizer itself.
    std::vector<std::pair<std::string, std::string>> tok_files;  // name, bytes
    for (const auto& [name, source] : tokenizer_files(tok.path()))
        tok_files.emplace_back(name, read_file(source));
    const std::string& tok_bytes = tok_files.front().second;

    // Open the inputs and the output before the long part, so mistakes fail at once.
    CorpusReader reader(options.inputs, CorpusReaderOptions{options.format, options.chunk_bytes});
    DatasetWriter writer(options.out_dir, static_cast<uint64_t>(tok.vocab_size()),
                         DatasetWriterOptions{options.overwrite, options.max_shard_tokens});

    PrepareProgress prog;
    prog.total_bytes = reader.total_bytes();
    std::vector<DocumentPiece> pieces, next_pieces;
    std::vector<std::vector<int32_t>> encoded;
    int64_t index = 0;  // of the next document kept
    bool more = reader.next(pieces);
    while (more) {
        // Read the next chunk while this one is tokenized.
        auto next = std::async(std::launch::async, [&] { return reader.next(next_pieces); });
        encoded.clear();  // not only emptied: a long piece's capacity is not kept
        encoded.resize(pieces.size());
        std::exception_ptr error;
        std::mutex error_mutex;
        const auto n = static_cast<int64_t>(pieces.size());
#pragma omp parallel for schedule(dynamic, 1)
        for (int64_t i = 0; i < n; ++i) {
            try {
                const DocumentPiece& piece = pieces[static_cast<size_t>(i)];
                std::vector<int32_t>& out = encoded[static_cast<size_t>(i)];
                if (piece.cancel) continue;
                if (piece.first) {
                    tok.encode(piece.text, out);
                    out.insert(out.begin(), bos);
                } else {
                    tok.encode_continuation(piece.text, out);
                }
            } catch (...) {
                std::lock_guard<std::mutex> lock(error_mutex);
                if (!error) error = std::current_exception();
            }
        }
        if (error) {
            next.wait();
            std::rethrow_exception(error);
        }
        for (size_t i = 0; i < pieces.size(); ++i) {
            const DocumentPiece& piece = pieces[i];
            if (piece.cancel) {
                writer.discard_document();
                continue;
            }
            if (piece.first)
                writer.begin_document(is_validation_document(index, options.val_fraction)
                                          ? Split::Val
                                          : Split::Train);
            writer.append(encoded[i].data(), encoded[i].size());
            if (piece.last) {
                writer.end_document();
                ++index;
            }
        }
        prog.documents = index;
        prog.tokens = writer.info(Split::Train).tokens + writer.info(Split::Val).tokens;
        more = next.get();
        std::swap(pieces, next_pieces);
        if (progress) {
            prog.bytes_read = reader.bytes_read();
            prog.seconds = elapsed();
            progress(prog);
        }
    }

    PrepareReport report;
    report.corpus = reader.stats();
    report.files = reader.files();
    report.vocab_size = tok.vocab_size();

    nlohmann::json inputs = nlohmann::json::array();
    for (const CorpusFileInfo& f : report.files)
        inputs.push_back({{"path", fs::absolute(f.path).lexically_normal().string()},
                          {"format", to_string(f.format)},
                          {"bytes", f.bytes},
                          {"documents", f.stats.documents},
                          {"skipped_invalid_utf8", f.stats.invalid_utf8}});
    nlohmann::json meta = {
        {"created_by", std::string("tmx ") + TMX_VERSION},
        {"bos_id", bos},
        {"eos_id", tok.eos_id()},
        {"tokenizer",
         {{"file", tok_files.front().first},
          {"source", fs::absolute(tok.path()).lexically_normal().string()},
          {"sha256", sha256_hex(tok_bytes)},
          {"bytes", tok_bytes.size()}}},
        {"val_fraction", options.val_fraction},
        {"bytes", report.corpus.bytes},
        {"skipped", {{"invalid_utf8", report.corpus.invalid_utf8}}},
        {"inputs", inputs},
    };
    for (const auto& [name, bytes] : tok_files) writer.add_file(name, bytes);
    writer.commit(meta);
    report.train = writer.info(Split::Train);
    report.val = writer.info(Split::Val);
    report.seconds = elapsed();
    return report;
}

}  // namespace tmx

// The prepare pipeline behind `tmx prepare` (corpus -> tokenizer -> shards): DatasetWriter,
// which writes a token dataset (engine/data/dataset.h), and prepare_dataset.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/data/corpus.h"
#include "engine/data/dataset.h"
#include "engine/data/token_shards.h"

namespace tmx {

// The default of the most tokens in one shard (max_shard_tokens, `tmx prepare --shard-tokens`).
inline constexpr uint64_t kDefaultShardTokens = 100'000'000;

struct DatasetWriterOptions {
    bool overwrite = false;  // replace an existing dataset in the directory
    uint64_t max_shard_tokens = kDefaultShardTokens;
};

// Builds a dataset in a temporary sibling directory and moves it into place at commit(); until
// then (and if commit is never reached) an existing dataset is untouched. Refuses a non-empty
// directory that is not a dataset, and an existing dataset unless options.overwrite.
class DatasetWriter {
  public:
    DatasetWriter(const std::string& dir, uint64_t vocab_size, DatasetWriterOptions options = {});
    ~DatasetWriter();
    DatasetWriter(const DatasetWriter&) = delete;
    DatasetWriter& operator=(const DatasetWriter&) = delete;

    void add_document(Split split, const int32_t* tokens, size_t n);
    // A document streamed in parts: begin_document, then append as its tokens come, then
    // end_document, or discard_document to take back everything appended since begin (a
    // document found invalid after some of it was written; shards it filled are reopened).
    void begin_document(Split split);
    void append(const int32_t* tokens, size_t n);
    void end_document();
    void discard_document();
    // Writes an extra file into the dataset (e.g. tokenizer.model).
    void add_file(const std::string& name, std::string_view bytes);
    // Writes meta.json (`meta` plus the fields the writer owns: format, version, vocab_size,
    // bytes_per_token, documents, tokens, splits, max_shard_tokens) and moves the directory
    // into place.
    void commit(const nlohmann::json& meta);

    const DatasetSplitInfo& info(Split split) const {
        return split == Split::Train ? train_ : val_;
    }
    const std::string& dir() const { return dir_; }

  private:
    struct Part {
        DatasetSplitInfo* info;
        std::unique_ptr<ShardWriter> writer;
    };
    Part& part(Split split) { return split == Split::Train ? train_part_ : val_part_; }
    void close_shard(Part& p);
    // The document being written: its split, and where its first token went.
    struct OpenDocument {
        Split split = Split::Train;
        size_t shard = 0;          // index in the split's shards
        uint64_t shard_start = 0;  // tokens of that shard before the document
        uint64_t split_tokens = 0;
    };

    std::string dir_, tmp_;
    uint64_t vocab_size_;
    DatasetWriterOptions options_;
    DatasetSplitInfo train_, val_;
    Part train_part_{&train_, nullptr}, val_part_{&val_, nullptr};
    std::optional<OpenDocument> document_;
    bool committed_ = false;
};

// The validation rule of `tmx prepare`: document `index` (0-based, in input order, counting
// only documents kept) goes to val when floor((index + 1) * fraction) > floor(index * fraction).
// fraction 0.01 puts documents 99, 199, 299, ... in val; 0 none; 1 all.
bool is_validation_document(int64_t index, double fraction);

struct PrepareOptions {
    std::vector<std::string> inputs;
    // A .model file, a tokenizer.json, or a directory holding either (a checkpoint).
    std::string tokenizer;
    std::string out_dir;
    double val_fraction = 0.01;
    CorpusFormat format = CorpusFormat::Auto;
    bool overwrite = false;
    uint64_t max_shard_tokens = kDefaultShardTokens;
    // Corpus read size: one batch of document pieces. Small, so that a batch of tiny
    // documents (tens of bytes of bookkeeping each) stays small too.
    size_t chunk_bytes = size_t{1} << 20;
};

// The memory prepare_dataset adds to the program's own (peak resident set above what tmx takes
// at start-up, doing nothing), whatever the documents' sizes: kPrepareMemoryBytes, plus
// kPrepareMemoryPerThreadBytes per tokenizing thread. The first covers the tokenizer (a few MB
// for a 32k vocabulary), two batches of pieces (PrepareOptions::chunk_bytes of text each, plus
// about 40 bytes per piece: a batch of tiny documents costs ~30x its text) and their ids, and
// two shard buffers; the second, one SentencePiece encoding of a kMaxDocumentPieceBytes piece
// (~100 bytes per byte). Measured peaks (CPU-only build, start-up included): 25-34 MB for a 20 MB
// document on 1-2 threads, 85 MB on 8; 80-88 MB for 20 MB of 1-byte documents. The start-up size
// is not part of the bound: it depends on the build (a few MB, over 200 MB when the CUDA
// backend's libraries are linked). tests/apps/prepare_cli_test.cpp checks it on a 4 MB document.
inline constexpr uint64_t kPrepareMemoryBytes = uint64_t{128} << 20;
inline constexpr uint64_t kPrepareMemoryPerThreadBytes = uint64_t{16} << 20;

struct PrepareProgress {
    uint64_t bytes_read = 0, total_bytes = 0;
    int64_t documents = 0;
    uint64_t tokens = 0;
    double seconds = 0;
};

struct PrepareReport {
    DatasetSplitInfo train, val;
    CorpusStats corpus;                 // documents kept, bytes read, documents skipped
    std::vector<CorpusFileInfo> files;  // per input: detected format, bytes, documents
    int32_t vocab_size = 0;
    double seconds = 0;
};

// Reads the inputs, tokenizes the documents on all tmx::num_threads() threads (output order is
// the input order whatever the thread count), prefixes each with BOS, assigns it to train or
// val by is_validation_document, and writes the dataset. `progress` is called after each batch.
// Streams: a document longer than kMaxDocumentPieceBytes is tokenized piece by piece
// (Tokenizer::encode_continuation), so memory does not grow with the documents' sizes; it adds
// at most kPrepareMemoryBytes plus kPrepareMemoryPerThreadBytes per thread to the program's own.
PrepareReport prepare_dataset(const PrepareOptions& options,
                              const std::function<void(const PrepareProgress&)>& progress = {});

}  // namespace tmx

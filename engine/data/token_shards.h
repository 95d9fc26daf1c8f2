// Token shards and token datasets (DESIGN §3), and `prepare_dataset`, the pipeline behind
// `tmx prepare` (corpus -> tokenizer -> shards).
//
// Shard file: a fixed 32-byte little-endian header, then the tokens.
//   bytes  0-7   magic "TMXTOKS1" (8 ASCII bytes, no NUL)
//   bytes  8-11  uint32 version = 1
//   bytes 12-15  uint32 bytes_per_token: 2 when vocab_size <= 65536, else 4
//   bytes 16-23  uint64 vocab_size
//   bytes 24-31  uint64 token_count
//   bytes 32-    token_count tokens, uint16 or uint32 little-endian
// The file size is exactly 32 + token_count * bytes_per_token.
//
// Dataset directory: DIR/meta.json, DIR/tokenizer.model (a copy of the tokenizer it was made
// with), DIR/train_NNNNNN.bin and DIR/val_NNNNNN.bin (numbered from 000000; each at most
// max_shard_tokens tokens). A split is the concatenation of its shards in order: one token
// stream in which every document starts with BOS.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/data/corpus.h"

namespace tmx {

inline constexpr char kTokenShardMagic[9] = "TMXTOKS1";  // the file holds the 8 chars only
inline constexpr uint32_t kTokenShardVersion = 1;
inline constexpr size_t kTokenShardHeaderBytes = 32;
inline constexpr uint64_t kDefaultShardTokens = 100'000'000;

// 2 when every id fits in uint16 (vocab_size <= 65536), else 4.
uint32_t bytes_per_token_for(uint64_t vocab_size);

// Writes one shard: streaming appends into a temporary file next to `path`; close() fills in
// the header, fsyncs and renames it into place. Destroying an unclosed writer removes the
// temporary file, so a failed run leaves no partial shard behind.
class ShardWriter {
  public:
    ShardWriter(std::string path, uint64_t vocab_size);
    // Reopens the closed shard at `path` for appending, keeping its first `keep_tokens`
    // tokens: it is moved back to a temporary file until close().
    static std::unique_ptr<ShardWriter> reopen(std::string path, uint64_t vocab_size,
                                               uint64_t keep_tokens);
    ~ShardWriter();
    ShardWriter(const ShardWriter&) = delete;
    ShardWriter& operator=(const ShardWriter&) = delete;

    // Throws tmx::Error naming the shard for a token outside [0, vocab_size).
    void append(const int32_t* tokens, size_t n);
    void append(const std::vector<int32_t>& tokens) { append(tokens.data(), tokens.size()); }
    // Drops every token after the first `count`.
    void truncate(uint64_t count);
    void close();

    const std::string& path() const { return path_; }
    uint64_t token_count() const { return count_; }

  private:
    void flush_buffer();
    uint64_t file_bytes(uint64_t tokens) const {
        return kTokenShardHeaderBytes + tokens * bytes_per_token_;
    }

    std::string path_, tmp_;
    uint64_t vocab_size_;
    uint32_t bytes_per_token_;
    uint64_t count_ = 0;
    int fd_ = -1;
    std::vector<unsigned char> buffer_;
};

// A shard opened read-only and memory-mapped. Opening validates the header and the file size
// (a truncated or padded file, a bad magic or an unknown version is a tmx::Error naming it).
class TokenShard {
  public:
    static TokenShard open(const std::string& path);
    TokenShard(TokenShard&& other) noexcept;
    TokenShard& operator=(TokenShard&& other) noexcept;
    ~TokenShard();

    const std::string& path() const { return path_; }
    uint64_t size() const { return count_; }  // tokens
    uint64_t vocab_size() const { return vocab_size_; }
    uint32_t bytes_per_token() const { return bytes_per_token_; }

    // Unchecked: i < size().
    int32_t operator[](uint64_t i) const {
        if (bytes_per_token_ == 2) {
            return static_cast<int32_t>(static_cast<uint32_t>(tokens_[2 * i]) |
                                        static_cast<uint32_t>(tokens_[2 * i + 1]) << 8);
        }
        const unsigned char* p = tokens_ + 4 * i;
        return static_cast<int32_t>(static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
                                    static_cast<uint32_t>(p[2]) << 16 |
                                    static_cast<uint32_t>(p[3]) << 24);
    }
    // Copies tokens [begin, begin + n); throws tmx::Error naming the shard when the range is
    // outside the shard or a token is outside [0, vocab_size) (a corrupt file).
    void copy_range(uint64_t begin, size_t n, int32_t* out) const;
    std::vector<int32_t> to_vector() const;

  private:
    TokenShard() = default;

    std::string path_;
    void* map_ = nullptr;
    size_t map_bytes_ = 0;
    const unsigned char* tokens_ = nullptr;
    uint64_t count_ = 0, vocab_size_ = 0;
    uint32_t bytes_per_token_ = 0;
};

// Writes a whole shard (tests, small tools).
void write_token_shard(const std::string& path, uint64_t vocab_size,
                       const std::vector<int32_t>& tokens);

enum class Split { Train, Val };
const char* to_string(Split split);

struct DatasetSplitInfo {
    int64_t documents = 0;
    uint64_t tokens = 0;
    std::vector<std::string> shards;  // file names inside the dataset directory
};

// What a dataset's meta.json says (the fields the engine uses; `json` holds all of it).
struct DatasetMeta {
    uint64_t vocab_size = 0;
    uint32_t bytes_per_token = 0;
    int32_t bos_id = -1, eos_id = -1;
    std::string tokenizer_file;    // inside the dataset directory ("tokenizer.model")
    std::string tokenizer_sha256;  // of the tokenizer file
    DatasetSplitInfo train, val;
    std::shared_ptr<const nlohmann::json> json;
};

// Reads DIR/meta.json; tmx::Error naming the directory when it is not a token dataset.
DatasetMeta read_dataset_meta(const std::string& dir);
bool is_dataset_dir(const std::string& dir);

// One split of a dataset as a single token stream with random access by global index.
class TokenDataset {
  public:
    const std::string& dir() const { return dir_; }
    Split split() const { return split_; }
    uint64_t size() const { return total_; }  // tokens
    uint64_t vocab_size() const { return meta_.vocab_size; }
    int32_t bos_id() const { return meta_.bos_id; }
    int64_t documents() const;
    const DatasetMeta& meta() const { return meta_; }
    const std::vector<TokenShard>& shards() const { return shards_; }

    // Unchecked: i < size().
    int32_t operator[](uint64_t i) const;
    // Tokens [begin, begin + n) of the stream, across shard boundaries; checked like
    // TokenShard::copy_range.
    void copy_range(uint64_t begin, size_t n, int32_t* out) const;
    std::vector<int32_t> to_vector() const;

  private:
    friend TokenDataset open_dataset(const std::string& dir, Split split);
    size_t shard_of(uint64_t i) const;

    std::string dir_;
    Split split_ = Split::Train;
    DatasetMeta meta_;
    std::vector<TokenShard> shards_;
    std::vector<uint64_t> starts_;  // global index of each shard's first token
    uint64_t total_ = 0;
};

// Opens a split: checks meta.json, that every shard exists, has the dataset's vocab size, and
// that the token counts add up. An empty split (e.g. val of a dataset prepared with
// --val-fraction 0) is an error naming the directory.
TokenDataset open_dataset(const std::string& dir, Split split);
TokenDataset open_dataset(const std::string& dir, const std::string& split);  // "train", "val"

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
    std::string tokenizer;  // .model file, or a checkpoint directory holding tokenizer.model
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

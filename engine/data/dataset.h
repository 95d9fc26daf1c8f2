// Token datasets (docs/design.md#14-token-datasets): meta.json and the splits, each read as one
// token stream over its shards (engine/data/token_shards.h). engine/data/prepare.h writes them.
//
// Dataset directory: DIR/meta.json, DIR/tokenizer.model or DIR/tokenizer.json with its
// tokenizer_config.json (a copy of the tokenizer it was made
// with), DIR/train_NNNNNN.bin and DIR/val_NNNNNN.bin (numbered from 000000; each at most
// max_shard_tokens tokens). A split is the concatenation of its shards in order: one token
// stream in which every document starts with BOS.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "engine/data/token_shards.h"

namespace tmx {

// meta.json's "format" and "version".
inline constexpr const char* kDatasetFormat = "tmx-token-dataset";
inline constexpr int kDatasetVersion = 1;

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
    std::string
        tokenizer_file;  // inside the dataset directory ("tokenizer.model", "tokenizer.json")
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

}  // namespace tmx

// Token shards (docs/design.md#14-token-datasets): the storage of a token dataset's splits
// (engine/data/dataset.h).
//
// Shard file: a fixed 32-byte little-endian header, then the tokens.
//   bytes  0-7   magic "TMXTOKS1" (8 ASCII bytes, no NUL)
//   bytes  8-11  uint32 version = 1
//   bytes 12-15  uint32 bytes_per_token: 2 when vocab_size <= 65536, else 4
//   bytes 16-23  uint64 vocab_size
//   bytes 24-31  uint64 token_count
//   bytes 32-    token_count tokens, uint16 or uint32 little-endian
// The file size is exactly 32 + token_count * bytes_per_token.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tmx {

inline constexpr char kTokenShardMagic[9] = "TMXTOKS1";  // the file holds the 8 chars only
inline constexpr uint32_t kTokenShardVersion = 1;
inline constexpr size_t kTokenShardHeaderBytes = 32;

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

}  // namespace tmx

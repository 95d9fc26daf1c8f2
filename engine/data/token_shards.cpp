#include "engine/data/token_shards.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "engine/core/errors.h"
#include "engine/core/file_io.h"

namespace tmx {

namespace {

void put_u32(unsigned char* p, uint32_t v) {
    for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
void put_u64(unsigned char* p, uint64_t v) {
    for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
uint32_t get_u32(const unsigned char* p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
    return v;
}
uint64_t get_u64(const unsigned char* p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
    return v;
}

void write_all(int fd, const void* data, size_t n, const std::string& name) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
        ssize_t w = ::write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            throw Error(name + ": write failed: " + std::strerror(errno));
        }
        p += w;
        n -= static_cast<size_t>(w);
    }
}

}  // namespace

uint32_t bytes_per_token_for(uint64_t vocab_size) {
    return vocab_size <= 65536 ? 2 : 4;
}

// ---------------------------------------------------------------------------------------------
// ShardWriter

ShardWriter::ShardWriter(std::string path, uint64_t vocab_size)
    : path_(std::move(path)), vocab_size_(vocab_size) {
    if (vocab_size_ == 0 || vocab_size_ > (uint64_t{1} << 31))
        throw Error(path_ + ": cannot write a token shard with vocab size " +
                    std::to_string(vocab_size_));
    bytes_per_token_ = bytes_per_token_for(vocab_size_);
    tmp_ = path_ + ".tmp." + std::to_string(::getpid());
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) throw Error(tmp_ + ": cannot create: " + std::strerror(errno));
    buffer_.reserve(size_t{1} << 20);
    buffer_.resize(kTokenShardHeaderBytes, 0);  // placeholder; close() writes the header
}

std::unique_ptr<ShardWriter> ShardWriter::reopen(std::string path, uint64_t vocab_size,
                                                 uint64_t keep_tokens) {
    // A fresh writer for the temporary name, then the closed shard's bytes put back under it.
    auto w = std::make_unique<ShardWriter>(std::move(path), vocab_size);
    const uint64_t tokens = TokenShard::open(w->path_).size();
    if (keep_tokens > tokens)
        throw Error(w->path_ + ": cannot keep " + std::to_string(keep_tokens) +
                    " tokens of a shard of " + std::to_string(tokens));
    if (std::rename(w->path_.c_str(), w->tmp_.c_str()) != 0)
        throw Error(w->path_ + ": cannot reopen the shard: " + std::strerror(errno));
    ::close(w->fd_);
    w->fd_ = ::open(w->tmp_.c_str(), O_WRONLY | O_CLOEXEC);
    if (w->fd_ < 0) throw Error(w->tmp_ + ": cannot open: " + std::strerror(errno));
    w->buffer_.clear();  // the header is there already; close() rewrites it
    w->count_ = tokens;
    w->truncate(keep_tokens);
    return w;
}

ShardWriter::~ShardWriter() {
    if (fd_ >= 0) {
        ::close(fd_);
        ::unlink(tmp_.c_str());
    }
}

void ShardWriter::flush_buffer() {
    write_all(fd_, buffer_.data(), buffer_.size(), tmp_);
    buffer_.clear();
}

void ShardWriter::append(const int32_t* tokens, size_t n) {
    if (fd_ < 0) throw Error(path_ + ": shard already closed");
    for (size_t i = 0; i < n; ++i) {
        const int32_t t = tokens[i];
        if (t < 0 || static_cast<uint64_t>(t) >= vocab_size_)
            throw Error(path_ + ": token " + std::to_string(t) + " is outside the vocabulary [0, " +
                        std::to_string(vocab_size_) + ")");
        const auto u = static_cast<uint32_t>(t);
        buffer_.push_back(static_cast<unsigned char>(u));
        buffer_.push_back(static_cast<unsigned char>(u >> 8));
        if (bytes_per_token_ == 4) {
            buffer_.push_back(static_cast<unsigned char>(u >> 16));
            buffer_.push_back(static_cast<unsigned char>(u >> 24));
        }
        if (buffer_.size() >= (size_t{1} << 20)) flush_buffer();
    }
    count_ += n;
}

void ShardWriter::truncate(uint64_t count) {
    if (fd_ < 0) throw Error(path_ + ": shard already closed");
    if (count > count_)
        throw Error(path_ + ": cannot truncate " + std::to_string(count_) + " tokens to " +
                    std::to_string(count));
    flush_buffer();
    const auto bytes = static_cast<off_t>(file_bytes(count));
    if (::ftruncate(fd_, bytes) != 0 || ::lseek(fd_, bytes, SEEK_SET) != bytes)
        throw Error(tmp_ + ": cannot truncate: " + std::strerror(errno));
    count_ = count;
}

void ShardWriter::close() {
    if (fd_ < 0) return;
    flush_buffer();
    unsigned char header[kTokenShardHeaderBytes];
    std::memcpy(header, kTokenShardMagic, 8);
    put_u32(header + 8, kTokenShardVersion);
    put_u32(header + 12, bytes_per_token_);
    put_u64(header + 16, vocab_size_);
    put_u64(header + 24, count_);
    if (::pwrite(fd_, header, sizeof header, 0) != static_cast<ssize_t>(sizeof header))
        throw Error(tmp_ + ": cannot write the shard header: " + std::strerror(errno));
    if (::fsync(fd_) != 0) throw Error(tmp_ + ": cannot flush: " + std::strerror(errno));
    int rc = ::close(fd_);
    fd_ = -1;
    if (rc != 0 || std::rename(tmp_.c_str(), path_.c_str()) != 0) {
        int err = errno;
        ::unlink(tmp_.c_str());
        throw Error(path_ + ": cannot move the shard into place: " + std::strerror(err));
    }
}

void write_token_shard(const std::string& path, uint64_t vocab_size,
                       const std::vector<int32_t>& tokens) {
    ShardWriter w(path, vocab_size);
    w.append(tokens);
    w.close();
}

// ---------------------------------------------------------------------------------------------
// TokenShard

TokenShard TokenShard::open(const std::string& path) {
    TokenShard s;
    s.path_ = path;
    const int fd = open_regular_file(path);  // a FIFO or device: an error, never a hang
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        int err = errno;
        ::close(fd);
        throw Error(path + ": cannot stat: " + std::strerror(err));
    }
    const auto size = static_cast<uint64_t>(st.st_size);
    if (size < kTokenShardHeaderBytes) {
        ::close(fd);
        throw Error(path + ": truncated token shard: " + std::to_string(size) +
                    " bytes, shorter than the 32-byte header");
    }
    void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int err = errno;
    ::close(fd);
    if (map == MAP_FAILED) throw Error(path + ": cannot map token shard: " + std::strerror(err));
    s.map_ = map;
    s.map_bytes_ = size;
    const auto* h = static_cast<const unsigned char*>(map);
    if (std::memcmp(h, kTokenShardMagic, 8) != 0)
        throw Error(path + ": not a tmx token shard (bad magic; expected \"TMXTOKS1\")");
    const uint32_t version = get_u32(h + 8);
    if (version != kTokenShardVersion)
        throw Error(path + ": unsupported token shard version " + std::to_string(version) +
                    " (this tmx reads version " + std::to_string(kTokenShardVersion) + ")");
    s.bytes_per_token_ = get_u32(h + 12);
    s.vocab_size_ = get_u64(h + 16);
    s.count_ = get_u64(h + 24);
    if (s.vocab_size_ == 0 || s.vocab_size_ > (uint64_t{1} << 31))
        throw Error(path + ": invalid vocab size " + std::to_string(s.vocab_size_) +
                    " in the shard header");
    if (s.bytes_per_token_ != bytes_per_token_for(s.vocab_size_))
        throw Error(path + ": header says " + std::to_string(s.bytes_per_token_) +
                    " bytes per token, but vocab size " + std::to_string(s.vocab_size_) +
                    " needs " + std::to_string(bytes_per_token_for(s.vocab_size_)));
    // The header's count is untrusted: its byte size is computed only when it cannot overflow.
    const uint64_t max_count = (UINT64_MAX - kTokenShardHeaderBytes) / s.bytes_per_token_;
    const uint64_t expected =
        s.count_ <= max_count ? kTokenShardHeaderBytes + s.count_ * s.bytes_per_token_ : UINT64_MAX;
    if (size < expected)
        throw Error(path + ": truncated token shard: the header says " + std::to_string(s.count_) +
                    " tokens (" +
                    (expected == UINT64_MAX ? std::string("an impossible size")
                                            : std::to_string(expected) + " bytes") +
                    ") but the file has " + std::to_string(size) + " bytes");
    if (size > expected)
        throw Error(path + ": token shard has " + std::to_string(size) + " bytes, more than the " +
                    std::to_string(expected) + " its header accounts for");
    s.tokens_ = h + kTokenShardHeaderBytes;
    return s;
}

TokenShard::TokenShard(TokenShard&& o) noexcept {
    *this = std::move(o);
}

TokenShard& TokenShard::operator=(TokenShard&& o) noexcept {
    if (this != &o) {
        if (map_) ::munmap(map_, map_bytes_);
        path_ = std::move(o.path_);
        map_ = std::exchange(o.map_, nullptr);
        map_bytes_ = std::exchange(o.map_bytes_, 0);
        tokens_ = std::exchange(o.tokens_, nullptr);
        count_ = std::exchange(o.count_, 0);
        vocab_size_ = std::exchange(o.vocab_size_, 0);
        bytes_per_token_ = std::exchange(o.bytes_per_token_, 0);
    }
    return *this;
}

TokenShard::~TokenShard() {
    if (map_) ::munmap(map_, map_bytes_);
}

void TokenShard::copy_range(uint64_t begin, size_t n, int32_t* out) const {
    if (begin > count_ || n > count_ - begin)
        throw Error(path_ + ": tokens [" + std::to_string(begin) + ", " +
                    std::to_string(begin + n) + ") are outside the shard's " +
                    std::to_string(count_));
    uint32_t bad = 0;
    for (size_t i = 0; i < n; ++i) {
        const int32_t t = (*this)[begin + i];
        out[i] = t;
        bad |=
            static_cast<uint32_t>(static_cast<uint64_t>(static_cast<uint32_t>(t)) >= vocab_size_);
    }
    if (bad) {
        for (size_t i = 0; i < n; ++i)
            if (static_cast<uint64_t>(static_cast<uint32_t>(out[i])) >= vocab_size_)
                throw Error(path_ + ": token " + std::to_string(static_cast<uint32_t>(out[i])) +
                            " at index " + std::to_string(begin + i) +
                            " is outside the vocabulary [0, " + std::to_string(vocab_size_) +
                            "): the shard is corrupt");
    }
}

std::vector<int32_t> TokenShard::to_vector() const {
    std::vector<int32_t> v(count_);
    copy_range(0, count_, v.data());
    return v;
}

}  // namespace tmx

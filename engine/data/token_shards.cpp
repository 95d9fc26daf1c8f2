#include "engine/data/token_shards.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <filesystem>
#include <future>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <type_traits>
#include <utility>

#include "engine/core/errors.h"
#include "engine/core/file_io.h"
#include "engine/core/threads.h"
#include "engine/data/tokenizer.h"
#include "engine/core/sha256.h"

namespace tmx {
namespace fs = std::filesystem;

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

void fsync_path(const fs::path& p) {
    int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ::fsync(fd);
        ::close(fd);
    }
}

std::string shard_name(Split split, size_t index) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%s_%06zu.bin", to_string(split), index);
    return buf;
}


}  // namespace

uint32_t bytes_per_token_for(uint64_t vocab_size) {
    return vocab_size <= 65536 ? 2 : 4;
}

const char* to_string(Split split) {
    return split == Split::Train ? "train" : "val";
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

// ---------------------------------------------------------------------------------------------
// Dataset metadata

namespace {

constexpr const char* kDatasetFormat = "tmx-token-dataset";
constexpr int kDatasetVersion = 1;

template <class T>
T meta_field(const nlohmann::json& j, const char* key, const std::string& file) {
    auto it = j.find(key);
    if (it == j.end()) throw Error(file + ": field '" + key + "' is missing");
    if constexpr (std::is_integral_v<T>) {
        // nlohmann converts any number to any integer type, wrapping or truncating silently.
        const bool fits = it->is_number_unsigned()  ? std::in_range<T>(it->get<uint64_t>())
                          : it->is_number_integer() ? std::in_range<T>(it->get<int64_t>())
                                                    : false;
        if (!fits)
            throw Error(file + ": field '" + key + "' must be an integer in [" +
                        std::to_string(std::numeric_limits<T>::min()) + ", " +
                        std::to_string(std::numeric_limits<T>::max()) + "], got " + it->dump());
        return it->get<T>();
    } else {
        try {
            return it->get<T>();
        } catch (const nlohmann::json::exception&) {
            throw Error(file + ": field '" + key + "' has the wrong type");
        }
    }
}

DatasetSplitInfo split_from_json(const nlohmann::json& splits, const char* name,
                                 const std::string& file) {
    DatasetSplitInfo info;
    auto it = splits.find(name);
    if (it == splits.end()) return info;
    if (!it->is_object()) throw Error(file + ": field 'splits." + name + "' is not an object");
    info.documents = meta_field<int64_t>(*it, "documents", file);
    if (info.documents < 0)
        throw Error(file + ": field 'splits." + name + ".documents' must not be negative");
    info.tokens = meta_field<uint64_t>(*it, "tokens", file);
    info.shards = meta_field<std::vector<std::string>>(*it, "shards", file);
    return info;
}

nlohmann::json split_to_json(const DatasetSplitInfo& s) {
    return {{"documents", s.documents}, {"tokens", s.tokens}, {"shards", s.shards}};
}

}  // namespace

bool is_dataset_dir(const std::string& dir) {
    std::error_code ec;
    return fs::is_regular_file(fs::path(dir) / "meta.json", ec);
}

DatasetMeta read_dataset_meta(const std::string& dir) {
    const std::string file = (fs::path(dir) / "meta.json").string();
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) throw Error(dir + ": no such dataset directory");
    if (!fs::exists(file, ec))
        throw Error(dir + ": not a token dataset (no meta.json; make one with 'tmx prepare')");
    nlohmann::json j = read_json_file(file);
    if (!j.is_object()) throw Error(file + ": expected a JSON object");
    // (json::value would throw a JSON type error for a 'format' that is not a string.)
    const auto format = j.find("format");
    if (format == j.end() || !format->is_string() || *format != kDatasetFormat)
        throw Error(file + ": not a tmx token dataset (field 'format' is not \"" + kDatasetFormat +
                    "\")");
    const int version = meta_field<int>(j, "version", file);
    if (version != kDatasetVersion)
        throw Error(file + ": unsupported dataset version " + std::to_string(version));
    DatasetMeta m;
    m.vocab_size = meta_field<uint64_t>(j, "vocab_size", file);
    m.bytes_per_token = meta_field<uint32_t>(j, "bytes_per_token", file);
    m.bos_id = meta_field<int32_t>(j, "bos_id", file);
    m.eos_id = meta_field<int32_t>(j, "eos_id", file);
    if (auto t = j.find("tokenizer"); t != j.end() && t->is_object()) {
        if (t->contains("file")) m.tokenizer_file = meta_field<std::string>(*t, "file", file);
        if (t->contains("sha256")) m.tokenizer_sha256 = meta_field<std::string>(*t, "sha256", file);
    }
    auto splits = j.find("splits");
    if (splits == j.end() || !splits->is_object())
        throw Error(file + ": field 'splits' is missing or not an object");
    m.train = split_from_json(*splits, "train", file);
    m.val = split_from_json(*splits, "val", file);
    m.json = std::make_shared<const nlohmann::json>(std::move(j));
    return m;
}

// ---------------------------------------------------------------------------------------------
// TokenDataset

int64_t TokenDataset::documents() const {
    return split_ == Split::Train ? meta_.train.documents : meta_.val.documents;
}

size_t TokenDataset::shard_of(uint64_t i) const {
    auto it = std::upper_bound(starts_.begin(), starts_.end(), i);
    return static_cast<size_t>(it - starts_.begin()) - 1;
}

int32_t TokenDataset::operator[](uint64_t i) const {
    const size_t s = shard_of(i);
    return shards_[s][i - starts_[s]];
}

void TokenDataset::copy_range(uint64_t begin, size_t n, int32_t* out) const {
    if (begin > total_ || n > total_ - begin)
        throw Error(dir_ + ": tokens [" + std::to_string(begin) + ", " + std::to_string(begin + n) +
                    ") are outside the " + to_string(split_) + " split's " +
                    std::to_string(total_));
    while (n > 0) {
        const size_t s = shard_of(begin);
        const uint64_t local = begin - starts_[s];
        const size_t take = static_cast<size_t>(std::min<uint64_t>(n, shards_[s].size() - local));
        shards_[s].copy_range(local, take, out);
        out += take;
        begin += take;
        n -= take;
    }
}

std::vector<int32_t> TokenDataset::to_vector() const {
    std::vector<int32_t> v(total_);
    copy_range(0, total_, v.data());
    return v;
}

TokenDataset open_dataset(const std::string& dir, Split split) {
    TokenDataset d;
    d.dir_ = dir;
    d.split_ = split;
    d.meta_ = read_dataset_meta(dir);
    const DatasetSplitInfo& info = split == Split::Train ? d.meta_.train : d.meta_.val;
    if (info.tokens == 0 || info.shards.empty())
        throw Error(dir + ": the " + to_string(split) + " split of this dataset is empty" +
                    (split == Split::Val ? " (it was prepared with --val-fraction 0)" : ""));
    uint64_t total = 0;
    for (const std::string& name : info.shards) {
        if (name.find('/') != std::string::npos || name == ".." || name.empty())
            throw Error(dir + "/meta.json: bad shard name '" + name + "'");
        TokenShard s = TokenShard::open((fs::path(dir) / name).string());
        if (s.vocab_size() != d.meta_.vocab_size)
            throw Error(s.path() + ": vocab size " + std::to_string(s.vocab_size()) +
                        " differs from the dataset's " + std::to_string(d.meta_.vocab_size) +
                        " (meta.json); the shards come from different tokenizers");
        d.starts_.push_back(total);
        total += s.size();
        d.shards_.push_back(std::move(s));
    }
    if (total != info.tokens)
        throw Error(dir + ": the " + std::string(to_string(split)) + " shards hold " +
                    std::to_string(total) + " tokens but meta.json says " +
                    std::to_string(info.tokens));
    d.total_ = total;
    return d;
}

TokenDataset open_dataset(const std::string& dir, const std::string& split) {
    if (split == "train") return open_dataset(dir, Split::Train);
    if (split == "val") return open_dataset(dir, Split::Val);
    throw UsageError("unknown dataset split '" + split + "' (expected train or val)");
}

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
                throw Error(dir + ": a dataset already exists there (use --force to replace it)");
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
    fsync_path(tmp_);

    const fs::path d(dir_);
    std::error_code ec;
    if (!fs::exists(d, ec)) {
        fs::rename(tmp_, d, ec);
        if (ec) throw Error(dir_ + ": cannot move the dataset into place: " + ec.message());
    } else {
        if (::renameat2(AT_FDCWD, tmp_.c_str(), AT_FDCWD, dir_.c_str(), RENAME_EXCHANGE) == 0) {
            fs::remove_all(tmp_, ec);  // now holds the previous contents
        } else if (errno == EINVAL || errno == ENOSYS) {
            // No atomic exchange on this filesystem: move the old dataset aside first.
            const std::string old = dir_ + ".old-" + std::to_string(::getpid());
            if (std::rename(dir_.c_str(), old.c_str()) != 0)
                throw Error(dir_ + ": cannot replace the dataset: " + std::strerror(errno));
            if (std::rename(tmp_.c_str(), dir_.c_str()) != 0) {
                const int err = errno;
                std::rename(old.c_str(), dir_.c_str());
                throw Error(dir_ + ": cannot replace the dataset: " + std::strerror(err));
            }
            fs::remove_all(old, ec);
        } else {
            throw Error(dir_ + ": cannot replace the dataset: " + std::strerror(errno));
        }
    }
    committed_ = true;
    fsync_path(d.parent_path());
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
        throw UsageError("--val-fraction must be between 0 and 1, got " +
                         std::to_string(options.val_fraction));
    if (options.inputs.empty()) throw UsageError("no input files given");

    Tokenizer tok = Tokenizer::load(options.tokenizer);
    const int32_t bos = tok.bos_id();
    if (bos < 0) throw Error(tok.path() + ": the tokenizer has no BOS piece");
    const std::string tok_bytes = read_file(tok.path());

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
         {{"file", "tokenizer.model"},
          {"source", fs::absolute(tok.path()).lexically_normal().string()},
          {"sha256", sha256_hex(tok_bytes)},
          {"bytes", tok_bytes.size()}}},
        {"val_fraction", options.val_fraction},
        {"bytes", report.corpus.bytes},
        {"skipped", {{"invalid_utf8", report.corpus.invalid_utf8}}},
        {"inputs", inputs},
    };
    writer.add_file("tokenizer.model", tok_bytes);
    writer.commit(meta);
    report.train = writer.info(Split::Train);
    report.val = writer.info(Split::Val);
    report.seconds = elapsed();
    return report;
}

}  // namespace tmx

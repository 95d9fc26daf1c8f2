// Token datasets: meta.json (read_dataset_meta) and one split of shards as a single token
// stream (TokenDataset, open_dataset).
#include "engine/data/dataset.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <utility>

#include "engine/core/errors.h"
#include "engine/core/file_io.h"
#include "engine/core/json_fields.h"

namespace tmx {
namespace fs = std::filesystem;

const char* to_string(Split split) {
    return split == Split::Train ? "train" : "val";
}

// ---------------------------------------------------------------------------------------------
// Dataset metadata

namespace {

DatasetSplitInfo split_from_json(const json_fields::Fields& splits, const char* name) {
    DatasetSplitInfo info;
    if (!splits.has(name)) return info;
    const json_fields::Fields f(splits.at(name, "an object"), splits.source(),
                                std::string("splits.") + name + ".");
    info.documents = f.integer("documents", 0);
    info.tokens = f.uinteger("tokens");
    info.shards = f.string_list("shards");
    return info;
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
    const json_fields::Fields f(j, file);
    const int64_t version = f.integer("version");
    if (version != kDatasetVersion)
        throw Error(file + ": unsupported dataset version " + std::to_string(version));
    DatasetMeta m;
    m.vocab_size = f.uinteger("vocab_size");
    m.bytes_per_token = static_cast<uint32_t>(f.integer("bytes_per_token", 0, UINT32_MAX));
    m.bos_id = static_cast<int32_t>(f.integer("bos_id", INT32_MIN, INT32_MAX));
    m.eos_id = static_cast<int32_t>(f.integer("eos_id", INT32_MIN, INT32_MAX));
    if (auto t = j.find("tokenizer"); t != j.end() && t->is_object()) {
        const json_fields::Fields tok(*t, file, "tokenizer.");
        if (tok.has("file")) m.tokenizer_file = tok.string("file");
        if (tok.has("sha256")) m.tokenizer_sha256 = tok.string("sha256");
    }
    if (!f.has("splits") || !j.at("splits").is_object())
        throw Error(file + ": field 'splits' is missing or not an object");
    const json_fields::Fields splits(j.at("splits"), file, "splits.");
    m.train = split_from_json(splits, "train");
    m.val = split_from_json(splits, "val");
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
                    (split == Split::Val ? " (it was prepared with " + opt("val_fraction") + " 0)"
                                         : OptionText()));
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

}  // namespace tmx

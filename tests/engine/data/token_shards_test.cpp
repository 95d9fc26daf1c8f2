#include "engine/data/token_shards.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/errors.h"
#include "engine/core/file_io.h"
#include "engine/core/rng.h"
#include "engine/core/sha256.h"
#include "engine/data/dataset.h"
#include "engine/data/prepare.h"
#include "tests/test_util.h"

namespace tmx {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

using test::error_of;

uint64_t le(const std::string& bytes, size_t offset, size_t n) {
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i)
        v |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[offset + i])) << (8 * i);
    return v;
}

std::vector<std::string> dir_entries(const fs::path& dir) {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename());
    std::sort(names.begin(), names.end());
    return names;
}

void round_trip(uint64_t vocab, uint32_t expected_bytes_per_token, uint64_t seed) {
    SCOPED_TRACE("vocab " + std::to_string(vocab) + " seed " + std::to_string(seed));
    TempDir dir;
    Rng rng(seed);
    std::vector<int32_t> tokens = test::random_ints(rng, 1000, 0, static_cast<int32_t>(vocab));
    tokens.push_back(static_cast<int32_t>(vocab - 1));
    tokens.push_back(0);
    write_token_shard(dir / "s.bin", vocab, tokens);

    // The exact header layout of docs/design.md#14-token-datasets / token_shards.h.
    const std::string raw = read_file(dir / "s.bin");
    ASSERT_EQ(raw.size(), 32 + tokens.size() * expected_bytes_per_token);
    EXPECT_EQ(raw.substr(0, 8), "TMXTOKS1");
    EXPECT_EQ(le(raw, 8, 4), 1u);
    EXPECT_EQ(le(raw, 12, 4), expected_bytes_per_token);
    EXPECT_EQ(le(raw, 16, 8), vocab);
    EXPECT_EQ(le(raw, 24, 8), tokens.size());
    EXPECT_EQ(le(raw, 32 + expected_bytes_per_token, expected_bytes_per_token),
              static_cast<uint64_t>(tokens[1]));

    TokenShard s = TokenShard::open(dir / "s.bin");
    EXPECT_EQ(s.size(), tokens.size());
    EXPECT_EQ(s.vocab_size(), vocab);
    EXPECT_EQ(s.bytes_per_token(), expected_bytes_per_token);
    EXPECT_EQ(s.to_vector(), tokens);
    for (size_t i = 0; i < tokens.size(); i += 37) EXPECT_EQ(s[i], tokens[i]);
    std::vector<int32_t> part(10);
    s.copy_range(500, 10, part.data());
    EXPECT_EQ(part, std::vector<int32_t>(tokens.begin() + 500, tokens.begin() + 510));
    EXPECT_NE(error_of([&] { s.copy_range(tokens.size() - 5, 10, part.data()); }), "");
    EXPECT_EQ(dir_entries(dir.path()), std::vector<std::string>{"s.bin"});  // no temp files
}

TEST(TokenShards, RoundTripUint16) {
    round_trip(512, 2, test::fresh_seed());
}
TEST(TokenShards, RoundTripUint16AtTheLargestVocab) {
    round_trip(65536, 2, test::fresh_seed());
}
TEST(TokenShards, RoundTripUint32) {
    round_trip(100000, 4, test::fresh_seed());
}

TEST(TokenShards, BytesPerTokenFollowsTheVocabSize) {
    EXPECT_EQ(bytes_per_token_for(32000), 2u);
    EXPECT_EQ(bytes_per_token_for(65536), 2u);
    EXPECT_EQ(bytes_per_token_for(65537), 4u);
}

TEST(TokenShards, EmptyShardIsValid) {
    TempDir dir;
    write_token_shard(dir / "e.bin", 100, {});
    EXPECT_EQ(fs::file_size(dir / "e.bin"), 32u);
    EXPECT_EQ(TokenShard::open(dir / "e.bin").size(), 0u);
}

TEST(TokenShards, TruncatedShardIsAnErrorNamingIt) {
    TempDir dir;
    write_token_shard(dir / "t.bin", 512, {1, 2, 3, 4});
    fs::resize_file(dir / "t.bin", 32 + 7);
    std::string err = error_of([&] { TokenShard::open(dir / "t.bin"); });
    EXPECT_NE(err.find("t.bin"), std::string::npos) << err;
    EXPECT_NE(err.find("truncated"), std::string::npos) << err;
    fs::resize_file(dir / "t.bin", 20);
    err = error_of([&] { TokenShard::open(dir / "t.bin"); });
    EXPECT_NE(err.find("t.bin"), std::string::npos) << err;
    EXPECT_NE(err.find("truncated"), std::string::npos) << err;
    write_token_shard(dir / "long.bin", 512, {1, 2});
    std::ofstream(dir / "long.bin", std::ios::app | std::ios::binary) << "xx";
    err = error_of([&] { TokenShard::open(dir / "long.bin"); });
    EXPECT_NE(err.find("long.bin"), std::string::npos) << err;
}

TEST(TokenShards, BadMagicOrVersionIsAnErrorNamingTheFile) {
    TempDir dir;
    write_token_shard(dir / "m.bin", 512, {1, 2, 3});
    std::string raw = read_file(dir / "m.bin");
    std::string bad = raw;
    bad[3] = 'X';
    write_file_atomic(dir / "m.bin", bad);
    std::string err = error_of([&] { TokenShard::open(dir / "m.bin"); });
    EXPECT_NE(err.find("m.bin"), std::string::npos) << err;
    EXPECT_NE(err.find("magic"), std::string::npos) << err;
    bad = raw;
    bad[8] = 2;
    write_file_atomic(dir / "m.bin", bad);
    err = error_of([&] { TokenShard::open(dir / "m.bin"); });
    EXPECT_NE(err.find("version 2"), std::string::npos) << err;
    bad = raw;
    bad[12] = 4;  // bytes_per_token disagrees with the vocab size
    write_file_atomic(dir / "m.bin", bad);
    EXPECT_NE(error_of([&] { TokenShard::open(dir / "m.bin"); }), "");
}

TEST(TokenShards, WriterRejectsTokensOutsideTheVocabularyAndLeavesNothing) {
    TempDir dir;
    {
        ShardWriter w(dir / "w.bin", 100);
        w.append({1, 2, 3});
        std::string err = error_of([&] { w.append({5, 100}); });
        EXPECT_NE(err.find("100"), std::string::npos) << err;
        EXPECT_NE(error_of([&] { w.append({-1}); }), "");
    }  // never closed
    EXPECT_TRUE(dir_entries(dir.path()).empty());
}

TEST(TokenShards, CorruptTokenIsCaughtOnRead) {
    TempDir dir;
    write_token_shard(dir / "c.bin", 512, {1, 2, 3, 4});
    std::string raw = read_file(dir / "c.bin");
    raw[32 + 2 * 2 + 1] = '\x7f';  // token 2 becomes >= 512
    write_file_atomic(dir / "c.bin", raw);
    TokenShard s = TokenShard::open(dir / "c.bin");
    std::vector<int32_t> out(4);
    std::string err = error_of([&] { s.copy_range(0, 4, out.data()); });
    EXPECT_NE(err.find("c.bin"), std::string::npos) << err;
    EXPECT_NE(err.find("index 2"), std::string::npos) << err;
}

TEST(TokenShards, Sha256KnownVectors) {
    EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    EXPECT_EQ(sha256_hex("abc"),
              "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
              "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    EXPECT_EQ(sha256_hex(std::string(1000000, 'a')),
              "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(TokenShards, ValidationRulePicksEveryKthDocument) {
    std::vector<int64_t> val;
    for (int64_t i = 0; i < 1000; ++i)
        if (is_validation_document(i, 0.01)) val.push_back(i);
    EXPECT_EQ(val.size(), 10u);
    EXPECT_EQ(val.front(), 99);
    EXPECT_EQ(val[1], 199);
    int n = 0;
    for (int64_t i = 0; i < 1000; ++i) n += is_validation_document(i, 0.3);
    EXPECT_EQ(n, 300);
    for (int64_t i = 0; i < 100; ++i) {
        EXPECT_FALSE(is_validation_document(i, 0.0));
        EXPECT_TRUE(is_validation_document(i, 1.0));
    }
}

// A dataset with several shards per split: random access and ranges across shard boundaries.
TEST(TokenDataset, ConcatenatesShardsWithRandomAccess) {
    TempDir dir;
    const std::string out = dir / "ds";
    Rng rng(test::fresh_seed());
    std::vector<int32_t> train, val;
    {
        DatasetWriter w(out, 1000, DatasetWriterOptions{false, 7});
        for (int d = 0; d < 20; ++d) {
            std::vector<int32_t> doc = test::random_ints(rng, 1 + rng.below(12), 3, 1000);
            doc.insert(doc.begin(), 1);
            const Split s = d % 5 == 4 ? Split::Val : Split::Train;
            w.add_document(s, doc.data(), doc.size());
            auto& all = s == Split::Train ? train : val;
            all.insert(all.end(), doc.begin(), doc.end());
        }
        w.commit({{"bos_id", 1}, {"eos_id", 2}});
    }
    TokenDataset t = open_dataset(out, "train");
    EXPECT_EQ(t.size(), train.size());
    EXPECT_EQ(t.documents(), 16);
    EXPECT_EQ(t.vocab_size(), 1000u);
    EXPECT_EQ(t.bos_id(), 1);
    EXPECT_EQ(t.shards().size(), (train.size() + 6) / 7);
    EXPECT_EQ(t.to_vector(), train);
    for (uint64_t i = 0; i < train.size(); ++i) ASSERT_EQ(t[i], train[i]) << i;
    std::vector<int32_t> window(10);
    for (uint64_t b = 0; b + 10 <= train.size(); b += 3) {
        t.copy_range(b, 10, window.data());
        ASSERT_EQ(window, std::vector<int32_t>(train.begin() + static_cast<int64_t>(b),
                                               train.begin() + static_cast<int64_t>(b) + 10));
    }
    EXPECT_NE(error_of([&] { t.copy_range(train.size() - 2, 10, window.data()); }), "");
    TokenDataset v = open_dataset(out, Split::Val);
    EXPECT_EQ(v.to_vector(), val);
    EXPECT_EQ(v.documents(), 4);

    DatasetMeta m = read_dataset_meta(out);
    EXPECT_EQ(m.train.shards.front(), "train_000000.bin");
    EXPECT_EQ(m.val.shards.front(), "val_000000.bin");
    EXPECT_EQ(m.bytes_per_token, 2u);
    EXPECT_EQ(dir_entries(dir.path()), std::vector<std::string>{"ds"});  // no temp dir left
}

TEST(TokenDataset, ShardsWithAnotherVocabSizeAreRejected) {
    TempDir dir;
    const std::string out = dir / "ds";
    {
        DatasetWriter w(out, 1000, DatasetWriterOptions{false, 4});
        std::vector<int32_t> doc = {1, 5, 6, 7, 8, 9};
        w.add_document(Split::Train, doc.data(), doc.size());
        w.commit({{"bos_id", 1}, {"eos_id", 2}});
    }
    write_token_shard((fs::path(out) / "train_000001.bin").string(), 70000, {1, 5});
    std::string err = error_of([&] { open_dataset(out, "train"); });
    EXPECT_NE(err.find("train_000001.bin"), std::string::npos) << err;
    EXPECT_NE(err.find("vocab size 70000"), std::string::npos) << err;
}

TEST(TokenDataset, EmptySplitOrMissingMetaIsAnError) {
    TempDir dir;
    const std::string out = dir / "ds";
    {
        DatasetWriter w(out, 100);
        std::vector<int32_t> doc = {1, 5};
        w.add_document(Split::Train, doc.data(), doc.size());
        w.commit({{"bos_id", 1}, {"eos_id", 2}});
    }
    std::string err = error_of([&] { open_dataset(out, "val"); });
    EXPECT_NE(err.find("(it was prepared with val_fraction 0)"), std::string::npos) << err;
    err = error_of([&] { open_dataset(dir.path().string(), "train"); });
    EXPECT_NE(err.find("meta.json"), std::string::npos) << err;
}

TEST(TokenDataset, WriterRefusesToClobberAndReplacesOnlyWhenAsked) {
    TempDir dir;
    const std::string out = dir / "ds";
    fs::create_directories(out);
    test::write_text(dir / "ds/notes.txt", "mine");
    std::string err = error_of([&] { DatasetWriter w(out, 100); });
    EXPECT_NE(err.find("not a token dataset"), std::string::npos) << err;
    fs::remove(dir / "ds/notes.txt");

    std::vector<int32_t> doc = {1, 5, 6};
    {
        DatasetWriter w(out, 100);  // an empty directory is fine
        w.add_document(Split::Train, doc.data(), doc.size());
        w.commit({{"bos_id", 1}, {"eos_id", 2}});
    }
    err = error_of([&] { DatasetWriter w(out, 100); });
    EXPECT_NE(err.find("(use overwrite to replace it)"), std::string::npos) << err;
    {
        DatasetWriter w(out, 100, DatasetWriterOptions{true, kDefaultShardTokens});
        w.add_document(Split::Train, doc.data(), 2);
        // Not committed: the old dataset stays, and the temporary directory goes.
    }
    EXPECT_EQ(open_dataset(out, "train").size(), 3u);
    EXPECT_EQ(dir_entries(dir.path()), std::vector<std::string>{"ds"});
    {
        DatasetWriter w(out + "/", 100, DatasetWriterOptions{true, kDefaultShardTokens});
        w.add_document(Split::Train, doc.data(), 2);
        w.commit({{"bos_id", 1}, {"eos_id", 2}});
    }
    EXPECT_EQ(open_dataset(out, "train").size(), 2u);
    EXPECT_EQ(dir_entries(dir.path()), std::vector<std::string>{"ds"});
}

// A header whose token count times the bytes per token wraps around 64 bits must not pass for
// the small file it then seems to describe.
TEST(TokenShards, HeaderCountsThatOverflowAreErrors) {
    TempDir dir;
    write_token_shard(dir / "o.bin", 512, {1, 2, 3, 4});  // 32 + 4 x 2 bytes
    const std::string raw = read_file(dir / "o.bin");
    for (const uint64_t count : {(uint64_t{1} << 63) + 4, ~uint64_t{0}, ~uint64_t{0} / 2 + 1,
                                 (~uint64_t{0} - 31) / 2 + 1}) {
        SCOPED_TRACE(count);
        std::string bad = raw;
        for (int i = 0; i < 8; ++i) bad[24 + i] = static_cast<char>(count >> (8 * i));
        write_file_atomic(dir / "o.bin", bad);
        const std::string err = error_of([&] { TokenShard::open(dir / "o.bin"); });
        EXPECT_NE(err.find("o.bin"), std::string::npos) << err;
        EXPECT_NE(err.find(std::to_string(count)), std::string::npos) << err;
    }
}

// Numbers in meta.json that do not fit the field (nlohmann would wrap or truncate them into
// plausible values) are errors naming the field.
TEST(TokenDataset, MetaNumbersOutOfRangeAreErrorsNamingTheField) {
    TempDir dir;
    const std::string out = dir / "ds";
    {
        DatasetWriter w(out, 1000);
        std::vector<int32_t> doc = {1, 5, 6};
        w.add_document(Split::Train, doc.data(), doc.size());
        w.commit({{"bos_id", 1}, {"eos_id", 2}});
    }
    const nlohmann::json good = read_json_file(out + "/meta.json");
    const std::pair<const char*, std::string> cases[] = {
        {"vocab_size", "-1"},
        {"vocab_size", "1e30"},
        {"bytes_per_token", "4294967298"},   // 2^32 + 2: would truncate to 2
        {"bos_id", "2147483648"},            // 2^31: would wrap to a negative id
        {"tokens", "18446744073709551616"},  // 2^64
        {"documents", "-3"},
    };
    for (const auto& [field, value] : cases) {
        SCOPED_TRACE(std::string(field) + " = " + value);
        std::string text = good.dump();
        nlohmann::json j = good;
        if (std::string(field) == "tokens" || std::string(field) == "documents")
            j["splits"]["train"][field] = "@";
        else
            j[field] = "@";
        text = j.dump();
        text.replace(text.find("\"@\""), 3, value);
        write_file_atomic(out + "/meta.json", text);
        const std::string err = error_of([&] { open_dataset(out, "train"); });
        EXPECT_NE(err.find("meta.json"), std::string::npos) << err;
        EXPECT_NE(err.find(field), std::string::npos) << err;
    }
}

// Fields of the wrong JSON type (found by the token_shard fuzz target: a second "format" key
// holding a number) are errors naming the file and the field, never a JSON library exception.
TEST(TokenDataset, MetaFieldsOfTheWrongTypeAreErrorsNamingTheField) {
    TempDir dir;
    const std::string out = dir / "ds";
    {
        DatasetWriter w(out, 1000);
        std::vector<int32_t> doc = {1, 5, 6};
        w.add_document(Split::Train, doc.data(), doc.size());
        w.commit({{"bos_id", 1}, {"eos_id", 2}, {"tokenizer", {{"file", "t.model"}}}});
    }
    const nlohmann::json good = read_json_file(out + "/meta.json");
    const std::pair<std::vector<std::string>, nlohmann::json> cases[] = {
        {{"format"}, 1},
        {{"format"}, nlohmann::json::array()},
        {{"tokenizer", "file"}, 5},
        {{"tokenizer", "sha256"}, nlohmann::json::object()},
        {{"splits", "train", "shards"}, "train_000000.bin"},
    };
    for (const auto& [path, value] : cases) {
        SCOPED_TRACE(path.back() + " = " + value.dump());
        nlohmann::json j = good;
        nlohmann::json* at = &j;
        for (size_t i = 0; i + 1 < path.size(); ++i) at = &(*at)[path[i]];
        (*at)[path.back()] = value;
        write_file_atomic(out + "/meta.json", j.dump());
        const std::string err = error_of([&] { open_dataset(out, "train"); });
        EXPECT_NE(err.find("meta.json"), std::string::npos) << err;
        EXPECT_NE(err.find(path.back()), std::string::npos) << err;
    }
}

// A dataset whose shard is a FIFO, a directory or a device: an error naming the path, never a
// hang (opening a FIFO without a writer blocks) nor an endless read.
TEST(TokenDataset, SpecialFileForAShardIsAnErrorNamingIt) {
    TempDir dir;
    const std::string out = dir / "ds";
    {
        DatasetWriter w(out, 1000);
        std::vector<int32_t> doc = {1, 5, 6};
        w.add_document(Split::Train, doc.data(), doc.size());
        w.commit({{"bos_id", 1}, {"eos_id", 2}});
    }
    const std::string shard = out + "/train_000000.bin";
    fs::remove(shard);
    ASSERT_EQ(::mkfifo(shard.c_str(), 0600), 0);
    auto opening = std::async(std::launch::async,
                              [&] { return error_of([&] { open_dataset(out, "train"); }); });
    if (opening.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
        ADD_FAILURE() << "opening a dataset whose shard is a FIFO hangs";
        ::close(::open(shard.c_str(), O_WRONLY | O_NONBLOCK));  // lets the blocked reader go
    }
    std::string err = opening.get();
    EXPECT_NE(err.find(shard), std::string::npos) << err;
    EXPECT_NE(err.find("FIFO"), std::string::npos) << err;

    fs::remove(shard);
    fs::create_directory(shard);
    err = error_of([&] { open_dataset(out, "train"); });
    EXPECT_NE(err.find(shard), std::string::npos) << err;
    EXPECT_NE(err.find("directory"), std::string::npos) << err;

    fs::remove(shard);
    fs::create_symlink("/dev/zero", shard);
    err = error_of([&] { open_dataset(out, "train"); });
    EXPECT_NE(err.find(shard), std::string::npos) << err;
    EXPECT_NE(err.find("character device"), std::string::npos) << err;
}

// A document taken back after some of it was written (it turned out invalid) leaves the
// dataset byte for byte as if it had never been begun, wherever it started and ended: inside
// one shard, across several, at a shard boundary.
TEST(TokenDataset, DiscardedDocumentLeavesNoTrace) {
    Rng rng(test::fresh_seed());
    for (const size_t discarded_length : {size_t{3}, size_t{7}, size_t{30}}) {
        for (const size_t before : {size_t{0}, size_t{5}, size_t{7}, size_t{13}}) {
            SCOPED_TRACE(std::to_string(before) + " tokens, then " +
                         std::to_string(discarded_length) + " discarded");
            TempDir dir;
            const std::vector<int32_t> first = test::random_ints(rng, before, 0, 1000);
            const std::vector<int32_t> dropped = test::random_ints(rng, discarded_length, 0, 1000);
            const std::vector<int32_t> last = test::random_ints(rng, 9, 0, 1000);
            for (const bool with_discard : {false, true}) {
                DatasetWriter w(dir / (with_discard ? "b" : "a"), 1000,
                                DatasetWriterOptions{false, 7});
                if (!first.empty()) w.add_document(Split::Train, first.data(), first.size());
                w.add_document(Split::Val, last.data(), 2);
                if (with_discard) {
                    w.begin_document(Split::Train);
                    w.append(dropped.data(), 2);  // in two parts, as prepare streams
                    w.append(dropped.data() + 2, dropped.size() - 2);
                    w.discard_document();
                }
                w.add_document(Split::Train, last.data(), last.size());
                w.commit({{"bos_id", 1}, {"eos_id", 2}});
            }
            EXPECT_EQ(dir_entries(dir / "a"), dir_entries(dir / "b"));
            for (const std::string& name : dir_entries(dir / "a"))
                EXPECT_EQ(read_file(dir / ("a/" + name)), read_file(dir / ("b/" + name))) << name;
        }
    }
}

}  // namespace
}  // namespace tmx

// libFuzzer target: the token-shard reader (engine/data/token_shards.h). Byte 0 picks what the rest
// is: a shard file (opened and read whole), or a dataset's meta.json (read, then the split
// opened against a valid one-token shard). Anything wrong must be a tmx::Error.
#include <cstdint>
#include <string>

#include "engine/core/errors.h"
#include "engine/data/dataset.h"
#include "engine/data/token_shards.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 1) return 0;
    const std::string_view rest = tmx::fuzz::as_text(data + 1, size - 1);
    try {
        if (data[0] % 2 == 0) {
            const tmx::TokenShard shard =
                tmx::TokenShard::open(tmx::fuzz::write_scratch("shard.bin", rest));
            const std::vector<int32_t> tokens = shard.to_vector();
            for (int32_t t : tokens)
                tmx::fuzz::require(t >= 0 && static_cast<uint64_t>(t) < shard.vocab_size(),
                                   "token outside the vocabulary");
        } else {
            static const bool shard_written = [] {
                tmx::write_token_shard(tmx::fuzz::scratch_dir() + "/train_000000.bin", 8, {1});
                return true;
            }();
            (void)shard_written;
            tmx::fuzz::write_scratch("meta.json", rest);
            const tmx::TokenDataset d = tmx::open_dataset(tmx::fuzz::scratch_dir(), "train");
            tmx::fuzz::require(d.to_vector().size() == d.size(), "dataset size");
        }
    } catch (const tmx::Error&) {
    }
    return 0;
}

// libFuzzer target: the Hugging Face shard index reader (engine/interop/hf_weights.h) on
// arbitrary index bytes, beside two small valid shards, and every tensor it accepts read.
// Anything wrong must be a tmx::Error.
#include <cstdint>
#include <vector>

#include "engine/core/errors.h"
#include "engine/interop/hf_weights.h"
#include "engine/model/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const bool shards = [] {
        const float a[] = {1, 2, 3, 4}, b[] = {5, 6};
        tmx::fuzz::write_scratch(
            "model-00001-of-00002.safetensors",
            tmx::encode_safetensors({{"a", {2, 2}, a}}, tmx::StorageType::F32));
        tmx::fuzz::write_scratch("model-00002-of-00002.safetensors",
                                 tmx::encode_safetensors({{"b", {2}, b}}, tmx::StorageType::BF16));
        return true;
    }();
    (void)shards;
    tmx::fuzz::write_scratch("model.safetensors.index.json", tmx::fuzz::as_text(data, size));
    try {
        const tmx::interop::HfWeights weights(tmx::fuzz::scratch_dir());
        std::vector<float> values;
        for (const auto& [name, file] : weights.tensors()) {
            values.resize(static_cast<size_t>(tmx::shape_numel(file->entry(name).shape)));
            file->read_f32(name, values.data());
        }
    } catch (const tmx::Error&) {
    }
    return 0;
}

// libFuzzer target: the safetensors reader (engine/model/safetensors.h) on arbitrary file bytes:
// the file is opened and every tensor it lists is read, as fp32 and as stored (U8 Q8_0 blocks
// included). Anything wrong must be a tmx::Error.
#include <cstdint>
#include <vector>

#include "engine/core/errors.h"
#include "engine/model/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    try {
        const tmx::SafetensorsFile file(
            tmx::fuzz::write_scratch("model.safetensors", tmx::fuzz::as_text(data, size)));
        std::vector<float> values;
        std::vector<uint8_t> raw;
        for (const auto& [name, entry] : file.entries()) {
            values.resize(static_cast<size_t>(tmx::shape_numel(entry.shape)));
            file.read_f32(name, values.data());
            raw.resize(entry.end - entry.begin);
            file.read_raw(name, raw.data());
        }
    } catch (const tmx::Error&) {
    }
    return 0;
}

// libFuzzer target: the safetensors reader (engine/model/safetensors.h) on arbitrary file bytes:
// the file is opened and every tensor it lists is read. Anything wrong must be a tmx::Error.
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
        for (const auto& [name, entry] : file.entries()) {
            values.resize(static_cast<size_t>(tmx::shape_numel(entry.shape)));
            file.read_f32(name, values.data());
        }
    } catch (const tmx::Error&) {
    }
    return 0;
}

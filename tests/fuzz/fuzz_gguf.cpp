// libFuzzer target: the GGUF reader (engine/interop/gguf.h) on arbitrary file bytes: the file is
// opened, every metadata value and array element is visited, and every tensor is read as fp32
// in chunks. Anything wrong must be a tmx::Error.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "engine/core/errors.h"
#include "engine/interop/gguf.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    try {
        const tmx::gguf::Reader file(
            tmx::fuzz::write_scratch("model.gguf", tmx::fuzz::as_text(data, size)));
        for (const auto& [key, value] : file.metadata()) {
            (void)value.type_name();
            for (uint64_t i = 0; i < value.size(); ++i) (void)value.at(i).type_name();
        }
        std::vector<float> values;
        for (const auto& t : file.tensors()) {
            // A tensor is inside the file, so its size is bounded by the input's.
            tmx::fuzz::require(t.bytes <= size, "tensor larger than the file");
            const uint64_t chunk = 4096;  // a multiple of Q8_0's 32
            values.resize(static_cast<size_t>(std::min(t.numel, chunk)));
            for (uint64_t first = 0; first < t.numel; first += chunk) {
                const uint64_t count = std::min(chunk, t.numel - first);
                file.read_f32(t, first, count, values.data());
            }
        }
    } catch (const tmx::Error&) {
    }
    return 0;
}

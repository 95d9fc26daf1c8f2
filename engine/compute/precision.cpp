#include "engine/compute/precision.h"

#include "engine/core/errors.h"

namespace tmx {

const char* to_string(Precision p) {
    return p == Precision::BF16 ? "bf16" : "fp32";
}

Precision parse_precision(const std::string& text, const std::string& what) {
    if (text == "fp32") return Precision::F32;
    if (text == "bf16") return Precision::BF16;
    throw Error(what + ": expected fp32 or bf16, got '" + text + "'");
}

}  // namespace tmx

// libFuzzer target: the config readers on arbitrary JSON: the native config (engine/model/config.h)
// and the parameter report's readers of Hugging Face and nanochat configs
// (engine/report/param_report.h). Anything wrong with the config must be a tmx::Error.
#include <cstdint>
#include <nlohmann/json.hpp>

#include "engine/core/errors.h"
#include "engine/model/config.h"
#include "engine/report/param_report.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const nlohmann::json j = nlohmann::json::parse(tmx::fuzz::as_text(data, size), nullptr,
                                                   /*allow_exceptions=*/false);
    if (j.is_discarded()) return 0;
    try {
        (void)tmx::config_from_json(j, "fuzz.json");
    } catch (const tmx::Error&) {
    }
    try {
        (void)tmx::build_param_report(j, "fuzz.json");
    } catch (const tmx::Error&) {
    }
    return 0;
}

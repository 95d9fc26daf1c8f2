// Flag-value parsing shared by the subcommands.
#include <cstdlib>
#include <string>
#include <vector>

#include "apps/commands.h"
#include "engine/errors.h"

namespace tmx::cli {

std::vector<int32_t> parse_id_list(const std::string& text, const char* flag) {
    std::vector<int32_t> out;
    size_t i = 0;
    while (i <= text.size()) {
        size_t j = text.find(',', i);
        if (j == std::string::npos) j = text.size();
        std::string item = text.substr(i, j - i);
        size_t a = item.find_first_not_of(" \t"), b = item.find_last_not_of(" \t");
        item = a == std::string::npos ? "" : item.substr(a, b - a + 1);
        char* end = nullptr;
        long long v = item.empty() ? -1 : std::strtoll(item.c_str(), &end, 10);
        if (item.empty() || *end != '\0' || v < 0 || v > INT32_MAX)
            throw UsageError(std::string(flag) + ": expected comma-separated token ids, got '" +
                             item + "'");
        out.push_back(static_cast<int32_t>(v));
        i = j + 1;
    }
    return out;
}

}  // namespace tmx::cli

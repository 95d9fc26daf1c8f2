// Internal helpers of the parameter report shared by the counters, the figures and the rendering:
// the group index, the overflow-checked counting arithmetic, number formatting and text tables.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "engine/core/checked_math.h"
#include "engine/core/format.h"
#include "engine/report/param_report.h"

namespace tmx::report_detail {

constexpr int idx(ParamGroup g) {
    return static_cast<int>(g);
}

// Counting arithmetic, overflow-checked: a config's sizes are arbitrary integers. count_model
// adds the file's name to the error.
inline constexpr const char* kCountContext = "the parameter count";
inline int64_t mul(int64_t a, int64_t b) {
    return checked_mul(a, b, kCountContext);
}
inline int64_t add(int64_t a, int64_t b) {
    return checked_add(a, b, kCountContext);
}
// dst += v, checked.
inline void accumulate(int64_t& dst, int64_t v) {
    dst = add(dst, v);
}

inline std::string fmt(int64_t v) {
    return with_thousands(v);
}

inline std::string fmt_si(double v, const char* unit) {
    static const char* prefixes[] = {"", "K", "M", "G", "T", "P", "E"};
    int p = 0;
    while (std::fabs(v) >= 1000 && p < 6) {
        v /= 1000;
        ++p;
    }
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.2f %s%s", v, prefixes[p], unit);
    return buf;
}

// Rows of cells aligned per `align` ('l' or 'r' per column; default: the first column left,
// the others right), indented by two spaces; an empty row is a rule.
void print_table(std::ostream& out, const std::vector<std::vector<std::string>>& rows,
                 const std::string& align = "");

}  // namespace tmx::report_detail

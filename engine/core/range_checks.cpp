#include "engine/core/range_checks.h"

#include <cmath>

#include "engine/core/errors.h"
#include "engine/core/format.h"

namespace tmx {

void RangeChecks::require(bool ok, const OptionText& name, const std::string& problem) const {
    if (ok) return;
    report_(name, problem);
    throw Error(name + ": " + problem);  // report_ must throw; never continue past a bad value
}

void RangeChecks::positive(int64_t v, const OptionText& name) const {
    require(v > 0, name, "must be positive, got " + std::to_string(v));
}

void RangeChecks::not_negative(int64_t v, const OptionText& name) const {
    require(v >= 0, name, "must not be negative, got " + std::to_string(v));
}

void RangeChecks::real(double v, bool in_range, const OptionText& name,
                       const std::string& expected) const {
    require(std::isfinite(v) && in_range, name,
            "must be a finite number " + expected + ", got " + format_real(v));
}

}  // namespace tmx

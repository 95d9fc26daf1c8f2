// The range rules for numbers that come from configs, option files and flags, written once. The
// caller says how a problem is reported (a config field error, a usage error for a flag); the
// rule says what the problem is: "must be positive, got 0".
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "engine/core/option_text.h"

namespace tmx {

class RangeChecks {
  public:
    // report(name, problem) must throw.
    using Report = std::function<void(const OptionText& name, const std::string& problem)>;
    explicit RangeChecks(Report report) : report_(std::move(report)) {}

    void positive(int64_t v, const OptionText& name) const;
    void not_negative(int64_t v, const OptionText& name) const;
    // A real number must be finite and in range. Finiteness is tested on its own: NaN fails every
    // comparison, so a range test written the wrong way round would let it through.
    // `expected` reads after "must be a finite number", e.g. "> 0" or "in [0, 1)".
    void real(double v, bool in_range, const OptionText& name, const std::string& expected) const;
    // Any other rule: reports `problem` under `name` when `ok` is false.
    void require(bool ok, const OptionText& name, const std::string& problem) const;

  private:
    Report report_;
};

}  // namespace tmx

#pragma once

#include "engine/core/errors.h"

namespace tmx {

// A metrics.jsonl write that failed: the run stops after a last checkpoint attempt.
class MetricsWriteError : public Error {
  public:
    using Error::Error;
};

}  // namespace tmx

// Errors the engine reports to users. Each carries its context (file, field, flag, tensor) in
// the message; the CLI turns it into one line and an exit code (2 for usage, 1 otherwise).
#pragma once

#include <stdexcept>
#include <string>

namespace tmx {

// Anything wrong with input data, files or the environment.
class Error : public std::runtime_error {
  public:
    using std::runtime_error::runtime_error;
};

// Wrong command-line usage (bad flag values, conflicting flags): exit code 2.
class UsageError : public Error {
  public:
    using Error::Error;
};

}  // namespace tmx

// SHA-256, for the tokenizer fingerprint a dataset records.
#pragma once

#include <string>
#include <string_view>

namespace tmx {

// SHA-256 of `data` as 64 lowercase hex digits.
std::string sha256_hex(std::string_view data);

}  // namespace tmx

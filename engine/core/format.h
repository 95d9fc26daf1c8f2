// Numbers and byte counts as the CLI and error messages print them.
#pragma once

#include <cstdint>
#include <string>

namespace tmx {

// "1234567" -> "1,234,567".
std::string with_thousands(int64_t v);
// Bytes in binary units: "512 B", "1.50 GiB".
std::string fmt_bytes(double bytes);
// A real number as printf's %g writes it, NaN as "NaN" (printf's "-nan" suggests a sign).
std::string format_real(double v);

}  // namespace tmx

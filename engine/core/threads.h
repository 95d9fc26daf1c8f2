// CPU thread count for the engine's own loops (OpenMP) and for BLAS.
#pragma once

namespace tmx {

// n <= 0 means all cores.
void set_num_threads(int n);
int num_threads();

}  // namespace tmx

#include "engine/core/threads.h"

#include <omp.h>

#include <algorithm>
#include <thread>

// OpenBLAS is linked as its OpenMP build (CMakeLists.txt): its GEMMs run on the engine's OpenMP
// thread pool, and single-threaded when called from inside one of the engine's parallel regions.
// It keeps its own thread count, read once at load time, so it is set here too.
extern "C" void openblas_set_num_threads(int num_threads);

namespace tmx {

void set_num_threads(int n) {
    if (n <= 0) n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    omp_set_num_threads(n);
    openblas_set_num_threads(n);
}

int num_threads() {
    return omp_get_max_threads();
}

}  // namespace tmx

#include "engine/threads.h"

#include <omp.h>

#include <algorithm>
#include <thread>

extern "C" void openblas_set_num_threads(int num_threads);

namespace tmx {

void set_num_threads(int n) {
    if (n <= 0) n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    omp_set_num_threads(n);
    openblas_set_num_threads(n);
}

int num_threads() { return omp_get_max_threads(); }

}  // namespace tmx

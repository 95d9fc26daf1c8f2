// TMX_HOST_DEVICE marks functions that the CUDA kernels and the CPU-side tests both compile:
// __host__ __device__ under nvcc, nothing in plain C++.
#pragma once

#if defined(__CUDACC__)
#define TMX_HOST_DEVICE __host__ __device__
#else
#define TMX_HOST_DEVICE
#endif

// Weights as stored (engine/compute/weight_format.h): f32, bf16, f16 and Q8_0, read by the
// CUDA kernels that take a weight (linear's matrix-vector path, the grouped matrix-vector
// kernel, gather_rows reading an embedding table) through one accessor per format, and decoded
// whole into a matmul operand where a product is large enough for cuBLASLt or the tiled kernels
// (prefill, training-sized batches). Each accessor returns the value the format holds, exactly:
// bf16 and f16 widened, Q8_0 as its block's f16 scale times the int8.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "backends/cuda/cuda_common.cuh"
#include "engine/compute/weight_format.h"

namespace tmx::cuda {

// ggml's block_q8_0: an f16 scale, then 32 int8 values; 34 bytes, 2-byte aligned (blocks follow
// each other with no padding, so a block's scale sits at an even byte).
struct Q8_0Block {
    __half d;
    int8_t q[kQ8_0BlockValues];
};
static_assert(sizeof(Q8_0Block) == kQ8_0BlockBytes && alignof(Q8_0Block) == 2);

// Element i of a weight held as T (float, __nv_bfloat16 or __half), or as Q8_0 blocks.
template <typename T>
struct WeightReader {
    const T* p;
    __device__ __forceinline__ float operator[](int64_t i) const {
        if constexpr (std::is_same_v<T, __half>)
            return __half2float(p[i]);
        else
            return to_float(p[i]);
    }
};
template <>
struct WeightReader<Q8_0Block> {
    const Q8_0Block* p;
    __device__ __forceinline__ float operator[](int64_t i) const {
        const Q8_0Block& b = p[i / kQ8_0BlockValues];
        return __half2float(b.d) * static_cast<float>(b.q[i % kQ8_0BlockValues]);
    }
};

// Whether t is held in a format the plain float paths do not read: F16 and Q8_0 always, and
// BF16 where the precision does not take bf16 operands (fp32 precision).
inline bool is_stored_weight(const Tensor& t, bool bf16_operands) {
    return t.dtype() == DType::F16 || t.dtype() == DType::Q8_0 ||
           (t.dtype() == DType::BF16 && !bf16_operands);
}

// Calls f with a WeightReader over t's data, in t's format (F32, BF16, F16 or Q8_0): launches a
// kernel templated on the reader.
template <typename F>
void with_weight_reader(const Tensor& t, F&& f) {
    switch (t.dtype()) {
        case DType::BF16:
            return f(WeightReader<__nv_bfloat16>{CudaBackend::data<__nv_bfloat16>(t)});
        case DType::F16:
            return f(WeightReader<__half>{CudaBackend::data<__half>(t)});
        case DType::Q8_0:
            return f(WeightReader<Q8_0Block>{CudaBackend::data<Q8_0Block>(t)});
        default:
            return f(WeightReader<float>{CudaBackend::data<float>(t)});
    }
}

// t's values decoded into a new tensor of its shape in pool memory: F32, or in bf16 precision
// BF16 (rounded to nearest even, as the matmuls round an F32 operand), for the products large
// enough for cuBLASLt or the tiled kernels. Defined in weight_matmul.cu.
Tensor decode_weight(CudaBackend& be, const Tensor& t, bool to_bf16, const char* op);

}  // namespace tmx::cuda

// cp.async: copies from global to shared memory that bypass registers (sm_80 and newer), the
// staging of the tensor-core kernels (matmul_bf16.cuh, attention_bf16.cuh).
#pragma once

namespace tmx::cuda {

// 16 bytes from global to shared memory; with in_range false, 16 zero bytes (cp.async's zero
// fill: nothing is read, src need only be a valid address).
__device__ __forceinline__ void copy16_async(void* dst, const void* src, bool in_range) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src),
                 "r"(in_range ? 16 : 0));
}
// Closes the group of copies issued since the last commit.
__device__ __forceinline__ void commit_async() {
    asm volatile("cp.async.commit_group;\n" ::);
}
// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void wait_async() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

}  // namespace tmx::cuda

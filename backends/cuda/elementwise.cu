// The CUDA backend's elementwise ops, forward and backward side by side: fill, convert,
// activation (+ backward), swiglu (+ backward), add.
// Their CPU twins are in backends/cpu/cpu_backend.cpp; the scalar math is shared in
// cuda_math.h.
//
// Elementwise kernels are grid-stride loops over 64-bit indices (tensors of up to ~2e9
// elements) with scalar loads: views may start at any 4-byte offset, and these kernels are
// bound by memory bandwidth, which scalar loads in a full grid already come close to. The
// forward activations may store a BF16 out (templated on the output type, the fp32 arithmetic
// unchanged). convert, whose bf16 side would take 2-byte accesses, moves 8 elements a thread in
// 16-byte accesses where the views' alignment allows (far fewer memory instructions).
#include <bit>
#include <cstdint>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/cuda_math.h"

namespace tmx {
namespace {

using cuda::ActivationFn;

constexpr int kThreads = 256;

// Elementwise launches: a grid-stride loop in blocks of kThreads.
unsigned elementwise_blocks(int64_t n, int sm_count) {
    return cuda::elementwise_blocks(n, kThreads, sm_count);
}
using cuda::grid_start;
using cuda::grid_stride;

// ---- fill

template <typename T>
__global__ void fill_kernel(T* p, int64_t n, T value) {
    for (int64_t i = grid_start(); i < n; i += grid_stride()) p[i] = value;
}

// ---- convert

// dst[i] = src[i], F32 to BF16 (rounded) or BF16 to F32 (exact), 8 elements a thread per step:
// in 16-byte accesses where both pointers are 16-byte aligned (vec; the chunks then all are),
// one by one otherwise and for the last n % 8.
template <typename Src, typename Dst>
__global__ void convert_kernel(const Src* src, Dst* dst, int64_t n, bool vec) {
    const int64_t chunks = (n + 7) / 8;
    for (int64_t i = grid_start(); i < chunks; i += grid_stride()) {
        const int64_t first = i * 8;
        if (vec && first + 8 <= n) {
            float f[8];
            cuda::load8_aligned(src + first, f);
            cuda::store8_aligned(dst + first, f);
        } else {
            for (int64_t j = first; j < n && j < first + 8; ++j)
                cuda::store_as(dst + j, cuda::to_float(src[j]));
        }
    }
}

// ---- activations

// OutT: float, or __nv_bfloat16 for a BF16 out (the fp32 value rounded as it is stored).
template <Activation A, typename OutT>
__global__ void activation_kernel(const float* x, OutT* out, int64_t n) {
    for (int64_t i = grid_start(); i < n; i += grid_stride())
        cuda::store_as(out + i, ActivationFn<A>::value(x[i]));
}

// d_x += act'(x) * d_out.
template <Activation A>
__global__ void activation_backward_kernel(const float* x, const float* d_out, float* d_x,
                                           int64_t n) {
    for (int64_t i = grid_start(); i < n; i += grid_stride())
        d_x[i] += ActivationFn<A>::derivative(x[i]) * d_out[i];
}

// OutT as for activation_kernel.
template <typename OutT>
__global__ void swiglu_kernel(const float* gate, const float* up, OutT* out, int64_t n) {
    for (int64_t i = grid_start(); i < n; i += grid_stride())
        cuda::store_as(out + i, cuda::silu(gate[i]) * up[i]);
}

// d_gate += silu'(gate) * up * d_out, d_up += silu(gate) * d_out (the CPU's order of products).
__global__ void swiglu_backward_kernel(const float* gate, const float* up, const float* d_out,
                                       float* d_gate, float* d_up, int64_t n) {
    for (int64_t i = grid_start(); i < n; i += grid_stride()) {
        const float g = gate[i], dy = d_out[i];
        d_gate[i] += cuda::silu_derivative(g) * up[i] * dy;
        d_up[i] += cuda::silu(g) * dy;
    }
}

// out = a + b; out may alias a or b: each element is read, then written, by one thread.
__global__ void add_kernel(const float* a, const float* b, float* out, int64_t n) {
    for (int64_t i = grid_start(); i < n; i += grid_stride()) out[i] = a[i] + b[i];
}

}  // namespace

void CudaBackend::fill_impl(const Tensor& dst, float value) {
    const int64_t n = dst.numel();
    if (n == 0) return;
    const unsigned blocks = elementwise_blocks(n, device().sm_count);
    if (dst.dtype() == DType::I32) {
        int32_t* p = data<int32_t>(dst);
        const int32_t v = static_cast<int32_t>(value);  // as the CPU backend converts it
        if (v == 0) {                                   // zeroing (the common case) as a memset
            TMX_CUDA_CHECK("fill", cudaMemsetAsync(p, 0, dst.bytes(), stream()));
        } else {
            fill_kernel<<<blocks, kThreads, 0, stream()>>>(p, n, v);
        }
    } else {
        float* p = data<float>(dst);
        if (std::bit_cast<uint32_t>(value) == 0) {  // +0.0f only: -0.0f has the sign bit set
            TMX_CUDA_CHECK("fill", cudaMemsetAsync(p, 0, dst.bytes(), stream()));
        } else {
            fill_kernel<<<blocks, kThreads, 0, stream()>>>(p, n, value);
        }
    }
    check_launch("fill");
}

void CudaBackend::convert_impl(const Tensor& src, const Tensor& dst) {
    const int64_t n = src.numel();
    if (n == 0) return;
    const unsigned blocks = elementwise_blocks((n + 7) / 8, device().sm_count);
    const auto launch = [&](const auto* s, auto* d) {
        const bool vec = cuda::aligned16(s) && cuda::aligned16(d);
        convert_kernel<<<blocks, kThreads, 0, stream()>>>(s, d, n, vec);
    };
    if (src.dtype() == DType::F32)
        launch(data<float>(src), data<__nv_bfloat16>(dst));
    else
        launch(data<__nv_bfloat16>(src), data<float>(dst));
    check_launch("convert");
}

void CudaBackend::activation_impl(Activation act, const Tensor& x, const Tensor& out) {
    const int64_t n = x.numel();
    if (n == 0) return;
    const unsigned blocks = elementwise_blocks(n, device().sm_count);
    const float* xp = data<float>(x);
    cuda::with_float_data(out, [&](auto* op) {
        switch (act) {
            case Activation::Gelu:
                activation_kernel<Activation::Gelu><<<blocks, kThreads, 0, stream()>>>(xp, op, n);
                break;
            case Activation::Silu:
                activation_kernel<Activation::Silu><<<blocks, kThreads, 0, stream()>>>(xp, op, n);
                break;
            case Activation::Relu:
                activation_kernel<Activation::Relu><<<blocks, kThreads, 0, stream()>>>(xp, op, n);
                break;
            case Activation::Relu2:
                activation_kernel<Activation::Relu2><<<blocks, kThreads, 0, stream()>>>(xp, op, n);
                break;
        }
    });
    check_launch("activation");
}

void CudaBackend::activation_backward_impl(Activation act, const Tensor& x, const Tensor& d_out,
                                           const Tensor& d_x) {
    const int64_t n = x.numel();
    if (n == 0) return;
    const unsigned blocks = elementwise_blocks(n, device().sm_count);
    const float* xp = data<float>(x);
    const float* dy = data<float>(d_out);
    float* dx = data<float>(d_x);
    switch (act) {
        case Activation::Gelu:
            activation_backward_kernel<Activation::Gelu>
                <<<blocks, kThreads, 0, stream()>>>(xp, dy, dx, n);
            break;
        case Activation::Silu:
            activation_backward_kernel<Activation::Silu>
                <<<blocks, kThreads, 0, stream()>>>(xp, dy, dx, n);
            break;
        case Activation::Relu:
            activation_backward_kernel<Activation::Relu>
                <<<blocks, kThreads, 0, stream()>>>(xp, dy, dx, n);
            break;
        case Activation::Relu2:
            activation_backward_kernel<Activation::Relu2>
                <<<blocks, kThreads, 0, stream()>>>(xp, dy, dx, n);
            break;
    }
    check_launch("activation_backward");
}

void CudaBackend::swiglu_impl(const Tensor& gate, const Tensor& up, const Tensor& out) {
    const int64_t n = gate.numel();
    if (n == 0) return;
    cuda::with_float_data(out, [&](auto* op) {
        swiglu_kernel<<<elementwise_blocks(n, device().sm_count), kThreads, 0, stream()>>>(
            data<float>(gate), data<float>(up), op, n);
    });
    check_launch("swiglu");
}

void CudaBackend::swiglu_backward_impl(const Tensor& gate, const Tensor& up, const Tensor& d_out,
                                       const Tensor& d_gate, const Tensor& d_up) {
    const int64_t n = gate.numel();
    if (n == 0) return;
    swiglu_backward_kernel<<<elementwise_blocks(n, device().sm_count), kThreads, 0, stream()>>>(
        data<float>(gate), data<float>(up), data<float>(d_out), data<float>(d_gate),
        data<float>(d_up), n);
    check_launch("swiglu_backward");
}

void CudaBackend::add_impl(const Tensor& a, const Tensor& b, const Tensor& out) {
    const int64_t n = a.numel();
    if (n == 0) return;
    add_kernel<<<elementwise_blocks(n, device().sm_count), kThreads, 0, stream()>>>(
        data<float>(a), data<float>(b), data<float>(out), n);
    check_launch("add");
}

}  // namespace tmx

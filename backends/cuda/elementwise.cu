// The CUDA backend's elementwise ops and the embedding, forward and backward side by side:
// fill, convert, embedding (+ backward), activation (+ backward), swiglu (+ backward), add.
// Their CPU twins are in backends/cpu/cpu_backend.cpp; the scalar math is shared in
// cuda_math.h.
//
// Elementwise kernels are grid-stride loops over 64-bit indices (tensors of up to ~2e9
// elements) with scalar loads: views may start at any 4-byte offset, and these kernels are
// bound by memory bandwidth, which scalar loads in a full grid already come close to. The
// forward activations may store a BF16 out (templated on the output type, the fp32 arithmetic
// unchanged). convert, whose bf16 side would take 2-byte accesses, moves 8 elements a thread in
// 16-byte accesses where the views' alignment allows (far fewer memory instructions).
#include <algorithm>
#include <bit>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/cuda_math.h"
#include "backends/cuda/weights.cuh"

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

// ---- embedding

// out[n, :] = table[ids[n], :], one block per row (grid-stride over rows), the table read in
// its format (weights.cuh: a 16- or 8-bit table's rows decoded exactly). A bad id is reported
// and its row left as it was.
template <typename TableReader>
__global__ void embedding_kernel(TableReader table, const int32_t* ids, float* out, int64_t N,
                                 int64_t d, int V, int* status) {
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
        const int32_t id = ids[n];
        if (id < 0 || id >= V) {  // the same for the whole block
            if (threadIdx.x == 0) cuda::report_error(status, cuda::kBadTokenId, id, V);
            continue;
        }
        const int64_t src = static_cast<int64_t>(id) * d;
        float* dst = out + n * d;
        for (int64_t c = threadIdx.x; c < d; c += blockDim.x) dst[c] = table[src + c];
    }
}

// Sort keys for the backward: the id, or V for a bad id (reported here once per token and
// skipped later: V sorts after every valid id). values = the token index n, so that a stable
// sort by id keeps each id's tokens in n order.
__global__ void embedding_sort_keys_kernel(const int32_t* ids, int64_t N, int V, uint32_t* keys,
                                           int32_t* token, int* status) {
    for (int64_t n = grid_start(); n < N; n += grid_stride()) {
        const int32_t id = ids[n];
        const bool ok = id >= 0 && id < V;
        if (!ok) cuda::report_error(status, cuda::kBadTokenId, id, V);
        keys[n] = ok ? static_cast<uint32_t>(id) : static_cast<uint32_t>(V);
        token[n] = static_cast<int32_t>(n);
    }
}

// d_table[id, :] += d_out[n, :] for every token n of id, in n order, in one pass per run of
// equal ids of the sorted keys: one block owns a run (and a tile of columns), so each row of
// d_table has a single writer and no atomics are needed. Starting from the row's old value and
// adding the tokens one by one in n order is exactly the CPU's loop: bitwise the same result.
// blockIdx.x walks the sorted positions (grid-stride) and works where a run starts; blockIdx.y
// walks tiles of columns.
__global__ void embedding_backward_kernel(const uint32_t* sorted_ids, const int32_t* sorted_token,
                                          int64_t N, int64_t d, uint32_t V, const float* d_out,
                                          float* d_table) {
    for (int64_t pos = blockIdx.x; pos < N; pos += gridDim.x) {
        const uint32_t id = sorted_ids[pos];
        // Uniform over the block: not the start of a run, or the run of bad ids.
        if (id >= V || (pos > 0 && sorted_ids[pos - 1] == id)) continue;
        float* row = d_table + static_cast<int64_t>(id) * d;
        for (int64_t c = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; c < d;
             c += static_cast<int64_t>(gridDim.y) * blockDim.x) {
            float acc = row[c];
            for (int64_t i = pos; i < N && sorted_ids[i] == id; ++i)
                acc += d_out[static_cast<int64_t>(sorted_token[i]) * d + c];
            row[c] = acc;
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

void CudaBackend::embedding_impl(const Tensor& table, const Tensor& ids, const Tensor& out) {
    const int64_t N = ids.dim(0), d = table.dim(1);
    const int V = cuda::to_int(table.dim(0), "embedding");
    if (N == 0) return;
    // Threads over the row's columns: a warp at least, 256 at most (d = 512: 2 per thread).
    const int threads = static_cast<int>(std::clamp<int64_t>((d + 31) / 32 * 32, 32, kThreads));
    cuda::with_weight_reader(table, [&](auto reader) {
        embedding_kernel<<<cuda::blocks_for(N, 1), threads, 0, stream()>>>(
            reader, data<int32_t>(ids), data<float>(out), N, d, V, status_word());
    });
    check_launch("embedding");
}

// Deterministic without float atomics (token ids repeat within a batch): sort the (id, n)
// pairs by id with a stable radix sort, then one block per run of equal ids adds that id's
// d_out rows in n order into its d_table row, once.
void CudaBackend::embedding_backward_impl(const Tensor& ids, const Tensor& d_out,
                                          const Tensor& d_table) {
    const char* op = "embedding_backward";
    const int N = cuda::to_int(ids.dim(0), op);  // also the sort's item count
    const int V = cuda::to_int(d_table.dim(0), op);
    const int64_t d = d_table.dim(1);
    if (N == 0) return;
    const int sm = device().sm_count;

    Tensor keys = alloc({N}, DType::I32), token = alloc({N}, DType::I32);
    Tensor sorted_keys = alloc({N}, DType::I32), sorted_token = alloc({N}, DType::I32);
    uint32_t* keys_p = data<uint32_t>(keys);
    uint32_t* sorted_keys_p = data<uint32_t>(sorted_keys);
    embedding_sort_keys_kernel<<<elementwise_blocks(N, sm), kThreads, 0, stream()>>>(
        data<int32_t>(ids), N, V, keys_p, data<int32_t>(token), status_word());
    check_launch(op);
    if (d == 0) return;  // bad ids are reported; nothing to add

    // Keys are in [0, V] (V marks bad ids): sorting only their low bits saves radix passes
    // (V = 32000: 15 bits, 2 passes instead of 4). LSD radix sort is stable: equal ids keep
    // their tokens in n order.
    const int end_bit = std::max(1, static_cast<int>(std::bit_width(static_cast<uint32_t>(V))));
    size_t temp_bytes = 0;
    TMX_CUDA_CHECK(op, cub::DeviceRadixSort::SortPairs(
                           nullptr, temp_bytes, keys_p, sorted_keys_p, data<int32_t>(token),
                           data<int32_t>(sorted_token), N, 0, end_bit, stream()));
    Tensor temp = alloc({static_cast<int64_t>((temp_bytes + 3) / 4)}, DType::I32);
    TMX_CUDA_CHECK(
        op, cub::DeviceRadixSort::SortPairs(data<int32_t>(temp), temp_bytes, keys_p, sorted_keys_p,
                                            data<int32_t>(token), data<int32_t>(sorted_token), N, 0,
                                            end_bit, stream()));
    check_launch(op);

    // x: sorted positions (runs start at some of them; at most V + 1 runs), capped at a few
    // blocks per SM; y: tiles of kThreads columns (d = 8192: 32 tiles).
    const int64_t runs_max = std::min<int64_t>(N, static_cast<int64_t>(V) + 1);
    const dim3 grid(static_cast<unsigned>(std::min<int64_t>(runs_max, 32LL * sm)),
                    std::min(cuda::blocks_for(d, kThreads), 65535u));
    embedding_backward_kernel<<<grid, kThreads, 0, stream()>>>(
        sorted_keys_p, data<int32_t>(sorted_token), N, d, static_cast<uint32_t>(V),
        data<float>(d_out), data<float>(d_table));
    check_launch(op);
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

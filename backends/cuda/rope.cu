// CUDA rotary position embedding, rotate-half layout (CPU twin: backends/cpu/rope.cpp).
//
// Angles as the CPU forms them: inv_freq = 1 / theta^(2i/hd) and angle = pos * inv_freq in
// double, then cos and sin rounded to float. At position 1e6 an fp32 angle would be off by
// ~0.06 rad; the double one is off by ~1e-10.
#include <cstdint>
#include <stdexcept>
#include <string>

#include "backends/cuda/cuda_common.cuh"

namespace tmx {
namespace {

constexpr int kThreads = 256;
// The per-block table of frequencies is `half` doubles of shared memory: 48 KiB (the default
// limit) holds head_dim up to 12288.
constexpr int kMaxHalf = (48 * 1024) / static_cast<int>(sizeof(double));

constexpr double kInvPi = 0.318309886183790671537767526745;  // 1 / pi

// One thread per (token n, pair i): it forms the angle once and rotates pair i of each of the
// token's H heads. Consecutive threads take consecutive i: coalesced reads and writes.
__global__ void rope_kernel(float* x, const int32_t* positions, int64_t N, int H, int half,
                            double theta, bool inverse, int* status) {
    // inv_freq[i] / pi: the angle in units of pi, for sincospi (below).
    extern __shared__ double freq_over_pi[];
    const int hd = 2 * half;
    for (int i = threadIdx.x; i < half; i += blockDim.x)
        freq_over_pi[i] = (1.0 / pow(theta, static_cast<double>(2 * i) / hd)) * kInvPi;
    __syncthreads();

    const int64_t pairs = N * half;
    for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < pairs;
         k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t n = k / half;
        const int i = static_cast<int>(k % half);
        const int32_t pos = positions[n];
        if (pos < 0) {  // leave the row as it is
            if (i == 0) cuda::report_error(status, cuda::kBadPosition, pos, 0);
            continue;
        }
        // sincospi(pos * inv_freq / pi) = sincos(pos * inv_freq) up to ~1e-16 relative in the
        // angle. Not sincos: double sincos carries a Payne-Hanek reduction with a local-memory
        // array (a build error under -warn-lmem-usage) for large arguments; sincospi's
        // reduction is exact and needs none. Both are the precise (not fast-math) versions.
        double s, c;
        sincospi(static_cast<double>(pos) * freq_over_pi[i], &s, &c);
        const float cf = static_cast<float>(c);
        const float sf = static_cast<float>(inverse ? -s : s);
        float* v = x + n * H * hd + i;
        for (int h = 0; h < H; ++h, v += hd) {
            const float x1 = v[0], x2 = v[half];
            v[0] = x1 * cf - x2 * sf;
            v[half] = x2 * cf + x1 * sf;
        }
    }
}

}  // namespace

void CudaBackend::rope_impl(const Tensor& x, const Tensor& positions, double theta, bool inverse) {
    const char* op = "rope";
    const int64_t N = x.dim(0);
    const int H = cuda::to_int(x.dim(1), op);
    const int half = cuda::to_int(x.dim(2) / 2, op);  // head_dim is even (checked by the base)
    if (N == 0 || H == 0 || half == 0) return;
    if (half > kMaxHalf)
        throw std::logic_error("cuda rope: head_dim " + std::to_string(x.dim(2)) +
                               " is above the supported " + std::to_string(2 * kMaxHalf));
    const size_t shared = static_cast<size_t>(half) * sizeof(double);
    rope_kernel<<<cuda::blocks_for(N * half, kThreads), kThreads, shared, stream()>>>(
        data<float>(x), data<int32_t>(positions), N, H, half, theta, inverse, status_word());
    check_launch(op);
}

}  // namespace tmx

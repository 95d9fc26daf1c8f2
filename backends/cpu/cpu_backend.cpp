// CPU backend: memory, transfers and the elementwise ops.
#include "backends/cpu/cpu_backend.h"

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <new>
#include <string>

#include "backends/cpu/cpu_math.h"

namespace tmx {
namespace {

// 64-byte aligned host memory, so BLAS and the vectorised loops see aligned rows.
class CpuBuffer final : public DeviceBuffer {
  public:
    explicit CpuBuffer(size_t bytes)
        : DeviceBuffer(bytes),
          data_(
              static_cast<std::byte*>(::operator new[](bytes ? bytes : 1, std::align_val_t{64}))) {}
    ~CpuBuffer() override { ::operator delete[](data_, std::align_val_t{64}); }
    std::byte* data() const { return data_; }

  private:
    std::byte* data_;
};

// Elementwise loops run in parallel only when there is enough work to pay for the threads.
constexpr int64_t kParallelElements = 1 << 15;

// y[i] = f(x[i]). Plain pointer arguments (not a lambda's captures) let the compiler see
// contiguous rows and vectorise f; captured pointers made it gather and scatter.
template <class F>
void map_elementwise(const float* x, float* y, int64_t n, F f) {
#pragma omp parallel for simd schedule(static) if (n > kParallelElements)
    for (int64_t i = 0; i < n; ++i) y[i] = f(x[i]);
}

// dx[i] += df(x[i]) * dy[i]: the backward of y = f(x), given df = f'.
template <class F>
void add_derivative_times(const float* x, const float* dy, float* dx, int64_t n, F df) {
#pragma omp parallel for simd schedule(static) if (n > kParallelElements)
    for (int64_t i = 0; i < n; ++i) dx[i] += df(x[i]) * dy[i];
}

}  // namespace

std::byte* CpuBackend::host_ptr(const Tensor& t) {
    auto* buf = static_cast<CpuBuffer*>(t.buffer());
    return buf->data() + static_cast<size_t>(dtype_bytes(t.dtype(), t.offset()));
}

uint64_t parse_cgroup_memory_limit(std::string_view text) {
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
    if (text.empty() || text.size() > 20) return 0;
    uint64_t value = 0;
    for (char ch : text) {
        if (ch < '0' || ch > '9') return 0;  // "max", a sign, anything else
        if (__builtin_mul_overflow(value, uint64_t{10}, &value) ||
            __builtin_add_overflow(value, static_cast<uint64_t>(ch - '0'), &value))
            return 0;
    }
    return value;
}

uint64_t CpuBackend::memory_capacity() const {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
    uint64_t capacity =
        pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
    for (const char* path :
         {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
        std::ifstream in(path);
        std::string text;
        if (!in || !std::getline(in, text)) continue;
        const uint64_t limit = parse_cgroup_memory_limit(text);
        if (limit > 0 && (capacity == 0 || limit < capacity)) capacity = limit;
    }
    return capacity;
}

std::shared_ptr<DeviceBuffer> CpuBackend::alloc_impl(size_t bytes) {
    return std::make_shared<CpuBuffer>(bytes);
}

void CpuBackend::upload_impl(const Tensor& dst, const void* host) {
    std::memcpy(host_ptr(dst), host, dst.bytes());
}

void CpuBackend::download_impl(const Tensor& src, void* host) {
    std::memcpy(host, host_ptr(src), src.bytes());
}

void CpuBackend::fill_impl(const Tensor& dst, float value) {
    const int64_t n = dst.numel();
    if (dst.dtype() == DType::I32) {
        int32_t* q = data<int32_t>(dst);
        const int32_t v = static_cast<int32_t>(value);
#pragma omp parallel for simd schedule(static) if (n > kParallelElements)
        for (int64_t i = 0; i < n; ++i) q[i] = v;
        return;
    }
    float* p = data<float>(dst);
#pragma omp parallel for simd schedule(static) if (n > kParallelElements)
    for (int64_t i = 0; i < n; ++i) p[i] = value;
}

void CpuBackend::copy_impl(const Tensor& src, const Tensor& dst) {
    std::memmove(host_ptr(dst), host_ptr(src), src.bytes());
}

void cpu_round_to_bf16(const float* in, uint16_t* out, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > kParallelElements)
    for (int64_t i = 0; i < n; ++i) out[i] = to_bf16_bits(in[i]);
}

void cpu_widen_bf16(const uint16_t* in, float* out, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > kParallelElements)
    for (int64_t i = 0; i < n; ++i) out[i] = from_bf16_bits(in[i]);
}

void CpuBackend::convert_impl(const Tensor& src, const Tensor& dst) {
    if (src.dtype() == DType::F32)
        cpu_round_to_bf16(data<float>(src), data<uint16_t>(dst), src.numel());
    else
        cpu_widen_bf16(data<uint16_t>(src), data<float>(dst), src.numel());
}

CpuOutput::CpuOutput(const Tensor& out) : out_(out) {
    if (out.dtype() == DType::BF16) {
        scratch_.resize(static_cast<size_t>(out.numel()));
        data_ = scratch_.data();
    } else {
        data_ = CpuBackend::data<float>(out);
    }
}

void CpuOutput::store() {
    if (out_.dtype() == DType::BF16)
        cpu_round_to_bf16(scratch_.data(), CpuBackend::data<uint16_t>(out_), out_.numel());
}

void CpuBackend::activation_impl(Activation act, const Tensor& x, const Tensor& out) {
    CpuOutput result(out);
    cpu::with_activation(
        act, [&](auto fn, auto) { map_elementwise(data<float>(x), result.data(), x.numel(), fn); });
    result.store();
}

void CpuBackend::swiglu_impl(const Tensor& gate, const Tensor& up, const Tensor& out) {
    const float* g = data<float>(gate);
    const float* u = data<float>(up);
    CpuOutput result(out);
    float* o = result.data();
    int64_t n = gate.numel();
#pragma omp parallel for simd schedule(static) if (n > kParallelElements)
    for (int64_t i = 0; i < n; ++i) o[i] = cpu::silu(g[i]) * u[i];
    result.store();
}

void CpuBackend::add_impl(const Tensor& a, const Tensor& b, const Tensor& out) {
    const float* x = data<float>(a);
    const float* y = data<float>(b);
    float* o = data<float>(out);
    int64_t n = a.numel();
#pragma omp parallel for simd schedule(static) if (n > kParallelElements)
    for (int64_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
}

void CpuBackend::activation_backward_impl(Activation act, const Tensor& x, const Tensor& d_out,
                                          const Tensor& d_x) {
    cpu::with_activation(act, [&](auto, auto derivative) {
        add_derivative_times(data<float>(x), data<float>(d_out), data<float>(d_x), x.numel(),
                             derivative);
    });
}

void CpuBackend::swiglu_backward_impl(const Tensor& gate, const Tensor& up, const Tensor& d_out,
                                      const Tensor& d_gate, const Tensor& d_up) {
    const float* g = data<float>(gate);
    const float* u = data<float>(up);
    const float* dy = data<float>(d_out);
    float* dg = data<float>(d_gate);
    float* du = data<float>(d_up);
    const int64_t n = gate.numel();
#pragma omp parallel for simd schedule(static) if (n > kParallelElements)
    for (int64_t i = 0; i < n; ++i) {
        dg[i] += cpu::silu_derivative(g[i]) * u[i] * dy[i];
        du[i] += cpu::silu(g[i]) * dy[i];
    }
}

void CpuBackend::scale_impl(const Tensor& x, float s) {
    float* p = data<float>(x);
    const int64_t n = x.numel();
#pragma omp parallel for simd schedule(static) if (n > kParallelElements)
    for (int64_t i = 0; i < n; ++i) p[i] *= s;
}

void CpuBackend::sum_squares_impl(const Tensor& x, const Tensor& out) {
    // Fixed-size blocks summed in a fixed order: the result does not depend on thread count.
    constexpr int64_t kBlock = 1 << 14;
    const float* p = data<float>(x);
    const int64_t n = x.numel(), blocks = (n + kBlock - 1) / kBlock;
    std::vector<double> partial(static_cast<size_t>(blocks));
#pragma omp parallel for schedule(static) if (blocks > 1)
    for (int64_t b = 0; b < blocks; ++b) {
        double s = 0.0;
        for (int64_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i)
            s += static_cast<double>(p[i]) * p[i];
        partial[b] = s;
    }
    double total = 0.0;
    for (double s : partial) total += s;
    *data<float>(out) = static_cast<float>(total);
}

void CpuBackend::adamw_impl(const Tensor& params, const Tensor& grads, const Tensor& m,
                            const Tensor& v, const AdamWParams& hp) {
    float* p = data<float>(params);
    const float* g = data<float>(grads);
    float* mp = data<float>(m);
    float* vp = data<float>(v);
    const int64_t n = params.numel();
    const double bc1 = 1.0 - std::pow(static_cast<double>(hp.beta1), static_cast<double>(hp.step));
    const double bc2 = 1.0 - std::pow(static_cast<double>(hp.beta2), static_cast<double>(hp.step));
    const float step_size = static_cast<float>(hp.lr / bc1);
    const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
    const float keep = 1.0f - hp.lr * hp.weight_decay;  // decoupled weight decay
#pragma omp parallel for simd schedule(static) if (n > kParallelElements)
    for (int64_t i = 0; i < n; ++i) {
        const float gi = g[i] * hp.grad_scale;
        p[i] *= keep;
        mp[i] = hp.beta1 * mp[i] + (1.0f - hp.beta1) * gi;
        vp[i] = hp.beta2 * vp[i] + (1.0f - hp.beta2) * gi * gi;
        p[i] -= step_size * mp[i] / (std::sqrt(vp[i]) / bc2_sqrt + hp.eps);
    }
}

}  // namespace tmx

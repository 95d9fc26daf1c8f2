// The CPU backend: fp32, multi-threaded (OpenMP for the engine's loops, OpenBLAS for dense
// matmuls), and simple enough to trust: it is the oracle every other backend is tested against.
// Ops run at once when enqueued, so synchronize() has nothing to wait for.
#pragma once

#include <string_view>
#include <vector>

#include "engine/compute/backend.h"

namespace tmx {

// The limit a cgroup memory file states (v2 memory.max, v1 memory.limit_in_bytes), in bytes:
// its decimal number, or 0 for "max" and for anything that is not a whole number of bytes.
uint64_t parse_cgroup_memory_limit(std::string_view text);

class CpuBackend : public Backend {
  public:
    std::string name() const override { return "cpu"; }
    std::string description() const override {
        return std::string("cpu, ") + to_string(matmul_precision()) + " matmuls";
    }
    bool supports_training() const override { return true; }
    bool supports_precision(Precision) const override { return true; }
    bool supports_weight_format(DType) const override { return true; }
    // Physical memory, or the cgroup's limit (a container's) when that is lower.
    uint64_t memory_capacity() const override;
    void synchronize() override {}

    // Host pointer to a CPU tensor's first element (for the CPU backend's own ops and tests).
    template <typename T>
    static T* data(const Tensor& t) {
        return reinterpret_cast<T*>(host_ptr(t));
    }

  protected:
    // Every op (engine/compute/backend_ops.h), training and bf16 conversion included, and a
    // linear() that reads weights stored in bf16, f16 and q8_0 (cpu_weight_matmul_nt).
    TMX_BACKEND_TRAINING_BACKEND_OVERRIDES
    void linear_impl(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y,
                     bool accumulate) override;

  private:
    static std::byte* host_ptr(const Tensor& t);
};

// Row-major single-precision GEMM on host pointers: C[M,N] = alpha op(A) op(B) + beta C.
// Shared by the dense and grouped matmuls.
void cpu_sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const float* A, const float* B, float beta, float* C);

// The values a product multiplies for the operand t under precision p: an F32 t's own in fp32;
// in bf16, a copy rounded to bf16 held in `rounded`; a BF16 t's values (exact) in `rounded`.
// Shared by the matmuls and attention.
const float* cpu_operand(Precision p, const Tensor& t, std::vector<float>& rounded);

// n floats rounded to bf16 patterns (round_to_bf16), and n bf16 patterns widened to floats.
void cpu_round_to_bf16(const float* in, uint16_t* out, int64_t n);
void cpu_widen_bf16(const uint16_t* in, float* out, int64_t n);

// Where an op writes its fp32 results: into out itself when out is F32; for a BF16 out, into
// scratch that store() then rounds into out. The arithmetic is the same either way, so a BF16
// out holds exactly the rounding of what an F32 out would.
class CpuOutput {
  public:
    explicit CpuOutput(const Tensor& out);
    float* data() { return data_; }
    void store();

  private:
    Tensor out_;
    std::vector<float> scratch_;
    float* data_;
};

// cpu_sgemm's path for A [M, K] times B [N, K]^T with few rows (decoding, and each expert's
// rows in batched decoding): one pass over B. Up to 16 rows it beats OpenBLAS, whose packing of
// B costs more than it saves there (tiny-mixtral on 2 cores: batch-16 decode 237 -> 332 tokens/s
// and batch 32, ~8 rows an expert, 268 -> 455 against a bound of 4 rows; a bound of 32 gave
// batch 32 415).
constexpr int64_t kSmallGemmRows = 16;
void cpu_small_sgemm_nt(int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                        const float* B, float beta, float* C);

// y[M, N] = x[M, K] . w^T + beta * y (beta 0: y is not read; beta 1: accumulate), for a weight
// w [N, K] stored in format `format` (BF16, F16 or Q8_0; F32 goes to cpu_sgemm; for Q8_0 K is a
// multiple of 32, else std::invalid_argument, and row n is K/32 blocks at byte n*K/32*34).
// Multi-threaded over N (OpenMP), any M; the results do not depend on the thread count. BF16 and
// F16 are widened exactly and summed in fp32. Q8_0 takes int8 dot products: each row of x is
// quantized to blocks of 32 (a scale max|x|/127 and int8 values, as llama.cpp does), so its result
// differs from x . dequantized(w) by x's rounding. (backends/cpu/weight_matmul.cpp)
void cpu_weight_matmul_nt(DType format, int64_t M, int64_t N, int64_t K, const float* x,
                          const void* w, float beta, float* y);
// The instruction sets the weight kernels may use, and which of them this machine has. Each
// kernel takes the best it has up to the path: Q8_0 portable, AVX2, AVX-VNNI (at AvxVnni and
// Avx512 where the CPU has it) or AVX-512 VNNI; bf16 and f16 portable, AVX2 + F16C, or AVX-512
// (BW, VL) from Avx512 on.
enum class CpuWeightPath { Portable, Avx2, AvxVnni, Avx512, Avx512Vnni };
const char* to_string(CpuWeightPath p);
// Portable first, then what the CPU has, in the enum's order.
std::vector<CpuWeightPath> cpu_weight_paths_available();
CpuWeightPath cpu_weight_path();  // the one in use: the best available, chosen once at run time
// For tests and benchmarks; a path the CPU lacks is a std::logic_error.
void cpu_set_weight_path(CpuWeightPath p);

}  // namespace tmx

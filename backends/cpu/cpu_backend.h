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
    // Physical memory, or the cgroup's limit (a container's) when that is lower.
    uint64_t memory_capacity() const override;
    void synchronize() override {}

    // Host pointer to a CPU tensor's first element (for the CPU backend's own ops and tests).
    template <typename T>
    static T* data(const Tensor& t) {
        return reinterpret_cast<T*>(host_ptr(t));
    }

protected:
    std::shared_ptr<DeviceBuffer> alloc_impl(size_t bytes) override;
    void upload_impl(const Tensor& dst, const void* host) override;
    void download_impl(const Tensor& src, void* host) override;
    void fill_impl(const Tensor& dst, float value) override;
    void copy_impl(const Tensor& src, const Tensor& dst) override;
    void convert_impl(const Tensor& src, const Tensor& dst) override;

    void embedding_impl(const Tensor& table, const Tensor& ids, const Tensor& out) override;
    void norm_impl(NormType type, const Tensor& x, const Tensor& weight, const Tensor& bias,
                   float eps, const Tensor& out) override;
    void matmul_impl(const Tensor& a, const Tensor& b, const Tensor& out, MatmulOptions opts,
                     const Tensor& bias) override;
    void rope_impl(const Tensor& x, const Tensor& positions, double theta, bool inverse) override;
    void attention_impl(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        int64_t window) override;
    void attention_cached_impl(const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& k_cache, const Tensor& v_cache, const Tensor& start,
                               const Tensor& out, int64_t window) override;
    void kv_cache_write_impl(const Tensor& k, const Tensor& v, const Tensor& k_cache,
                             const Tensor& v_cache, const Tensor& start) override;
    void router_topk_impl(const Tensor& logits, const Tensor& indices,
                          const Tensor& gates) override;
    void moe_group_impl(const Tensor& indices, int64_t n_experts, const Tensor& offsets,
                        const Tensor& slot_rows, const Tensor& slot_of) override;
    void gather_rows_impl(const Tensor& x, const Tensor& rows, const Tensor& out) override;
    void grouped_matmul_impl(const Tensor& x, const Tensor& w, const Tensor& bias,
                             const Tensor& offsets, const Tensor& out) override;
    void moe_combine_impl(const Tensor& expert_out, const Tensor& slot_of, const Tensor& gates,
                          const Tensor& out) override;
    void activation_impl(Activation act, const Tensor& x, const Tensor& out) override;
    void swiglu_impl(const Tensor& gate, const Tensor& up, const Tensor& out) override;
    void add_impl(const Tensor& a, const Tensor& b, const Tensor& out) override;
    void cross_entropy_impl(const Tensor& logits, const Tensor& targets,
                            const Tensor& losses) override;
    void router_aux_loss_impl(const Tensor& logits, const Tensor& indices,
                              const Tensor& out) override;

    void embedding_backward_impl(const Tensor& ids, const Tensor& d_out,
                                         const Tensor& d_table) override;
    void norm_backward_impl(NormType type, const Tensor& x, const Tensor& weight,
                                    const Tensor& d_out, float eps, const Tensor& d_x,
                                    const Tensor& d_weight, const Tensor& d_bias) override;
    void bias_backward_impl(const Tensor& d_out, const Tensor& d_bias) override;
    void attention_backward_impl(const Tensor& q, const Tensor& k, const Tensor& v,
                                         const Tensor& d_out, const Tensor& d_q,
                                         const Tensor& d_k, const Tensor& d_v,
                                         int64_t window) override;
    void router_backward_impl(const Tensor& logits, const Tensor& indices,
                                      const Tensor& gates, const Tensor& d_gates,
                                      float aux_weight, const Tensor& d_logits) override;
    void gather_rows_backward_impl(const Tensor& rows, const Tensor& d_out,
                                           const Tensor& d_x) override;
    void grouped_matmul_backward_impl(const Tensor& x, const Tensor& w,
                                              const Tensor& offsets, const Tensor& d_out,
                                              const Tensor& d_x, const Tensor& d_w,
                                              const Tensor& d_bias) override;
    void moe_combine_backward_impl(const Tensor& expert_out, const Tensor& slot_of,
                                           const Tensor& gates, const Tensor& d_out,
                                           const Tensor& d_expert_out,
                                           const Tensor& d_gates) override;
    void activation_backward_impl(Activation act, const Tensor& x, const Tensor& d_out,
                                          const Tensor& d_x) override;
    void swiglu_backward_impl(const Tensor& gate, const Tensor& up, const Tensor& d_out,
                                      const Tensor& d_gate, const Tensor& d_up) override;
    void cross_entropy_backward_impl(const Tensor& logits, const Tensor& targets,
                                             float scale, const Tensor& d_logits) override;
    void sum_squares_impl(const Tensor& x, const Tensor& out) override;
    void scale_impl(const Tensor& x, float s) override;
    void adamw_impl(const Tensor& params, const Tensor& grads, const Tensor& m, const Tensor& v,
                    const AdamWParams& hp) override;

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

// cpu_sgemm's path for A [M, K] times B [N, K]^T with few rows (decoding): one pass over B.
constexpr int64_t kSmallGemmRows = 4;
void cpu_small_sgemm_nt(int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                        const float* B, float beta, float* C);

}  // namespace tmx

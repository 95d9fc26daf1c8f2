// The CUDA backend: the training path on NVIDIA GPUs (docs/design.md#15-layering). fp32 tensors
// (and bf16 ones where engine/compute/backend.h allows them), cuBLASLt for dense matmuls (TF32
// off: fp32 results; bf16 operands in bf16 precision), own kernels for everything else,
// tensor-core ones for the grouped expert matmuls in bf16.
//
// One stream: ops launch on it and return; the host waits only in download() and
// synchronize(). Device memory comes from CUDA's stream-ordered pool (cudaMallocAsync /
// cudaFreeAsync, kept cached), so a tensor freed while kernels that read it are pending is
// safe, and allocation costs no device synchronisation. A step repeated on the same tensors
// (decoding) is recorded as a CUDA graph and replayed (run_recorded), which saves the launch
// cost of its few hundred small kernels.
//
// Every CUDA and cuBLAS call is checked: a failure throws tmx::Error naming the op, the call
// and CUDA's error string. Inputs a kernel finds invalid (token ids, rows, expert indices,
// targets out of range) are recorded in a device status word (first error wins) and thrown
// as tmx::Error at the next sync point, as on Vulkan. TMX_CUDA_DEBUG_SYNC=1 synchronises and
// checks after every op, so a failing kernel is named at once (slow; for debugging).
//
// Layout of the sources: this class and memory/transfers in cuda_backend.cpp; one .cu file per
// op family with forward and backward side by side (matmul, attention, norm, rope, moe, loss,
// elementwise, optimizer), as in backends/cpu/. Kernel helpers are in cuda_common.cuh; the
// readers of weights stored in bf16, f16 and Q8_0 (inference) in weights.cuh.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/cuda/cuda_peaks.h"
#include "engine/compute/backend.h"
#include "engine/compute/weight_format.h"

namespace tmx {

namespace cuda {

// A CUDA device as `tmx devices` lists it.
struct DeviceInfo {
    int index = 0;
    std::string name;
    int cc_major = 0, cc_minor = 0;  // compute capability
    int sm_count = 0;
    size_t memory_bytes = 0;
    size_t shared_memory_per_block_optin = 0;
    int memory_bus_width_bits = 0, memory_clock_khz = 0, sm_clock_khz = 0;
};

// The CUDA devices present. Throws tmx::Error when no driver or device is usable (the
// message says why: CUDA's own error string, e.g. "no CUDA-capable device is detected").
std::vector<DeviceInfo> list_cuda_devices();

struct CudaOptions {
    int device = -1;  // -1: TMX_CUDA_DEVICE if set, else device 0
};

// Throws tmx::Error naming `op`, `call` and CUDA's message when `status` is an error.
// advice, when given, is appended to the message.
void check(cudaError_t status, const char* op, const char* call, const std::string& advice = {});
void check(cublasStatus_t status, const char* op, const char* call);

// Error codes a kernel records in the status word (cuda_common.cuh: report_error()).
enum StatusCode : int {
    kStatusOk = 0,
    kBadRow = 2,       // gather_rows and its backward: row outside [0, N)
    kBadExpert = 3,    // moe: expert index outside [0, E)
    kBadTarget = 4,    // cross_entropy: target outside [-1, V)
    kBadSlot = 5,      // moe_combine: slot outside [0, S)
    kBadPosition = 6,  // rope and the cached attention: negative position
};

}  // namespace cuda

// Throws tmx::Error when no CUDA device is usable.
std::unique_ptr<Backend> make_cuda_backend(const cuda::CudaOptions& options = {});

class CudaBackend final : public Backend {
  public:
    explicit CudaBackend(const cuda::CudaOptions& options = {});
    ~CudaBackend() override;

    std::string name() const override { return "cuda"; }
    // "cuda: <device name> (device N, sm_XY), fp32".
    std::string description() const override;
    bool supports_training() const override { return true; }
    // Weights in f32, bf16, f16 and Q8_0, read as stored (weights.cuh): by the matrix-vector
    // kernels for decoding's few rows, decoded into a matmul operand for larger products.
    bool supports_weight_format(DType t) const override { return is_weight_format(t); }
    // bf16 matmuls need tensor cores that take bf16: compute capability 8.0 (Ampere) or newer.
    bool supports_precision(Precision p) const override {
        return p == Precision::F32 || info_.cc_major >= 8;
    }
    Precision default_precision() const override {
        return supports_precision(Precision::BF16) ? Precision::BF16 : Precision::F32;
    }
    double spec_peak_tflops(Precision p) const override {  // cuda_peaks.h's table
        return cuda::spec_peak_tflops(info_.name, info_.sm_count, p == Precision::BF16);
    }
    // What tmx's tensors can take now: the device's free memory (so less this process's CUDA
    // context, cuBLASLt's workspace and what other processes hold) plus what the memory pool
    // holds for this process. Trainer refuses a run whose estimate exceeds it.
    uint64_t memory_capacity() const override;
    void synchronize() override;
    // Records the step as a CUDA graph on its second run and replays it from the third.
    void run_recorded(StepRecording& rec, const std::function<void()>& body) override;

    const cuda::DeviceInfo& device() const { return info_; }
    cudaStream_t stream() const;

    // Device pointer to a tensor's first element.
    template <typename T>
    static T* data(const Tensor& t) {
        return reinterpret_cast<T*>(device_ptr(t));
    }

    // For the op files: the cuBLASLt handle and its workspace (fixed size, allocated once, so
    // that captured graphs may use it), the status word kernels report into, and the check
    // after a kernel launch (naming the op; synchronises under TMX_CUDA_DEBUG_SYNC).
    cublasLtHandle_t cublaslt() const;
    void* cublaslt_workspace() const;
    size_t cublaslt_workspace_bytes() const;
    int* status_word() const;
    void check_launch(const char* op) const;

  protected:
    // The ops of every list in engine/compute/backend_ops.h, and convert_impl.
    TMX_BACKEND_TRAINING_BACKEND_OVERRIDES

    void linear_impl(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y,
                     bool accumulate) override;

  private:
    void grouped_matmul_backward_bf16(const Tensor& x, const Tensor& w, const int32_t* offsets,
                                      int E, int S, int Nout, int K, const Tensor& d_out,
                                      const Tensor& d_x, const Tensor& d_w, const Tensor& d_bias);
    static std::byte* device_ptr(const Tensor& t);
    // Reads and clears the status word; throws tmx::Error describing a recorded error.
    void check_status();

    struct State;  // stream, handles, workspace, status word (shared with live buffers)
    std::shared_ptr<State> state_;
    cuda::DeviceInfo info_;
    bool debug_sync_ = false;
};

}  // namespace tmx

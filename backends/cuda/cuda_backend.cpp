// The CUDA backend's core: device choice, the stream, memory, transfers, errors. The ops are in
// the .cu files beside it, one per op family.
#include "backends/cuda/cuda_backend.h"

#include <cstdlib>
#include <cstring>
#include <vector>

#include "backends/cuda/cublaslt_loader.h"
#include "backends/cuda/cuda_driver.h"
#include "engine/core/errors.h"

namespace tmx {

namespace cuda {

void check(cudaError_t status, const char* op, const char* call, const std::string& advice) {
    if (status == cudaSuccess) return;
    // Clears a non-sticky error, so that the backend stays usable after a reported one.
    cudaGetLastError();
    throw Error(std::string("cuda: ") + op + ": " + call +
                " failed: " + cudaGetErrorString(status) + " (" + cudaGetErrorName(status) + ")" +
                (advice.empty() ? "" : "; " + advice));
}

void check(cublasStatus_t status, const char* op, const char* call) {
    if (status == CUBLAS_STATUS_SUCCESS) return;
    throw Error(std::string("cuda: ") + op + ": " + call + " failed: " +
                cublasLtGetStatusString(status) + " (" + cublasLtGetStatusName(status) + ")");
}

// cudaGetDeviceCount, with what to do when the driver cannot run this build.
static int device_count(const char* op) {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    std::string advice;
    if (status == cudaErrorInsufficientDriver) {
        int driver = 0, runtime = 0;
        cudaDriverGetVersion(&driver);  // 0 when no driver is loaded
        cudaRuntimeGetVersion(&runtime);
        advice = insufficient_driver_advice(driver, runtime);
    }
    check(status, op, "cudaGetDeviceCount", advice);
    return count;
}

std::vector<DeviceInfo> list_cuda_devices() {
    const int count = device_count("devices");
    std::vector<DeviceInfo> list;
    for (int i = 0; i < count; ++i) {
        cudaDeviceProp p{};
        check(cudaGetDeviceProperties(&p, i), "devices", "cudaGetDeviceProperties");
        DeviceInfo d;
        d.index = i;
        d.name = p.name;
        d.cc_major = p.major;
        d.cc_minor = p.minor;
        d.sm_count = p.multiProcessorCount;
        d.memory_bytes = p.totalGlobalMem;
        d.shared_memory_per_block_optin = p.sharedMemPerBlockOptin;
        d.memory_bus_width_bits = p.memoryBusWidth;
        // CUDA 13 dropped the clock fields from cudaDeviceProp: ask for them one by one.
        check(cudaDeviceGetAttribute(&d.memory_clock_khz, cudaDevAttrMemoryClockRate, i), "devices",
              "cudaDeviceGetAttribute(MemoryClockRate)");
        check(cudaDeviceGetAttribute(&d.sm_clock_khz, cudaDevAttrClockRate, i), "devices",
              "cudaDeviceGetAttribute(ClockRate)");
        list.push_back(std::move(d));
    }
    return list;
}

}  // namespace cuda

namespace {

constexpr size_t kCublasLtWorkspaceBytes = 32u << 20;  // Hopper's kernels want 32 MiB

int choose_device(const cuda::CudaOptions& options, int count) {
    int device = options.device;
    if (device < 0) {
        device = 0;
        if (const char* env = std::getenv("TMX_CUDA_DEVICE"); env && *env) {
            char* end = nullptr;
            const long n = std::strtol(env, &end, 10);
            if (*end != '\0' || n < 0)
                throw UsageError(std::string("TMX_CUDA_DEVICE='") + env +
                                 "': expected a device index");
            device = static_cast<int>(n);
        }
    }
    if (device >= count)
        throw UsageError("CUDA device " + std::to_string(device) + " does not exist (" +
                         std::to_string(count) + " present; `tmx devices` lists them)");
    return device;
}

}  // namespace

namespace {

// What memory does while run_recorded captures a step into a CUDA graph. Stream-ordered
// allocations and frees on the captured stream would become nodes of the graph, so instead:
// allocations come from the pool on a second stream, outside the capture, and are kept by
// the recording (the graph's kernels use them at every replay); frees of older buffers wait
// until the capture ends.
struct Capture {
    bool active = false;
    cudaStream_t alloc_stream = nullptr;
    std::vector<std::shared_ptr<DeviceBuffer>> pinned;
    std::vector<void*> deferred_frees;
};

// A recorded step: the instantiated graph and the buffers its kernels use.
struct CudaGraphRecording {
    cudaGraphExec_t exec = nullptr;
    std::vector<std::shared_ptr<DeviceBuffer>> pinned;
    ~CudaGraphRecording() {
        if (exec) cudaGraphExecDestroy(exec);
    }
};

}  // namespace

struct CudaBackend::State {
    int device = 0;
    cudaStream_t stream = nullptr;
    std::shared_ptr<Capture> capture = std::make_shared<Capture>();
    cublasLtHandle_t lt = nullptr;
    void* workspace = nullptr;
    int* status = nullptr;       // device: {code, value, limit, unused}
    int* status_host = nullptr;  // pinned copy read at sync points

    ~State() {
        // Destructors must not throw: errors here are ignored (the device may be lost).
        if (stream) cudaStreamSynchronize(stream);
        if (workspace) cudaFree(workspace);
        if (status) cudaFree(status);
        if (status_host) cudaFreeHost(status_host);
        if (lt) cublasLtDestroy(lt);
        if (capture->alloc_stream) cudaStreamDestroy(capture->alloc_stream);
        if (stream) cudaStreamDestroy(stream);
    }
};

namespace {

// A tensor's memory from the stream-ordered pool, returned to it on the backend's stream when
// the last Tensor lets go: kernels already queued that read it finish first.
class CudaBuffer final : public DeviceBuffer {
  public:
    CudaBuffer(size_t bytes, void* ptr, std::shared_ptr<void> state,
               std::shared_ptr<Capture> capture, cudaStream_t stream)
        : DeviceBuffer(bytes),
          ptr_(ptr),
          state_(std::move(state)),
          capture_(std::move(capture)),
          stream_(stream) {}
    ~CudaBuffer() override {
        if (!ptr_) return;
        if (capture_->active)
            capture_->deferred_frees.push_back(ptr_);
        else
            cudaFreeAsync(ptr_, stream_);
    }
    void* ptr() const { return ptr_; }

  private:
    void* ptr_;
    std::shared_ptr<void> state_;  // keeps the stream alive while the buffer lives
    std::shared_ptr<Capture> capture_;
    cudaStream_t stream_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const cuda::CudaOptions& options) {
    return std::make_unique<CudaBackend>(options);
}

CudaBackend::CudaBackend(const cuda::CudaOptions& options) : state_(std::make_shared<State>()) {
    const char* op = "init";
    const int count = cuda::device_count(op);
    if (count == 0) throw Error("cuda: no CUDA device present");
    State& s = *state_;
    s.device = choose_device(options, count);
    info_ = cuda::list_cuda_devices().at(static_cast<size_t>(s.device));
    cuda::check(cudaSetDevice(s.device), op, "cudaSetDevice");
    cuda::check(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking), op,
                "cudaStreamCreateWithFlags");
    cuda::check(cudaStreamCreateWithFlags(&s.capture->alloc_stream, cudaStreamNonBlocking), op,
                "cudaStreamCreateWithFlags");
    // Keep freed memory in the pool instead of returning it to the driver at each sync.
    cudaMemPool_t pool = nullptr;
    cuda::check(cudaDeviceGetDefaultMemPool(&pool, s.device), op, "cudaDeviceGetDefaultMemPool");
    uint64_t keep = UINT64_MAX;
    cuda::check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep), op,
                "cudaMemPoolSetAttribute(ReleaseThreshold)");
    cuda::load_cublaslt();
    cuda::check(cublasLtCreate(&s.lt), op, "cublasLtCreate");
    cuda::check(cudaMalloc(&s.workspace, kCublasLtWorkspaceBytes), op, "cudaMalloc(workspace)");
    cuda::check(cudaMalloc(reinterpret_cast<void**>(&s.status), 4 * sizeof(int)), op,
                "cudaMalloc(status)");
    cuda::check(cudaMemset(s.status, 0, 4 * sizeof(int)), op, "cudaMemset(status)");
    cuda::check(cudaMallocHost(reinterpret_cast<void**>(&s.status_host), 4 * sizeof(int)), op,
                "cudaMallocHost(status)");
    const char* debug = std::getenv("TMX_CUDA_DEBUG_SYNC");
    debug_sync_ = debug && *debug && std::strcmp(debug, "0") != 0;
}

CudaBackend::~CudaBackend() = default;

uint64_t CudaBackend::memory_capacity() const {
    const char* op = "memory_capacity";
    cuda::check(cudaSetDevice(state_->device), op, "cudaSetDevice");
    size_t free = 0, total = 0;
    cuda::check(cudaMemGetInfo(&free, &total), op, "cudaMemGetInfo");
    cudaMemPool_t pool = nullptr;
    cuda::check(cudaDeviceGetDefaultMemPool(&pool, state_->device), op,
                "cudaDeviceGetDefaultMemPool");
    // The pool's memory: tensors alive now, and freed memory it keeps. The default pool is the
    // device's, shared by every CudaBackend of the process on it: callers ask before making
    // their tensors, so what another backend holds then counts as this one's to use.
    uint64_t reserved = 0;
    cuda::check(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved), op,
                "cudaMemPoolGetAttribute(ReservedMemCurrent)");
    return static_cast<uint64_t>(free) + reserved;
}

std::string CudaBackend::description() const {
    return "cuda: " + info_.name + " (device " + std::to_string(info_.index) + ", sm_" +
           std::to_string(info_.cc_major) + std::to_string(info_.cc_minor) + "), " +
           to_string(matmul_precision()) + " matmuls";
}

cudaStream_t CudaBackend::stream() const {
    return state_->stream;
}
cublasLtHandle_t CudaBackend::cublaslt() const {
    return state_->lt;
}
void* CudaBackend::cublaslt_workspace() const {
    return state_->workspace;
}
size_t CudaBackend::cublaslt_workspace_bytes() const {
    return kCublasLtWorkspaceBytes;
}
int* CudaBackend::status_word() const {
    return state_->status;
}

void CudaBackend::check_launch(const char* op) const {
    cuda::check(cudaGetLastError(), op, "kernel launch");
    if (debug_sync_) {
        cuda::check(cudaStreamSynchronize(state_->stream), op, "kernel (TMX_CUDA_DEBUG_SYNC)");
        const_cast<CudaBackend*>(this)->check_status();
    }
}

void CudaBackend::synchronize() {
    cuda::check(cudaStreamSynchronize(state_->stream), "synchronize", "cudaStreamSynchronize");
    check_status();
}

void CudaBackend::check_status() {
    State& s = *state_;
    cuda::check(
        cudaMemcpyAsync(s.status_host, s.status, 4 * sizeof(int), cudaMemcpyDeviceToHost, s.stream),
        "status", "cudaMemcpyAsync");
    cuda::check(cudaStreamSynchronize(s.stream), "status", "cudaStreamSynchronize");
    const int code = s.status_host[0];
    if (code == cuda::kStatusOk) return;
    const std::string value = std::to_string(s.status_host[1]);
    const std::string limit = std::to_string(s.status_host[2]);
    // Reported once: later work runs normally.
    cuda::check(cudaMemsetAsync(s.status, 0, 4 * sizeof(int), s.stream), "status",
                "cudaMemsetAsync");
    switch (code) {
        case cuda::kBadRow:
            throw Error("gather_rows: row " + value + " outside [0, " + limit + ")");
        case cuda::kBadExpert:
            throw Error("moe: expert index " + value + " outside [0, " + limit + ")");
        case cuda::kBadTarget:
            throw Error("cross_entropy: target " + value + " outside the vocabulary of " + limit);
        case cuda::kBadSlot:
            throw Error("moe_combine: slot " + value + " outside [0, " + limit + ")");
        case cuda::kBadPosition:
            throw Error("position " + value + " is negative");
        default:
            throw Error("a CUDA kernel reported error code " + std::to_string(code));
    }
}

std::byte* CudaBackend::device_ptr(const Tensor& t) {
    auto* buffer = static_cast<CudaBuffer*>(t.buffer());
    return static_cast<std::byte*>(buffer->ptr()) +
           static_cast<size_t>(dtype_bytes(t.dtype(), t.offset()));
}

std::shared_ptr<DeviceBuffer> CudaBackend::alloc_impl(size_t bytes) {
    void* ptr = nullptr;
    Capture& capture = *state_->capture;
    const cudaStream_t on = capture.active ? capture.alloc_stream : state_->stream;
    // A zero-byte tensor still gets a distinct buffer object, with no memory behind it.
    if (bytes > 0) {
        cuda::check(cudaMallocAsync(&ptr, bytes, on), "alloc",
                    ("cudaMallocAsync(" + std::to_string(bytes) + " bytes)").c_str());
        if (capture.active)  // usable from the captured stream once this returns
            cuda::check(cudaStreamSynchronize(on), "alloc", "cudaStreamSynchronize");
    }
    auto buffer = std::make_shared<CudaBuffer>(bytes, ptr, state_, state_->capture, state_->stream);
    if (capture.active) capture.pinned.push_back(buffer);
    return buffer;
}

void CudaBackend::run_recorded(StepRecording& rec, const std::function<void()>& body) {
    const char* op = "run_recorded";
    State& s = *state_;
    if (rec.graph) {
        const auto* g = static_cast<const CudaGraphRecording*>(rec.graph.get());
        cuda::check(cudaGraphLaunch(g->exec, s.stream), op, "cudaGraphLaunch");
        return;
    }
    // The first run is not recorded: it does what a capture must not, once (the pool grows,
    // cuBLASLt picks its algorithms, kernels get their shared-memory limits). Nothing is
    // recorded under TMX_CUDA_DEBUG_SYNC, which synchronises after every op.
    if (rec.runs++ == 0 || debug_sync_) {
        body();
        return;
    }
    Capture& capture = *s.capture;
    // Relaxed: allocation on the second stream, and its synchronisation, stay allowed.
    cuda::check(cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeRelaxed), op,
                "cudaStreamBeginCapture");
    capture.active = true;
    cudaGraph_t graph = nullptr;
    const auto end_capture = [&]() {
        capture.active = false;
        const cudaError_t ended = cudaStreamEndCapture(s.stream, &graph);
        for (void* p : capture.deferred_frees) cudaFreeAsync(p, s.stream);
        capture.deferred_frees.clear();
        return ended;
    };
    auto recording = std::make_shared<CudaGraphRecording>();
    try {
        body();
    } catch (...) {
        end_capture();
        if (graph) cudaGraphDestroy(graph);
        capture.pinned.clear();
        throw;
    }
    const cudaError_t ended = end_capture();
    recording->pinned = std::move(capture.pinned);
    capture.pinned.clear();
    cuda::check(ended, op, "cudaStreamEndCapture");
    const cudaError_t made = cudaGraphInstantiate(&recording->exec, graph, 0);
    cudaGraphDestroy(graph);
    cuda::check(made, op, "cudaGraphInstantiate");
    rec.graph = recording;
    cuda::check(cudaGraphLaunch(recording->exec, s.stream), op, "cudaGraphLaunch");
}

void CudaBackend::upload_impl(const Tensor& dst, const void* host) {
    if (dst.bytes() == 0) return;
    // From pageable memory this returns once the data is staged: the caller may reuse `host`.
    cuda::check(
        cudaMemcpyAsync(device_ptr(dst), host, dst.bytes(), cudaMemcpyHostToDevice, state_->stream),
        "upload", "cudaMemcpyAsync(host to device)");
    check_launch("upload");
}

void CudaBackend::download_impl(const Tensor& src, void* host) {
    if (src.bytes() > 0)
        cuda::check(cudaMemcpyAsync(host, device_ptr(src), src.bytes(), cudaMemcpyDeviceToHost,
                                    state_->stream),
                    "download", "cudaMemcpyAsync(device to host)");
    synchronize();
}

void CudaBackend::copy_impl(const Tensor& src, const Tensor& dst) {
    if (src.bytes() == 0 || device_ptr(src) == device_ptr(dst)) return;
    // cudaMemcpyAsync's overlapping ranges are undefined: go through a scratch buffer then.
    const std::byte *s = device_ptr(src), *d = device_ptr(dst);
    const size_t n = src.bytes();
    if (s < d + n && d < s + n) {
        Tensor scratch = alloc(src.shape(), src.dtype());
        cuda::check(
            cudaMemcpyAsync(device_ptr(scratch), s, n, cudaMemcpyDeviceToDevice, state_->stream),
            "copy", "cudaMemcpyAsync(device to device)");
        s = device_ptr(scratch);
    }
    cuda::check(cudaMemcpyAsync(device_ptr(dst), s, n, cudaMemcpyDeviceToDevice, state_->stream),
                "copy", "cudaMemcpyAsync(device to device)");
    check_launch("copy");
}

}  // namespace tmx

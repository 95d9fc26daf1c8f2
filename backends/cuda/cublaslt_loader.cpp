// The cuBLASLt functions the CUDA backend calls, defined here with cublasLt.h's declarations and
// forwarding to the library that load_cublaslt() opens with dlopen: tmx does not link cuBLASLt,
// so a command that opens no CUDA backend never loads it (ggml loads its backends as modules for
// the same reason; one library behind a dozen functions needs less).
#include "backends/cuda/cublaslt_loader.h"

#include <cublasLt.h>
#include <dlfcn.h>

#include <mutex>

#include "engine/core/errors.h"

// Every cuBLASLt function the backend calls; a new call needs its name here and a forwarder below.
// clang-format off
#define TMX_CUBLASLT_FUNCTIONS(X) \
    X(cublasLtCreate) \
    X(cublasLtDestroy) \
    X(cublasLtGetStatusName) \
    X(cublasLtGetStatusString) \
    X(cublasLtMatmul) \
    X(cublasLtMatmulAlgoCheck) \
    X(cublasLtMatmulAlgoGetHeuristic) \
    X(cublasLtMatmulDescCreate) \
    X(cublasLtMatmulDescSetAttribute) \
    X(cublasLtMatmulDescDestroy) \
    X(cublasLtMatmulPreferenceCreate) \
    X(cublasLtMatmulPreferenceSetAttribute) \
    X(cublasLtMatmulPreferenceDestroy) \
    X(cublasLtMatrixLayoutCreate) \
    X(cublasLtMatrixLayoutDestroy)
// clang-format on

namespace tmx::cuda {
namespace {

struct Library {
#define TMX_POINTER(name) decltype(&::name) name = nullptr;
    TMX_CUBLASLT_FUNCTIONS(TMX_POINTER)
#undef TMX_POINTER
    std::string path;
    std::string error;  // why loading failed; "" once it succeeded
};

Library& library() {
    static Library lib;
    return lib;
}

void open_library(Library& lib) {
    // The soname first (LD_LIBRARY_PATH, the loader's cache), then the toolkit tmx was built with.
    const char* candidates[] = {TMX_CUBLASLT_SONAME, TMX_CUBLASLT_PATH};
    void* handle = nullptr;
    std::string tried;
    for (const char* candidate : candidates) {
        handle = dlopen(candidate, RTLD_NOW | RTLD_LOCAL);
        if (handle) {
            lib.path = candidate;
            break;
        }
        const char* why = dlerror();
        tried += std::string(tried.empty() ? "" : "; ") + (why ? why : candidate);
    }
    if (!handle) {
        lib.error = "cannot open cuBLASLt, which the CUDA backend needs (" + tried +
                    "): install the CUDA toolkit's cuBLAS, or put the directory holding " +
                    TMX_CUBLASLT_SONAME + " on LD_LIBRARY_PATH";
        return;
    }
#define TMX_RESOLVE(name)                                                                   \
    lib.name = reinterpret_cast<decltype(lib.name)>(dlsym(handle, #name));                  \
    if (!lib.name) {                                                                        \
        lib.error = lib.path + " has no function " #name " (built for CUDA " TMX_CUDA_MAJOR \
                               "; is the library of another CUDA version?)";                \
        return;                                                                             \
    }
    TMX_CUBLASLT_FUNCTIONS(TMX_RESOLVE)
#undef TMX_RESOLVE
}

}  // namespace

void load_cublaslt() {
    static std::once_flag once;
    std::call_once(once, [] { open_library(library()); });
    if (!library().error.empty()) throw Error("cuda: " + library().error);
}

std::string cublaslt_path() {
    return library().error.empty() ? library().path : "";
}

}  // namespace tmx::cuda

// The forwarders. The backend calls them only after load_cublaslt() succeeded (CudaBackend's
// constructor); the status strings also answer before, for an error message.
using tmx::cuda::library;

extern "C" {

cublasStatus_t CUBLASWINAPI cublasLtCreate(cublasLtHandle_t* handle) {
    return library().cublasLtCreate(handle);
}
cublasStatus_t CUBLASWINAPI cublasLtDestroy(cublasLtHandle_t handle) {
    return library().cublasLtDestroy(handle);
}
const char* CUBLASWINAPI cublasLtGetStatusName(cublasStatus_t status) {
    return library().cublasLtGetStatusName ? library().cublasLtGetStatusName(status)
                                           : "cuBLASLt not loaded";
}
const char* CUBLASWINAPI cublasLtGetStatusString(cublasStatus_t status) {
    return library().cublasLtGetStatusString ? library().cublasLtGetStatusString(status)
                                             : "cuBLASLt not loaded";
}
cublasStatus_t CUBLASWINAPI cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                           const void* alpha, const void* A,
                                           cublasLtMatrixLayout_t Adesc, const void* B,
                                           cublasLtMatrixLayout_t Bdesc, const void* beta,
                                           const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                                           cublasLtMatrixLayout_t Ddesc,
                                           const cublasLtMatmulAlgo_t* algo, void* workspace,
                                           size_t workspace_bytes, cudaStream_t stream) {
    return library().cublasLtMatmul(handle, desc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D,
                                    Ddesc, algo, workspace, workspace_bytes, stream);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoCheck(
    cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    const cublasLtMatmulAlgo_t* algo, cublasLtMatmulHeuristicResult_t* result) {
    return library().cublasLtMatmulAlgoCheck(handle, desc, Adesc, Bdesc, Cdesc, Ddesc, algo,
                                             result);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    cublasLtMatmulPreference_t preference, int requested, cublasLtMatmulHeuristicResult_t results[],
    int* returned) {
    return library().cublasLtMatmulAlgoGetHeuristic(handle, desc, Adesc, Bdesc, Cdesc, Ddesc,
                                                    preference, requested, results, returned);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc,
                                                     cublasComputeType_t compute,
                                                     cudaDataType_t scale) {
    return library().cublasLtMatmulDescCreate(desc, compute, scale);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                                           cublasLtMatmulDescAttributes_t attr,
                                                           const void* buf, size_t bytes) {
    return library().cublasLtMatmulDescSetAttribute(desc, attr, buf, bytes);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
    return library().cublasLtMatmulDescDestroy(desc);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
    return library().cublasLtMatmulPreferenceCreate(pref);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceSetAttribute(
    cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
    size_t bytes) {
    return library().cublasLtMatmulPreferenceSetAttribute(pref, attr, buf, bytes);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
    return library().cublasLtMatmulPreferenceDestroy(pref);
}
cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout,
                                                       cudaDataType type, uint64_t rows,
                                                       uint64_t cols, int64_t ld) {
    return library().cublasLtMatrixLayoutCreate(layout, type, rows, cols, ld);
}
cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
    return library().cublasLtMatrixLayoutDestroy(layout);
}

}  // extern "C"

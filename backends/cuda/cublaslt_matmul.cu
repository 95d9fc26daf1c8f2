// The CUDA backend's cuBLASLt product (dense matmuls, and grouped ones per expert in bf16):
// fp32 with CUBLAS_COMPUTE_32F (not TF32: results must match the CPU at fp32 tolerances), or
// bf16 operands with fp32 accumulation. The heuristic's algorithm is cached per problem (shape,
// precision, options, pointer alignments, device); descriptors are cheap host objects made per
// call.
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

#include "backends/cuda/matmul_common.cuh"
#include "engine/core/errors.h"

namespace tmx {
namespace {

// Owns a cuBLASLt descriptor, destroyed when it goes out of scope (also on a throw).
template <typename Handle, cublasStatus_t (*Destroy)(Handle)>
struct LtObject {
    Handle h = nullptr;
    LtObject() = default;
    LtObject(const LtObject&) = delete;
    LtObject& operator=(const LtObject&) = delete;
    ~LtObject() {
        if (h) Destroy(h);
    }
};
using LtMatmulDesc = LtObject<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>;
using LtLayout = LtObject<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>;
using LtPreference = LtObject<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>;

// The largest power of two dividing the address, capped at 16: views into a buffer are only
// aligned to their element size (4 bytes for F32, 2 for a BF16 operand), and cuBLASLt's default
// preference assumes 256, which could pick an algorithm that cannot run on a view.
uint32_t pointer_alignment(const void* p) {
    const auto address = reinterpret_cast<uintptr_t>(p);
    uint32_t align = 16;
    while (align > 1 && address % align != 0) align /= 2;
    return align;
}

// What the heuristic's choice depends on. The bias pointer's alignment is part of it: the
// heuristic reads the pointer from the descriptor to decide which algorithms may load it.
struct LtKey {
    int device;
    cudaDataType_t operand_type;  // CUDA_R_32F or CUDA_R_16BF
    int64_t M, N, K;
    bool trans_a, trans_b, bias_epilogue;
    uint32_t align_a, align_b, align_out, align_bias;
    auto operator<=>(const LtKey&) const = default;
};

// The heuristic's algorithm per problem; nullopt where it found none (asked once).
std::mutex lt_cache_mutex;
std::map<LtKey, std::optional<cublasLtMatmulAlgo_t>> lt_cache;

// The next power of two >= n (n >= 1): one cache entry for a range of sizes.
int64_t size_bucket(int64_t n) {
    int64_t b = 1;
    while (b < n) b *= 2;
    return b;
}

// out [M, N] = op(a) . op(b) (+ bias[N] through the BIAS epilogue) + beta * out, on cuBLASLt;
// a and b hold operand_type elements (fp32, or bf16 with fp32 accumulation), out and bias fp32.
// Returns false, having launched nothing, when the heuristic has no algorithm for it.
//
// varying_size: M and K change from call to call (an expert's share of the slots), so the
// algorithm is the heuristic's for the power-of-two bucket of M and K (one query per bucket, not
// per routing), checked for the exact problem (cublasLtMatmulAlgoCheck) before it runs; a
// problem it does not fit asks the heuristic for its own size.
//
// cuBLASLt is column-major: the row-major out [M, N] is the column-major out^T [N, M], so it
// computes out^T = op(b)^T [N, K] . op(a)^T [K, M]. Its A operand is our b: stored [K, N]
// row-major = column-major N x K (ld N), op N; with trans_b stored [N, K] = column-major K x N
// (ld K), op T. Its B operand is our a: stored [M, K] = column-major K x M (ld K), op N; with
// trans_a stored [K, M] = column-major M x K (ld M), op T. C = D = out, column-major N x M
// (ld N). The epilogue's bias runs along D's rows, i.e. along our N: bias[n] for out[:, n].

}  // namespace

bool cuda::lt_matmul(const CudaBackend& be, cudaDataType_t operand_type, const void* a,
                     const void* b, float* out, const float* bias, int64_t M, int64_t N, int64_t K,
                     bool trans_a, bool trans_b, float beta, bool varying_size) {
    const char* op = "matmul";
    LtMatmulDesc desc;
    TMX_CUDA_CHECK(op, cublasLtMatmulDescCreate(&desc.h, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t op_lt_a = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_lt_b = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    TMX_CUDA_CHECK(op, cublasLtMatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_TRANSA, &op_lt_a,
                                                      sizeof(op_lt_a)));
    TMX_CUDA_CHECK(op, cublasLtMatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_TRANSB, &op_lt_b,
                                                      sizeof(op_lt_b)));
    if (bias) {
        const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
        TMX_CUDA_CHECK(op, cublasLtMatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                          &epilogue, sizeof(epilogue)));
        TMX_CUDA_CHECK(op, cublasLtMatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                          &bias, sizeof(bias)));
        const cudaDataType_t bias_type = CUDA_R_32F;  // fp32 whatever the operands
        TMX_CUDA_CHECK(op,
                       cublasLtMatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                      &bias_type, sizeof(bias_type)));
    }
    // Column-major layouts, each with ld = its row count (the tensors are contiguous).
    const auto make_layout = [op](LtLayout& layout, cudaDataType_t type, int64_t rows,
                                  int64_t cols) {
        TMX_CUDA_CHECK(op, cublasLtMatrixLayoutCreate(&layout.h, type, static_cast<uint64_t>(rows),
                                                      static_cast<uint64_t>(cols), rows));
    };
    struct Layouts {
        LtLayout b, a, out;  // cuBLASLt's A (our b), B (our a), C = D (out)
    };
    const auto make_layouts = [&](Layouts& l, int64_t m, int64_t k) {
        make_layout(l.b, operand_type, trans_b ? k : N, trans_b ? N : k);
        make_layout(l.a, operand_type, trans_a ? m : k, trans_a ? k : m);
        make_layout(l.out, CUDA_R_32F, N, m);
    };
    Layouts exact;
    make_layouts(exact, M, K);

    const LtKey key{
        .device = be.device().index,
        .operand_type = operand_type,
        .M = varying_size ? size_bucket(M) : M,
        .N = N,
        .K = varying_size ? size_bucket(K) : K,
        .trans_a = trans_a,
        .trans_b = trans_b,
        .bias_epilogue = bias != nullptr,
        .align_a = pointer_alignment(a),
        .align_b = pointer_alignment(b),
        .align_out = pointer_alignment(out),
        .align_bias = bias ? pointer_alignment(bias) : 0,
    };
    const auto ask_heuristic = [&](const Layouts& l) -> std::optional<cublasLtMatmulAlgo_t> {
        LtPreference pref;
        TMX_CUDA_CHECK(op, cublasLtMatmulPreferenceCreate(&pref.h));
        const uint64_t workspace = be.cublaslt_workspace_bytes();
        TMX_CUDA_CHECK(op, cublasLtMatmulPreferenceSetAttribute(
                               pref.h, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                               sizeof(workspace)));
        // cuBLASLt's A is our b, its B our a; C and D are both out.
        const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
            {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_b},
            {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_a},
            {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_out},
            {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_out}};
        for (const auto& [attr, value] : aligns)
            TMX_CUDA_CHECK(
                op, cublasLtMatmulPreferenceSetAttribute(pref.h, attr, &value, sizeof(value)));
        cublasLtMatmulHeuristicResult_t result{};
        int found = 0;
        // NOT_SUPPORTED means no algorithm for this configuration: cached as such.
        const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
            be.cublaslt(), desc.h, l.b.h, l.a.h, l.out.h, l.out.h, pref.h, 1, &result, &found);
        if (status != CUBLAS_STATUS_NOT_SUPPORTED)
            cuda::check(status, op, "cublasLtMatmulAlgoGetHeuristic");
        if (status == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS)
            return result.algo;
        return std::nullopt;
    };
    std::optional<cublasLtMatmulAlgo_t> algo;
    {
        std::lock_guard<std::mutex> lock(lt_cache_mutex);
        auto it = lt_cache.find(key);
        if (it == lt_cache.end()) {
            // A bucket's algorithm is the heuristic's for the bucket's own size, whatever size
            // came first: the same in every process (a resumed run multiplies as the first did).
            Layouts bucket;
            if (varying_size) make_layouts(bucket, key.M, key.K);
            it = lt_cache.emplace(key, ask_heuristic(varying_size ? bucket : exact)).first;
        }
        algo = it->second;
    }
    if (varying_size) {
        // The bucket's algorithm, run only where it fits this size; else this size's own.
        cublasLtMatmulHeuristicResult_t check{};
        const bool fits =
            algo &&
            cublasLtMatmulAlgoCheck(be.cublaslt(), desc.h, exact.b.h, exact.a.h, exact.out.h,
                                    exact.out.h, &*algo, &check) == CUBLAS_STATUS_SUCCESS &&
            check.workspaceSize <= be.cublaslt_workspace_bytes();
        if (!fits) algo = ask_heuristic(exact);
    }
    if (!algo) return false;
    const float alpha = 1.0f;
    TMX_CUDA_CHECK(
        op, cublasLtMatmul(be.cublaslt(), desc.h, &alpha, b, exact.b.h, a, exact.a.h, &beta, out,
                           exact.out.h, out, exact.out.h, &*algo, be.cublaslt_workspace(),
                           be.cublaslt_workspace_bytes(), be.stream()));
    return true;
}

namespace {

constexpr int kThreads = 256;

// out[m, n] = (keep ? out[m, n] : 0) + (bias ? bias[n] : 0): the start a GEMM with beta = 1
// then adds onto (a bias cuBLASLt's epilogue does not take), and the whole result when K = 0.
__global__ void bias_rows_kernel(float* out, const float* bias, int64_t M, int64_t N, bool keep) {
    const int64_t total = M * N;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const float base = keep ? out[i] : 0.0f;
        out[i] = bias ? base + bias[i % N] : base;
    }
}

}  // namespace

void cuda::launch_bias_rows(CudaBackend& be, float* out, const float* bias, int64_t M, int64_t N,
                            bool keep, const char* op) {
    const unsigned blocks = std::min<unsigned>(cuda::blocks_for(M * N, kThreads),
                                               static_cast<unsigned>(be.device().sm_count) * 8);
    bias_rows_kernel<<<blocks, kThreads, 0, be.stream()>>>(out, bias, M, N, keep);
    be.check_launch(op);
}

}  // namespace tmx

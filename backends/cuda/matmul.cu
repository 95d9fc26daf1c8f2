// The CUDA backend's matmuls, forward and backward side by side: the dense matmul (cuBLASLt),
// the bias gradient, and the grouped matmul over experts (own kernels). Their CPU twins are in
// backends/cpu/matmul.cpp.
//
// Dense: cuBLASLt in fp32 with CUBLAS_COMPUTE_32F (not TF32: results must match the CPU at fp32
// tolerances). The heuristic's algorithm is cached per problem (shape, precision, options,
// pointer alignments, device); descriptors are cheap host objects made per call.
//
// Grouped: at training's sizes in bf16, one cuBLASLt matmul per expert, after the host reads the
// expert offsets (lt_grouped(): one sync per product). Otherwise own kernels: the offsets stay
// on the device and are never read by the host (no sync), so the kernels find their expert
// themselves. In fp32: 128x128 output tiles, 8-deep reduction
// steps staged in shared memory, 256 threads computing 8x8 outputs each; row tiles are cut per
// expert, so a tile never straddles two experts. Decode (a few slots) takes a matrix-vector
// kernel instead. Every output element is summed by one thread in a fixed order:
// deterministic, no atomics.
//
// In bf16 precision (Backend::matmul_precision()) operands may also be BF16 tensors (out, bias
// and gradients stay F32). The dense matmul rounds each F32 operand into a bf16 copy, passes a
// BF16 one to cuBLASLt as it is, and runs cuBLASLt on bf16 with fp32 accumulation and output;
// the grouped products take bf16 operands with rows padded to a multiple of 8 and 16-byte
// aligned, used in place where a BF16 operand already is so and copied otherwise (F32 rounded),
// and run on tensor cores (matmul_bf16.cuh); the decode matrix-vector kernel reads either type,
// rounding F32 elements as it reads.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/matmul_bf16.cuh"
#include "backends/cuda/weights.cuh"
#include "engine/core/errors.h"

namespace tmx {
namespace {

using cuda::kWarp;
namespace bf16_gemm = cuda::bf16_gemm;

// ---- dense matmul: cuBLASLt

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
bool lt_matmul(const CudaBackend& be, cudaDataType_t operand_type, const void* a, const void* b,
               float* out, const float* bias, int64_t M, int64_t N, int64_t K, bool trans_a,
               bool trans_b, float beta, bool varying_size = false) {
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
void launch_bias_rows(CudaBackend& be, float* out, const float* bias, int64_t M, int64_t N,
                      bool keep, const char* op) {
    const unsigned blocks = std::min<unsigned>(cuda::blocks_for(M * N, kThreads),
                                               static_cast<unsigned>(be.device().sm_count) * 8);
    bias_rows_kernel<<<blocks, kThreads, 0, be.stream()>>>(out, bias, M, N, keep);
    be.check_launch(op);
}

// ---- bias_backward: column sums of d_out [M, N]

constexpr int kSumCols = 32;             // columns per block: a warp reads a row's 32 floats
constexpr int kSumLanes = 8;             // rows walked side by side: a 32 x 8 block
constexpr int64_t kSumChunkRows = 1024;  // rows per block (the first pass of two)
constexpr int64_t kMaxGridY = 65535;

// Sum in double of x[r, col] over rows [row_begin, row_end) of x [*, N]: thread (tx, ty) adds
// rows row_begin + ty, + 8, ... in order, then the ty == 0 threads add the 8 partials in ty
// order. A fixed order: deterministic. The result is valid in the ty == 0 threads; every thread
// of the block calls it (col >= N adds nothing).
__device__ double block_column_sum(const float* x, int64_t N, int64_t row_begin, int64_t row_end,
                                   int64_t col) {
    __shared__ double partial[kSumLanes][kSumCols];
    double acc = 0.0;
    if (col < N) {
#pragma unroll 4
        for (int64_t r = row_begin + threadIdx.y; r < row_end; r += kSumLanes)
            acc += x[r * N + col];
    }
    partial[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    double sum = 0.0;
    if (threadIdx.y == 0)
        for (int i = 0; i < kSumLanes; ++i) sum += partial[i][threadIdx.x];
    return sum;
}

// Block (column chunk bx, row chunk by) sums its rows of its 32 columns. With one row chunk the
// sum goes straight into d_bias; otherwise into partial [chunks, N] for add_partials_kernel.
__global__ void column_sums_kernel(const float* x, int64_t M, int64_t N, int64_t chunk_rows,
                                   double* partial, float* d_bias) {
    const int64_t col = static_cast<int64_t>(blockIdx.x) * kSumCols + threadIdx.x;
    const int64_t begin = static_cast<int64_t>(blockIdx.y) * chunk_rows;
    const int64_t end = begin + chunk_rows < M ? begin + chunk_rows : M;
    const double sum = block_column_sum(x, N, begin, end, col);
    if (threadIdx.y != 0 || col >= N) return;
    if (partial)
        partial[static_cast<int64_t>(blockIdx.y) * N + col] = sum;
    else
        d_bias[col] += static_cast<float>(sum);
}

// d_bias[col] += the column's partial sums, in chunk order.
__global__ void add_partials_kernel(const double* partial, int64_t chunks, int64_t N,
                                    float* d_bias) {
    const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (col >= N) return;
    double sum = 0.0;
    for (int64_t c = 0; c < chunks; ++c) sum += partial[c * N + col];
    d_bias[col] += static_cast<float>(sum);
}

// ---- grouped matmul: tiles
//
// A block computes a 128 x 128 output tile; each of its 256 threads an 8 x 8 register block
// (rows 4 ty + {0..3} and 64 + 4 ty + {0..3}, columns likewise from tx), so every four
// shared-memory reads feed 64 FMAs. The reduction is staged 8 deep in two shared buffers: the
// next stage's global loads are in flight (in registers) while the current one is multiplied,
// and one barrier per stage suffices. Measured on an H100 (B32 x T512 training step): the
// earlier 64 x 64 tiles with 4 x 4 per thread spent 57% of the step in these kernels.

constexpr int kTileM = 128;        // output rows per block (slots; n for d_w)
constexpr int kTileN = 128;        // output columns per block
constexpr int kTileK = 8;          // reduction depth staged per step
constexpr int kTilePad = 4;        // keeps shared rows 16-byte aligned (float4 reads)
constexpr int kTileThreads = 256;  // 16 x 16 threads, 8 x 8 outputs each
constexpr int kHalfTile = kTileM / 2;
constexpr int kStageLoads = kTileM * kTileK / kTileThreads;  // elements each thread stages
static_assert(kTileM == kTileN && kTileM * kTileK == kStageLoads * kTileThreads);
static_assert(kTileThreads == (kTileM / 8) * (kTileN / 8));

// One reduction stage of a tile: a[k][m] and b[k][n] for k in [0, kTileK), both k-major so a
// thread reads each half of its rows and of its columns as one float4.
struct alignas(16) TileStage {
    float a[kTileK][kTileM + kTilePad];
    float b[kTileK][kTileN + kTilePad];
};

// The tile row (column) of a thread's register row i (column j), i, j in [0, 8).
__device__ __forceinline__ int tile_index(int t, int i) {
    return (i < 4 ? 0 : kHalfTile) + 4 * t + (i & 3);
}

// acc[i][j] += sum over the staged k of a[k][row i] * b[k][column j], in k order. Within a
// warp ty takes 2 values (broadcast reads of a) and tx 16 (adjacent float4s of b).
__device__ __forceinline__ void tile_fma(const TileStage& st, int tx, int ty, float (&acc)[8][8]) {
#pragma unroll
    for (int k = 0; k < kTileK; ++k) {
        const float4 a0 = *reinterpret_cast<const float4*>(&st.a[k][4 * ty]);
        const float4 a1 = *reinterpret_cast<const float4*>(&st.a[k][kHalfTile + 4 * ty]);
        const float4 b0 = *reinterpret_cast<const float4*>(&st.b[k][4 * tx]);
        const float4 b1 = *reinterpret_cast<const float4*>(&st.b[k][kHalfTile + 4 * tx]);
        const float ar[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
        const float br[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
            for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(ar[i], br[j], acc[i][j]);
    }
}

// An offset clamped to [0, S]: offsets are trusted (moe_group's prefix sums), this only keeps a
// corrupt one from sending a kernel outside x and out.
__device__ __forceinline__ int slot_bound(const int32_t* offsets, int e, int S) {
    return min(max(offsets[e], 0), S);
}

// Row tiles are cut per expert: expert e's slots [offsets[e], offsets[e+1]) make
// ceil(count / kTileM) tiles, numbered in expert order. Finds tile t's expert and slot range;
// false when t is past the last tile (the grid is sized for the most there can be,
// ceil(S / kTileM) + E). Every thread walks the E + 1 offsets itself (E is small; the loads hit
// the cache), which spares a shared-memory handoff.
__device__ bool find_row_tile(const int32_t* offsets, int E, int S, int t, int& expert,
                              int& row_begin, int& row_end) {
    int first = 0;  // the first tile of expert e
    for (int e = 0; e < E; ++e) {
        const int begin = slot_bound(offsets, e, S);
        const int end = max(begin, slot_bound(offsets, e + 1, S));
        const int tiles = (end - begin + kTileM - 1) / kTileM;
        if (t < first + tiles) {
            expert = e;
            row_begin = begin + (t - first) * kTileM;
            row_end = min(row_begin + kTileM, end);
            return true;
        }
        first += tiles;
    }
    return false;
}

// The staged elements of one operand that a thread loads from global memory for one stage.
struct StageRegs {
    float v[kStageLoads];
};

// out[s, c] (+)= sum over r of a[s, r] * W_e(r, c) (+ bias[e, c]) for every slot s of expert e,
// the r in order. a [S, R], out [S, C]. kTransW: W_e(r, c) = w[e][c, r], w [E, C, R] (the
// forward: x . w[e]^T); otherwise W_e(r, c) = w[e][r, c], w [E, R, C] (d_x = d_out . w[e]).
// Grid: (row tiles, ceil(C / kTileN)).
// Two blocks per multiprocessor on sm_90 (128 registers, no spills; as measured on the H100).
// For sm_89 ptxas spills the d_x variant at 128 registers, so there it runs one (an L4 has not
// run either yet). d_w's kernel needs more registers for its double bias sum and runs one.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
constexpr int kGemmMinBlocks = 1;
#else
constexpr int kGemmMinBlocks = 2;
#endif
template <bool kTransW>
__global__ void __launch_bounds__(kTileThreads, kGemmMinBlocks)
    grouped_gemm_kernel(const float* a, const float* w, const float* bias, const int32_t* offsets,
                        int E, int S, int R, int C, bool accumulate, float* out) {
    int e = 0, row_begin = 0, row_end = 0;
    if (!find_row_tile(offsets, E, S, static_cast<int>(blockIdx.x), e, row_begin, row_end))
        return;  // the whole block: past the last tile
    const int c0 = static_cast<int>(blockIdx.y) * kTileN;
    const float* we = w + static_cast<int64_t>(e) * R * C;
    const int tid = static_cast<int>(threadIdx.x), tx = tid % 16, ty = tid / 16;

    // a's tile as [k][m]: 8 adjacent threads read 8 adjacent r of one row. W's tile as [k][n],
    // read along the dimension w is contiguous in.
    auto load = [&](int r0, StageRegs& ra, StageRegs& rb) {
#pragma unroll
        for (int i = 0; i < kStageLoads; ++i) {
            const int idx = tid + i * kTileThreads, m = idx / kTileK, k = idx % kTileK;
            const int row = row_begin + m, r = r0 + k;
            ra.v[i] = row < row_end && r < R ? a[static_cast<int64_t>(row) * R + r] : 0.0f;
            if constexpr (kTransW) {
                const int c = c0 + m;  // idx / kTileK names a column of W here
                rb.v[i] = c < C && r < R ? we[static_cast<int64_t>(c) * R + r] : 0.0f;
            } else {
                const int kk = idx / kTileN, n = idx % kTileN, c = c0 + n, rr = r0 + kk;
                rb.v[i] = c < C && rr < R ? we[static_cast<int64_t>(rr) * C + c] : 0.0f;
            }
        }
    };
    auto store = [&](TileStage& st, const StageRegs& ra, const StageRegs& rb) {
#pragma unroll
        for (int i = 0; i < kStageLoads; ++i) {
            const int idx = tid + i * kTileThreads;
            st.a[idx % kTileK][idx / kTileK] = ra.v[i];
            if constexpr (kTransW)
                st.b[idx % kTileK][idx / kTileK] = rb.v[i];
            else
                st.b[idx / kTileN][idx % kTileN] = rb.v[i];
        }
    };

    __shared__ TileStage stages[2];
    float acc[8][8] = {};
    StageRegs ra, rb;
    load(0, ra, rb);
    store(stages[0], ra, rb);
    __syncthreads();
    int cur = 0;
    for (int r0 = 0; r0 < R; r0 += kTileK) {
        const bool more = r0 + kTileK < R;
        if (more) load(r0 + kTileK, ra, rb);  // in flight while this stage is multiplied
        tile_fma(stages[cur], tx, ty, acc);
        if (more) store(stages[cur ^ 1], ra, rb);  // its last readers passed the last barrier
        __syncthreads();
        cur ^= 1;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int row = row_begin + tile_index(ty, i);
        if (row >= row_end) continue;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int c = c0 + tile_index(tx, j);
            if (c >= C) continue;
            float v = acc[i][j];
            if (bias) v += bias[static_cast<int64_t>(e) * C + c];
            float* o = out + static_cast<int64_t>(row) * C + c;
            *o = accumulate ? *o + v : v;
        }
    }
}

// d_w[e][n, k] += sum over e's slots s, in order, of d_out[s, n] * x[s, k]; the blocks of the
// first k tile also add d_bias[e][n] += sum over s of d_out[s, n] (when d_bias is given), from
// the d_out tile they stage anyway. d_out [S, Nout], x [S, K], d_w [E, Nout, K], d_bias
// [E, Nout]. Grid: (max(1, ceil(K / kTileN)), ceil(Nout / kTileM), E); one block owns its
// outputs, so no atomics.
__global__ void __launch_bounds__(kTileThreads)
    grouped_dw_kernel(const float* d_out, const float* x, const int32_t* offsets, int S, int Nout,
                      int K, float* d_w, float* d_bias) {
    const int e = static_cast<int>(blockIdx.z);
    const int begin = slot_bound(offsets, e, S);
    const int end = max(begin, slot_bound(offsets, e + 1, S));
    if (begin == end) return;  // no slots: nothing to add (as the CPU skips the expert)
    const int n0 = static_cast<int>(blockIdx.y) * kTileM,
              k0 = static_cast<int>(blockIdx.x) * kTileN;
    const int tid = static_cast<int>(threadIdx.x), tx = tid % 16, ty = tid / 16;
    const bool with_bias = d_bias != nullptr && blockIdx.x == 0;

    // The slots are the reduction: a[ss][n] = d_out[s0 + ss, n0 + n] and b[ss][k] =
    // x[s0 + ss, k0 + k], both read along their rows (coalesced) with no transpose.
    auto load = [&](int s0, StageRegs& ra, StageRegs& rb) {
#pragma unroll
        for (int i = 0; i < kStageLoads; ++i) {
            const int idx = tid + i * kTileThreads, ss = idx / kTileN, col = idx % kTileN;
            const int s = s0 + ss, n = n0 + col, k = k0 + col;
            ra.v[i] = s < end && n < Nout ? d_out[static_cast<int64_t>(s) * Nout + n] : 0.0f;
            rb.v[i] = s < end && k < K ? x[static_cast<int64_t>(s) * K + k] : 0.0f;
        }
    };
    auto store = [&](TileStage& st, const StageRegs& ra, const StageRegs& rb) {
#pragma unroll
        for (int i = 0; i < kStageLoads; ++i) {
            const int idx = tid + i * kTileThreads;
            st.a[idx / kTileN][idx % kTileN] = ra.v[i];
            st.b[idx / kTileN][idx % kTileN] = rb.v[i];
        }
    };

    __shared__ TileStage stages[2];
    float acc[8][8] = {};
    double bias_acc = 0.0;  // thread tid < kTileM: column n0 + tid of d_bias, in double as the CPU
    StageRegs ra, rb;
    load(begin, ra, rb);
    store(stages[0], ra, rb);
    __syncthreads();
    int cur = 0;
    for (int s0 = begin; s0 < end; s0 += kTileK) {
        const bool more = s0 + kTileK < end;
        if (more) load(s0 + kTileK, ra, rb);
        tile_fma(stages[cur], tx, ty, acc);
        if (with_bias && tid < kTileM) {
#pragma unroll
            for (int ss = 0; ss < kTileK; ++ss) bias_acc += stages[cur].a[ss][tid];
        }
        if (more) store(stages[cur ^ 1], ra, rb);
        __syncthreads();
        cur ^= 1;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int n = n0 + tile_index(ty, i);
        if (n >= Nout) continue;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int k = k0 + tile_index(tx, j);
            if (k < K) d_w[(static_cast<int64_t>(e) * Nout + n) * K + k] += acc[i][j];
        }
    }
    if (with_bias && tid < kTileM && n0 + tid < Nout)
        d_bias[static_cast<int64_t>(e) * Nout + n0 + tid] += static_cast<float>(bias_acc);
}

// ---- grouped matmul in bf16: tensor cores (matmul_bf16.cuh)

// dst [rows, ld] = src [rows, cols] in bf16 (an fp32 src rounded to nearest even, a bf16 one
// copied), each row padded with zeros from cols to ld (a multiple of 8). A thread writes 8 bf16
// (16 bytes) at a time, reading them in 16-byte loads where src's rows allow (vec: src 16-byte
// aligned, cols a multiple of 16 bytes' elements).
template <typename Src>
__global__ void pad_to_bf16_rows_kernel(const Src* src, int64_t rows, int64_t cols, int64_t ld,
                                        bool vec, __nv_bfloat16* dst) {
    const int64_t chunks_per_row = ld / 8, total = rows * chunks_per_row;
    for (int64_t i = cuda::grid_start(); i < total; i += cuda::grid_stride()) {
        const int64_t r = i / chunks_per_row, c0 = (i - r * chunks_per_row) * 8;
        const Src* row = src + r * cols;
        float f[8];
        if (vec && c0 + 8 <= cols) {
            cuda::load8_aligned(row + c0, f);
        } else {
#pragma unroll
            for (int c = 0; c < 8; ++c) f[c] = c0 + c < cols ? cuda::to_float(row[c0 + c]) : 0.0f;
        }
        cuda::store8_aligned(dst + r * ld + c0, f);
    }
}

// A grouped-matmul operand: t's elements as [rows, cols] (cols its last dimension) in bf16,
// rows padded to a multiple of 8 and 16-byte aligned. A BF16 t that already is so (cols a
// multiple of 8, data 16-byte aligned) is used in place, with empty storage; any other is
// copied (F32 rounded).
cuda::Bf16Rows gemm_rows(CudaBackend& be, const Tensor& t, int64_t cols, const char* op) {
    if (t.dtype() == DType::BF16 && cols % 8 == 0) {
        const auto* p = CudaBackend::data<__nv_bfloat16>(t);
        if (cuda::aligned16(p)) return {.data = p, .ld = cols};
    }
    return cuda::pad_to_bf16_rows(be, t, cols, (cols + 7) / 8 * 8, op);
}
bf16_gemm::Operand as_operand(const cuda::Bf16Rows& r) {
    return {r.data, r.ld};
}

// The shared memory a tensor-core kernel uses (bf16_gemm::kSharedBytes) is above the default
// 48 KiB limit: raised for the kernel before each launch (a cheap host call).
template <typename Kernel>
void allow_tile_shared_memory(Kernel kernel, const char* op) {
    TMX_CUDA_CHECK(op, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            bf16_gemm::kSharedBytes));
}

// What the forward and d_x kernels need: A [S, R] (the slots' rows), B the stacked expert
// weights (expert e's at b.p + e * b_expert_stride), bias [E, C] or null, out [S, C].
struct GroupedBf16Args {
    bf16_gemm::Operand a, b;
    int64_t b_expert_stride;
    const float* bias;
    const int32_t* offsets;
    int E, S, R, C;
    bool accumulate;
    float* out;
};

// The forward (kTransW: out[s, c] = sum_r x[s, r] w[e][c, r]) and d_x (d_x[s, c] += sum_r
// d_out[s, r] w[e][r, c]) products of grouped_gemm_kernel, on tensor cores. Grid: (row tiles,
// ceil(C / 128)), as grouped_grid gives; bf16_gemm::kSharedBytes of dynamic shared memory.
// Capped at 128 registers for two blocks per multiprocessor (no spills on sm_89 or sm_90; an
// L4's 100 KiB of shared memory holds one block anyway).
template <bool kTransW>
__global__ void __launch_bounds__(bf16_gemm::kThreads, 2)
    grouped_gemm_bf16_kernel(GroupedBf16Args p) {
    using namespace bf16_gemm;
    int e = 0, row_begin = 0, row_end = 0;
    if (!find_row_tile(p.offsets, p.E, p.S, static_cast<int>(blockIdx.x), e, row_begin, row_end))
        return;  // the whole block: past the last tile
    const int c0 = static_cast<int>(blockIdx.y) * kTile;
    const Operand we{p.b.p + static_cast<int64_t>(e) * p.b_expert_stride, p.b.ld};
    extern __shared__ __align__(128) unsigned char shared_raw[];
    auto* smem = reinterpret_cast<__nv_bfloat16*>(shared_raw);
    Accum acc[kFragRows][kFragCols];
    const auto load_a = [&](int d0, __nv_bfloat16* s) {
        load_stage_async<false>(s, p.a, row_begin, row_end, d0);
    };
    const auto load_b = [&](int d0, __nv_bfloat16* s) {
        if constexpr (kTransW)
            load_stage_async<false>(s, we, c0, p.C, d0);  // w[e] [C, R]: rows c
        else
            load_stage_async<true>(s, we, d0, p.R, c0);  // w[e] [R, C]: rows r
    };
    multiply<kTransW ? Product::Forward : Product::DataGrad>(smem, 0, p.R, load_a, load_b, acc);
    emit_tile(smem, acc, [&](int m, int n, float v) {
        const int row = row_begin + m, c = c0 + n;
        if (row >= row_end || c >= p.C) return;
        if (p.bias) v += p.bias[static_cast<int64_t>(e) * p.C + c];
        float* o = p.out + static_cast<int64_t>(row) * p.C + c;
        *o = p.accumulate ? *o + v : v;
    });
}

// d_w[e][n, k] += sum over e's slots s of d_out[s, n] * x[s, k], on tensor cores. Grid:
// (ceil(K / 128), ceil(Nout / 128), E); dynamic shared memory as above. d_bias is
// expert_bias_grad_kernel's, from the fp32 d_out.
__global__ void __launch_bounds__(bf16_gemm::kThreads, 2)
    grouped_dw_bf16_kernel(bf16_gemm::Operand d_out, bf16_gemm::Operand x, const int32_t* offsets,
                           int S, int Nout, int K, float* d_w) {
    using namespace bf16_gemm;
    const int e = static_cast<int>(blockIdx.z);
    const int begin = slot_bound(offsets, e, S);
    const int end = max(begin, slot_bound(offsets, e + 1, S));
    if (begin == end) return;  // no slots: nothing to add (as the CPU skips the expert)
    const int n0 = static_cast<int>(blockIdx.y) * kTile, k0 = static_cast<int>(blockIdx.x) * kTile;
    extern __shared__ __align__(128) unsigned char shared_raw[];
    auto* smem = reinterpret_cast<__nv_bfloat16*>(shared_raw);
    Accum acc[kFragRows][kFragCols];
    const auto load_a = [&](int s0, __nv_bfloat16* s) {
        load_stage_async<true>(s, d_out, s0, end, n0);
    };
    const auto load_b = [&](int s0, __nv_bfloat16* s) {
        load_stage_async<true>(s, x, s0, end, k0);
    };
    multiply<Product::WeightGrad>(smem, begin, end, load_a, load_b, acc);
    emit_tile(smem, acc, [&](int m, int c, float v) {
        const int n = n0 + m, k = k0 + c;
        if (n < Nout && k < K) d_w[(static_cast<int64_t>(e) * Nout + n) * K + k] += v;
    });
}

// d_bias[e][n] += sum over e's slots s, in order, of d_out[s, n], summed in double (as the
// CPU). Grid: (ceil(Nout / 32), E) of 32 x 8 blocks.
__global__ void expert_bias_grad_kernel(const float* d_out, const int32_t* offsets, int S, int Nout,
                                        float* d_bias) {
    const int e = static_cast<int>(blockIdx.y);
    const int begin = slot_bound(offsets, e, S);
    const int end = max(begin, slot_bound(offsets, e + 1, S));
    if (begin == end) return;  // the whole block
    const int64_t col = static_cast<int64_t>(blockIdx.x) * kSumCols + threadIdx.x;
    const double sum = block_column_sum(d_out, Nout, begin, end, col);
    if (threadIdx.y == 0 && col < Nout)
        d_bias[static_cast<int64_t>(e) * Nout + col] += static_cast<float>(sum);
}

// ---- grouped matmul: matrix-vector path for decode

// Up to this many slots, one warp per output element: decoding's shapes (batch 16 at top-2 is
// 32 slots), where the tiled kernels would compute mostly empty 128-row tiles.
constexpr int64_t kMatvecMaxSlots = 32;

// The expert whose slot range holds s, or -1 (offsets not covering s: the slot is left alone).
__device__ int expert_of_slot(const int32_t* offsets, int E, int s) {
    for (int e = 0; e < E; ++e)
        if (s >= offsets[e] && s < offsets[e + 1]) return e;
    return -1;
}

// out[s, n] = x[s, :] . w[e][n, :] (+ bias[e][n]), one warp per (s, n): the lanes stride along
// the weight row (each weight read once, coalesced) and a butterfly (fixed order) adds them.
// With round_bf16 (bf16 precision) F32 operands are rounded to bf16 as they are read; XT is
// float or __nv_bfloat16 (BF16 x, bf16 precision only), a bf16 element read as it is, so the
// result is the same as from its F32 value. The weight is read through its format's reader
// (weights.cuh: f32, bf16, f16 or Q8_0 as stored), its value rounded like an F32 operand's in
// bf16 precision (exact for a bf16 weight). The loads stay scalar: lane order along k is the
// summation order, the same for every type.
__device__ __forceinline__ float maybe_bf16(float v, bool round_bf16) {
    return round_bf16 ? __bfloat162float(__float2bfloat16_rn(v)) : v;
}
__device__ __forceinline__ float maybe_bf16(__nv_bfloat16 v, bool) {
    return cuda::to_float(v);
}

template <typename XT, typename WR>
__global__ void grouped_matvec_kernel(const XT* x, WR w, const float* bias, const int32_t* offsets,
                                      int E, int S, int Nout, int K, bool round_bf16, float* out) {
    const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
    const int lane = static_cast<int>(threadIdx.x % kWarp);
    if (warp >= static_cast<int64_t>(S) * Nout) return;  // whole warps
    const int s = static_cast<int>(warp / Nout), n = static_cast<int>(warp % Nout);
    const int e = expert_of_slot(offsets, E, s);
    if (e < 0) return;  // the same for the whole warp
    const XT* xs = x + static_cast<int64_t>(s) * K;
    const int64_t wn = (static_cast<int64_t>(e) * Nout + n) * K;
    float acc = 0.0f;
#pragma unroll 4
    for (int k = lane; k < K; k += kWarp)
        acc = fmaf(maybe_bf16(xs[k], round_bf16), maybe_bf16(w[wn + k], round_bf16), acc);
    acc = cuda::warp_sum(acc);
    if (lane == 0) {
        if (bias) acc += bias[static_cast<int64_t>(e) * Nout + n];
        out[static_cast<int64_t>(s) * Nout + n] = acc;
    }
}

// ---- linear on a stored weight (bf16, f16, Q8_0): matrix-vector path for decode

// Up to this many rows of x, linear() on a 16- or 8-bit weight reads it once with the kernel
// below (decoding: one row per sequence); above, the weight is decoded into a matmul operand.
constexpr int kWeightMatvecMaxRows = 16;

// out[m, n] = (accumulate ? out[m, n] : 0) + x[m, :] . w[n, :] (+ bias[n]) for m < M <=
// kWeightMatvecMaxRows, one warp per n: the lanes stride along the weight row, each weight
// element read once for all M rows of x, and a butterfly (fixed order) adds the lanes. Operands
// are rounded to bf16 as they are read in bf16 precision, as grouped_matvec_kernel's.
template <typename XT, typename WR>
__global__ void weight_matvec_kernel(const XT* x, WR w, const float* bias, int M, int N, int K,
                                     bool accumulate, bool round_bf16, float* out) {
    const int64_t n = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
    const int lane = static_cast<int>(threadIdx.x % kWarp);
    if (n >= N) return;  // whole warps
    float acc[kWeightMatvecMaxRows] = {};
    const int64_t row = n * K;
    for (int k = lane; k < K; k += kWarp) {
        const float wv = maybe_bf16(w[row + k], round_bf16);
#pragma unroll
        for (int m = 0; m < kWeightMatvecMaxRows; ++m)
            if (m < M)
                acc[m] =
                    fmaf(maybe_bf16(x[static_cast<int64_t>(m) * K + k], round_bf16), wv, acc[m]);
    }
#pragma unroll
    for (int m = 0; m < kWeightMatvecMaxRows; ++m) {
        if (m >= M) break;  // M is the same for every lane
        float v = cuda::warp_sum(acc[m]);
        if (lane == 0) {
            if (bias) v += bias[n];
            float* o = out + static_cast<int64_t>(m) * N + n;
            *o = accumulate ? *o + v : v;
        }
    }
}

// out[i] = w[i] for n elements: a stored weight decoded to F32, or rounded on to BF16.
template <typename WR, typename Out>
__global__ void decode_weight_kernel(WR w, int64_t n, Out* out) {
    for (int64_t i = cuda::grid_start(); i < n; i += cuda::grid_stride())
        cuda::store_as(out + i, w[i]);
}

// Grid of the grouped kernels: row tiles enough for any split of S slots among E experts
// (sum of ceil(count_e / kTileM) <= ceil(S / kTileM) + E), and column tiles.
dim3 grouped_grid(int S, int E, int C, const char* op) {
    const int64_t row_tiles = (static_cast<int64_t>(S) + kTileM - 1) / kTileM + E;
    const int64_t col_tiles = (static_cast<int64_t>(C) + kTileN - 1) / kTileN;
    if (row_tiles > INT32_MAX || col_tiles > kMaxGridY)
        throw Error(std::string("cuda: ") + op + ": " + std::to_string(S) + " slots x " +
                    std::to_string(C) + " columns exceed the kernel's grid");
    return dim3(static_cast<unsigned>(row_tiles), static_cast<unsigned>(col_tiles));
}

// Grid of the d_w kernels (fp32 and bf16 tiles are both 128 x 128): (ceil(K / 128),
// ceil(Nout / 128), E).
dim3 weight_grad_grid(int E, int Nout, int K, const char* op) {
    static_assert(kTileM == bf16_gemm::kTile && kTileN == bf16_gemm::kTile);
    const int64_t n_tiles = (static_cast<int64_t>(Nout) + kTileM - 1) / kTileM;
    const int64_t k_tiles = (static_cast<int64_t>(K) + kTileN - 1) / kTileN;
    if (n_tiles > kMaxGridY || E > kMaxGridY)
        throw Error(std::string("cuda: ") + op + ": " + std::to_string(E) + " experts x " +
                    std::to_string(Nout) + " outputs exceed the kernel's grid");
    return dim3(static_cast<unsigned>(k_tiles), static_cast<unsigned>(n_tiles),
                static_cast<unsigned>(E));
}

// ---- grouped matmul: one cuBLASLt matmul per expert for training's batches

// From this many slots per expert on average, bf16 grouped products run as one cuBLASLt matmul
// per expert (Hopper's wgmma kernels: several times the tiled kernels' rate at training
// shapes). The host then needs the offsets: one copy and stream sync per product, which costs
// a few microseconds against products of a millisecond, and none below this size (decoding).
constexpr int64_t kLtMinSlotsPerExpert = 256;

// Whether the grouped products take the cuBLASLt path: bf16, enough slots, rows of a multiple
// of 8 elements (so every expert's rows start 16-byte aligned in the contiguous bf16 operands),
// and no CUDA graph being captured (the host cannot read the offsets inside one).
bool lt_grouped(const CudaBackend& be, int64_t S, int64_t E, int64_t Nout, int64_t K,
                const char* op) {
    if (be.matmul_precision() != Precision::BF16 || S < kLtMinSlotsPerExpert * E || Nout % 8 != 0 ||
        K % 8 != 0)
        return false;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    TMX_CUDA_CHECK(op, cudaStreamIsCapturing(be.stream(), &capture));
    return capture == cudaStreamCaptureStatusNone;
}

// Expert e's slots [begin, end), as the kernels read the offsets (slot_bound): clamped to
// [0, S], an end before its begin meaning no slots. Waits for the stream.
std::vector<std::pair<int64_t, int64_t>> expert_slot_ranges(CudaBackend& be, const int32_t* offsets,
                                                            int E, int S, const char* op) {
    std::vector<int32_t> host(static_cast<size_t>(E) + 1);
    TMX_CUDA_CHECK(op, cudaMemcpyAsync(host.data(), offsets, host.size() * sizeof(int32_t),
                                       cudaMemcpyDeviceToHost, be.stream()));
    TMX_CUDA_CHECK(op, cudaStreamSynchronize(be.stream()));
    const auto bound = [&](int e) { return std::clamp<int64_t>(host[e], 0, S); };
    std::vector<std::pair<int64_t, int64_t>> ranges(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) ranges[e] = {bound(e), std::max(bound(e), bound(e + 1))};
    return ranges;
}

void lt_grouped_matmul(const CudaBackend& be, const void* a, const void* b, float* out,
                       const float* bias, int64_t M, int64_t N, int64_t K, bool trans_a,
                       bool trans_b, float beta, const char* op) {
    if (!lt_matmul(be, CUDA_R_16BF, a, b, out, bias, M, N, K, trans_a, trans_b, beta, true))
        throw Error(std::string("cuda: ") + op + ": cuBLASLt has no bf16 algorithm for M=" +
                    std::to_string(M) + ", N=" + std::to_string(N) + ", K=" + std::to_string(K));
}

// out[begin_e.., :] = x_e . w[e]^T (+ bias[e]) per expert. x [S, K] and w [E, Nout, K] as
// contiguous bf16 rows (gemm_rows with K a multiple of 8).
void lt_grouped_forward(CudaBackend& be, const __nv_bfloat16* x, const __nv_bfloat16* w,
                        const float* bias, const int32_t* offsets, int E, int S, int Nout, int K,
                        float* out, const char* op) {
    const auto ranges = expert_slot_ranges(be, offsets, E, S, op);
    for (int e = 0; e < E; ++e) {
        const auto [begin, end] = ranges[e];
        if (begin == end) continue;
        const int64_t rows = end - begin;
        const float* b = bias ? bias + static_cast<int64_t>(e) * Nout : nullptr;
        float* o = out + begin * Nout;
        const __nv_bfloat16* xe = x + begin * K;
        const __nv_bfloat16* we = w + static_cast<int64_t>(e) * Nout * K;
        if (b && cuda::aligned16(b)) {  // the bias through the epilogue, as the dense matmul
            lt_grouped_matmul(be, xe, we, o, b, rows, Nout, K, false, true, 0.0f, op);
            continue;
        }
        if (b) launch_bias_rows(be, o, b, rows, Nout, false, op);
        lt_grouped_matmul(be, xe, we, o, nullptr, rows, Nout, K, false, true, b ? 1.0f : 0.0f, op);
    }
}

// Per expert: d_x[begin_e.., :] += d_out_e . w[e] and d_w[e] += d_out_e^T . x_e. d_out [S, Nout],
// x [S, K], w [E, Nout, K] as contiguous bf16 rows.
void lt_grouped_backward(CudaBackend& be, const __nv_bfloat16* x, const __nv_bfloat16* w,
                         const __nv_bfloat16* d_out, const int32_t* offsets, int E, int S, int Nout,
                         int K, float* d_x, float* d_w, const char* op) {
    const auto ranges = expert_slot_ranges(be, offsets, E, S, op);
    for (int e = 0; e < E; ++e) {
        const auto [begin, end] = ranges[e];
        if (begin == end) continue;  // no slots: nothing to add (as the CPU skips the expert)
        const int64_t rows = end - begin, w_offset = static_cast<int64_t>(e) * Nout * K;
        const __nv_bfloat16* dy = d_out + begin * Nout;
        lt_grouped_matmul(be, dy, w + w_offset, d_x + begin * K, nullptr, rows, K, Nout, false,
                          false, 1.0f, op);
        lt_grouped_matmul(be, dy, x + begin * K, d_w + w_offset, nullptr, Nout, K, rows, true,
                          false, 1.0f, op);
    }
}

}  // namespace

cuda::Bf16Rows cuda::pad_to_bf16_rows(CudaBackend& be, const Tensor& t, int64_t cols, int64_t ld,
                                      const char* op) {
    const int64_t rows = cols > 0 ? t.numel() / cols : 0;
    Bf16Rows r;
    r.storage = be.alloc({std::max<int64_t>(1, (rows * ld + 1) / 2)});  // 2 bf16 per float
    auto* dst = reinterpret_cast<__nv_bfloat16*>(CudaBackend::data<float>(r.storage));
    r.data = dst;
    r.ld = ld;
    if (rows * ld > 0) {
        cuda::with_float_data(t, [&](const auto* src) {
            // Every row's start 16-byte aligned: the first, and the others when cols allows.
            constexpr int64_t kPerChunk = 16 / sizeof(*src);  // elements in 16 bytes
            const bool vec = cuda::aligned16(src) && (rows == 1 || cols % kPerChunk == 0);
            pad_to_bf16_rows_kernel<<<cuda::elementwise_blocks(rows * ld / 8, kThreads,
                                                               be.device().sm_count),
                                      kThreads, 0, be.stream()>>>(src, rows, cols, ld, vec, dst);
        });
        be.check_launch(op);
    }
    return r;
}

Tensor cuda::decode_weight(CudaBackend& be, const Tensor& t, bool to_bf16, const char* op) {
    Tensor out = be.alloc(t.shape(), to_bf16 ? DType::BF16 : DType::F32);
    const int64_t n = t.numel();
    if (n == 0) return out;
    const unsigned blocks = cuda::elementwise_blocks(n, kThreads, be.device().sm_count);
    with_weight_reader(t, [&](auto w) {
        if (to_bf16)
            decode_weight_kernel<<<blocks, kThreads, 0, be.stream()>>>(
                w, n, CudaBackend::data<__nv_bfloat16>(out));
        else
            decode_weight_kernel<<<blocks, kThreads, 0, be.stream()>>>(
                w, n, CudaBackend::data<float>(out));
    });
    be.check_launch(op);
    return out;
}

// A weight in a format the dense matmul does not read (cuda::is_stored_weight): up to
// kWeightMatvecMaxRows rows of x, read as stored by the matrix-vector kernel; more, decoded
// into a matmul operand first (for one product: no copy of the model). Else the dense matmul.
void CudaBackend::linear_impl(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y,
                              bool accumulate) {
    const char* op = "linear";
    const bool bf16 = matmul_precision() == Precision::BF16;
    if (!cuda::is_stored_weight(w, bf16)) {
        Backend::linear_impl(x, w, b, y, accumulate);
        return;
    }
    const int64_t M = x.dim(0), N = w.dim(0), K = w.dim(1);
    if (M == 0 || N == 0) return;
    if (M > kWeightMatvecMaxRows) {
        matmul_impl(x, cuda::decode_weight(*this, w, bf16, op), y,
                    {.trans_b = true, .accumulate = accumulate}, b);
        return;
    }
    const int n = cuda::to_int(N, op), k = cuda::to_int(K, op);
    cuda::with_float_data(x, [&](const auto* xp) {
        cuda::with_weight_reader(w, [&](auto wr) {
            weight_matvec_kernel<<<cuda::blocks_for(N * kWarp, kThreads), kThreads, 0, stream()>>>(
                xp, wr, b.defined() ? data<float>(b) : nullptr, static_cast<int>(M), n, k,
                accumulate, bf16, data<float>(y));
        });
    });
    check_launch(op);
}

void CudaBackend::matmul_impl(const Tensor& a, const Tensor& b, const Tensor& out,
                              MatmulOptions opts, const Tensor& bias) {
    const char* op = "matmul";
    const int64_t M = out.dim(0), N = out.dim(1);
    const int64_t K = opts.trans_a ? a.dim(0) : a.dim(1);
    if (M == 0 || N == 0) return;
    float* o = data<float>(out);
    const float* bias_p = bias.defined() ? data<float>(bias) : nullptr;
    const auto bias_rows = [&](bool keep) { launch_bias_rows(*this, o, bias_p, M, N, keep, op); };
    if (K == 0) {  // an empty sum: out = bias or 0, or unchanged (+ bias) with accumulate
        if (!opts.accumulate || bias_p) bias_rows(opts.accumulate);
        return;
    }
    // In bf16, a BF16 operand as it is, an F32 one as a rounded copy in pool memory (freed in
    // stream order). A BF16 view off 16-byte alignment (a weight at an odd offset of the flat
    // bf16 copy) is copied too: cuBLASLt may have no bf16 algorithm for a 2-byte-aligned operand.
    const bool bf16 = matmul_precision() == Precision::BF16;
    const cudaDataType_t type = bf16 ? CUDA_R_16BF : CUDA_R_32F;
    Tensor a_bf16, b_bf16;
    const auto operand = [&](const Tensor& t, Tensor& copy) -> const void* {
        if (!bf16) return data<float>(t);
        if (t.dtype() == DType::BF16 && cuda::aligned16(data<__nv_bfloat16>(t)))
            return data<__nv_bfloat16>(t);
        // All of t as one row: 8 elements a thread, as the grouped operands.
        const cuda::Bf16Rows r =
            cuda::pad_to_bf16_rows(*this, t, t.numel(), (t.numel() + 7) / 8 * 8, op);
        copy = r.storage;
        return r.data;
    };
    const void* a_p = operand(a, a_bf16);
    const void* b_p = operand(b, b_bf16);
    // The bias through cuBLASLt's epilogue only when overwriting (D = A B + bias, beta = 0): with
    // accumulate it is added to out first, so it is added exactly once whatever cuBLASLt's
    // order of beta * C and the epilogue; likewise where the epilogue has no algorithm. And only
    // for a 16-byte-aligned bias: the alignments the heuristic is told are A's, B's and D's, and
    // an epilogue may load the bias in 16-byte vectors (a bias view at an odd element of the
    // flat parameters is 4-byte aligned).
    if (bias_p && !opts.accumulate && cuda::aligned16(bias_p) &&
        lt_matmul(*this, type, a_p, b_p, o, bias_p, M, N, K, opts.trans_a, opts.trans_b, 0.0f))
        return;
    float beta = opts.accumulate ? 1.0f : 0.0f;
    if (bias_p) {
        bias_rows(opts.accumulate);
        beta = 1.0f;
    }
    if (!lt_matmul(*this, type, a_p, b_p, o, nullptr, M, N, K, opts.trans_a, opts.trans_b, beta))
        throw Error(std::string("cuda: matmul: cuBLASLt has no ") + to_string(matmul_precision()) +
                    " algorithm for M=" + std::to_string(M) + ", N=" + std::to_string(N) +
                    ", K=" + std::to_string(K));
}

// Two passes when the rows span several chunks (per-chunk partial sums in double, then their
// sum in chunk order), one otherwise; the chunking depends only on M: deterministic.
void CudaBackend::bias_backward_impl(const Tensor& d_out, const Tensor& d_bias) {
    const char* op = "bias_backward";
    const int64_t M = d_out.dim(0), N = d_out.dim(1);
    if (M == 0 || N == 0) return;
    const int64_t chunk_rows = std::max(kSumChunkRows, (M + kMaxGridY - 1) / kMaxGridY);
    const int64_t chunks = (M + chunk_rows - 1) / chunk_rows;
    const dim3 grid(cuda::blocks_for(N, kSumCols), static_cast<unsigned>(chunks));
    const dim3 block(kSumCols, kSumLanes);
    if (chunks == 1) {
        column_sums_kernel<<<grid, block, 0, stream()>>>(data<float>(d_out), M, N, chunk_rows,
                                                         nullptr, data<float>(d_bias));
        check_launch(op);
        return;
    }
    // Pool memory (256-byte aligned at offset 0) holds the doubles: 2 floats each.
    Tensor scratch = alloc({2 * chunks * N}, DType::F32);
    auto* partial = reinterpret_cast<double*>(data<float>(scratch));
    column_sums_kernel<<<grid, block, 0, stream()>>>(data<float>(d_out), M, N, chunk_rows, partial,
                                                     nullptr);
    check_launch(op);
    add_partials_kernel<<<cuda::blocks_for(N, kThreads), kThreads, 0, stream()>>>(
        partial, chunks, N, data<float>(d_bias));
    check_launch(op);
}

void CudaBackend::grouped_matmul_impl(const Tensor& x, const Tensor& w, const Tensor& bias,
                                      const Tensor& offsets, const Tensor& out) {
    const char* op = "grouped_matmul";
    const int E = cuda::to_int(w.dim(0), op);
    const int Nout = cuda::to_int(w.dim(1), op), K = cuda::to_int(w.dim(2), op);
    const int S = cuda::to_int(x.dim(0), op);
    if (S == 0 || Nout == 0 || E == 0) return;  // E = 0 leaves no slot to any expert
    const float* bias_p = bias.defined() ? data<float>(bias) : nullptr;
    const bool bf16 = matmul_precision() == Precision::BF16;
    if (S > kMatvecMaxSlots && cuda::is_stored_weight(w, bf16)) {
        // Larger products read the weight decoded (one expert layer at a time, freed in stream
        // order after the product).
        grouped_matmul_impl(x, cuda::decode_weight(*this, w, bf16, op), bias, offsets, out);
        return;
    }
    if (S <= kMatvecMaxSlots) {
        const int64_t warps = static_cast<int64_t>(S) * Nout;
        cuda::with_float_data(x, [&](const auto* xp) {
            cuda::with_weight_reader(w, [&](auto wp) {
                grouped_matvec_kernel<<<cuda::blocks_for(warps * kWarp, kThreads), kThreads, 0,
                                        stream()>>>(xp, wp, bias_p, data<int32_t>(offsets), E, S,
                                                    Nout, K, bf16, data<float>(out));
            });
        });
    } else if (lt_grouped(*this, S, E, Nout, K, op)) {
        const cuda::Bf16Rows xa = gemm_rows(*this, x, K, op), wa = gemm_rows(*this, w, K, op);
        lt_grouped_forward(*this, xa.data, wa.data, bias_p, data<int32_t>(offsets), E, S, Nout, K,
                           data<float>(out), op);
        return;
    } else if (bf16) {
        const cuda::Bf16Rows xa = gemm_rows(*this, x, K, op), wa = gemm_rows(*this, w, K, op);
        const GroupedBf16Args args{.a = as_operand(xa),
                                   .b = as_operand(wa),
                                   .b_expert_stride = static_cast<int64_t>(Nout) * wa.ld,
                                   .bias = bias_p,
                                   .offsets = data<int32_t>(offsets),
                                   .E = E,
                                   .S = S,
                                   .R = K,
                                   .C = Nout,
                                   .accumulate = false,
                                   .out = data<float>(out)};
        allow_tile_shared_memory(grouped_gemm_bf16_kernel<true>, op);
        grouped_gemm_bf16_kernel<true><<<grouped_grid(S, E, Nout, op), bf16_gemm::kThreads,
                                         bf16_gemm::kSharedBytes, stream()>>>(args);
    } else {
        grouped_gemm_kernel<true><<<grouped_grid(S, E, Nout, op), kTileThreads, 0, stream()>>>(
            data<float>(x), data<float>(w), bias_p, data<int32_t>(offsets), E, S, K, Nout, false,
            data<float>(out));
    }
    check_launch(op);
}

void CudaBackend::grouped_matmul_backward_impl(const Tensor& x, const Tensor& w,
                                               const Tensor& offsets, const Tensor& d_out,
                                               const Tensor& d_x, const Tensor& d_w,
                                               const Tensor& d_bias) {
    const char* op = "grouped_matmul_backward";
    const int E = cuda::to_int(w.dim(0), op);
    const int Nout = cuda::to_int(w.dim(1), op), K = cuda::to_int(w.dim(2), op);
    const int S = cuda::to_int(x.dim(0), op);
    // Nothing to add without slots, experts or outputs (d_w and d_bias are then empty too).
    if (S == 0 || E == 0 || Nout == 0) return;
    const int32_t* off = data<int32_t>(offsets);
    if (matmul_precision() == Precision::BF16) {
        grouped_matmul_backward_bf16(x, w, off, E, S, Nout, K, d_out, d_x, d_w, d_bias);
        return;
    }
    if (K > 0) {
        // d_x[s, :] += d_out[s, :] . w[e]: the forward's kernel with w not transposed
        // (a = d_out [S, Nout], reduction over Nout, output columns K).
        grouped_gemm_kernel<false><<<grouped_grid(S, E, K, op), kTileThreads, 0, stream()>>>(
            data<float>(d_out), data<float>(w), nullptr, off, E, S, Nout, K, true,
            data<float>(d_x));
        check_launch(op);
    }
    // d_w (and d_bias); one k tile even when K = 0, whose blocks still sum d_bias.
    const dim3 grid = weight_grad_grid(E, Nout, std::max(K, 1), op);
    grouped_dw_kernel<<<grid, kTileThreads, 0, stream()>>>(
        data<float>(d_out), data<float>(x), off, S, Nout, K, data<float>(d_w),
        d_bias.defined() ? data<float>(d_bias) : nullptr);
    check_launch(op);
}

// grouped_matmul_backward in bf16 precision: the d_x and d_w products on tensor cores, d_bias
// from the fp32 d_out.
void CudaBackend::grouped_matmul_backward_bf16(const Tensor& x, const Tensor& w,
                                               const int32_t* offsets, int E, int S, int Nout,
                                               int K, const Tensor& d_out, const Tensor& d_x,
                                               const Tensor& d_w, const Tensor& d_bias) {
    const char* op = "grouped_matmul_backward";
    if (K > 0 && lt_grouped(*this, S, E, Nout, K, op)) {
        const cuda::Bf16Rows dy = gemm_rows(*this, d_out, Nout, op);
        const cuda::Bf16Rows wa = gemm_rows(*this, w, K, op), xa = gemm_rows(*this, x, K, op);
        lt_grouped_backward(*this, xa.data, wa.data, dy.data, offsets, E, S, Nout, K,
                            data<float>(d_x), data<float>(d_w), op);
    } else if (K > 0) {
        const cuda::Bf16Rows dy = gemm_rows(*this, d_out, Nout, op);
        {
            const cuda::Bf16Rows wa = gemm_rows(*this, w, K, op);
            const GroupedBf16Args args{.a = as_operand(dy),
                                       .b = as_operand(wa),
                                       .b_expert_stride = static_cast<int64_t>(Nout) * wa.ld,
                                       .bias = nullptr,
                                       .offsets = offsets,
                                       .E = E,
                                       .S = S,
                                       .R = Nout,
                                       .C = K,
                                       .accumulate = true,
                                       .out = data<float>(d_x)};
            allow_tile_shared_memory(grouped_gemm_bf16_kernel<false>, op);
            grouped_gemm_bf16_kernel<false><<<grouped_grid(S, E, K, op), bf16_gemm::kThreads,
                                              bf16_gemm::kSharedBytes, stream()>>>(args);
            check_launch(op);
        }
        const cuda::Bf16Rows xa = gemm_rows(*this, x, K, op);
        const dim3 grid = weight_grad_grid(E, Nout, K, op);
        allow_tile_shared_memory(grouped_dw_bf16_kernel, op);
        grouped_dw_bf16_kernel<<<grid, bf16_gemm::kThreads, bf16_gemm::kSharedBytes, stream()>>>(
            as_operand(dy), as_operand(xa), offsets, S, Nout, K, data<float>(d_w));
        check_launch(op);
    }
    if (d_bias.defined()) {
        if (E > kMaxGridY)
            throw Error(std::string("cuda: ") + op + ": " + std::to_string(E) +
                        " experts exceed the kernel's grid");
        const dim3 grid(cuda::blocks_for(Nout, kSumCols), static_cast<unsigned>(E));
        expert_bias_grad_kernel<<<grid, dim3(kSumCols, kSumLanes), 0, stream()>>>(
            data<float>(d_out), offsets, S, Nout, data<float>(d_bias));
        check_launch(op);
    }
}

}  // namespace tmx

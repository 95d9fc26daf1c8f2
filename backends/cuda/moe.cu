// CUDA mixture-of-experts ops, forward and backward (CPU twin: backends/cpu/moe.cpp): router
// top-k with softmax gates, grouping token slots by expert, gathering rows (which is also the
// token embedding), combining expert outputs, the load-balancing loss, and the router's
// backward.
//
// Determinism: no float atomics anywhere. Grouping is a stable CUB radix sort of (expert, slot)
// pairs plus a binary search per expert for the offsets; gather_rows' backward (the embedding's
// too, where token ids repeat) sorts (row, slot) pairs the same way and lets one block add each
// row's run of slots in increasing slot order (the CPU's order, so that sum is bit-exact). Sums
// over tokens (the aux loss, the expert counts of its gradient) are per-chunk partials into
// scratch, then added chunk by chunk in order: the chunking depends only on N, so results do not
// change from run to run or GPU to GPU.
//
// Invalid indices (experts, rows, slots) are reported in the status word and skipped, never
// read or written out of bounds; the host throws at the next sync point.
#include <algorithm>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/weights.cuh"

namespace tmx {
namespace {

using cuda::kWarp;

constexpr int kBlock = 256;
constexpr int kWarpsPerBlock = kBlock / kWarp;  // the warp-per-row kernels: rows per block
// Rows per chunk of the router statistics (aux loss and its gradient's expert counts).
constexpr int kStatRows = 64;

// Threads for a kernel that gives each row of d columns to one block: whole warps covering d
// once, at most kBlock (more columns loop).
int row_threads(int64_t d) {
    return static_cast<int>(std::clamp<int64_t>((d + kWarp - 1) / kWarp * kWarp, kWarp, kBlock));
}

// The low bits a radix sort must look at for keys in [0, max_key] (at least 1).
int key_bits(uint32_t max_key) {
    int bits = 1;
    while (bits < 32 && (max_key >> bits) != 0) ++bits;
    return bits;
}

// Sorts n (key, value) pairs by the low end_bit bits of the key, stably: CUB's radix sort keeps
// equal keys in their input order, which is what makes both groupings below match the CPU.
// Temporary storage comes from the stream-ordered pool (the size query runs on the host only).
void sort_pairs(CudaBackend& be, const char* op, const uint32_t* keys_in, uint32_t* keys_out,
                const int32_t* values_in, int32_t* values_out, int n, int end_bit) {
    size_t bytes = 0;
    TMX_CUDA_CHECK(op, cub::DeviceRadixSort::SortPairs(nullptr, bytes, keys_in, keys_out, values_in,
                                                       values_out, n, 0, end_bit, be.stream()));
    Tensor temp = be.alloc({static_cast<int64_t>(bytes / sizeof(int32_t)) + 1}, DType::I32);
    TMX_CUDA_CHECK(op, cub::DeviceRadixSort::SortPairs(CudaBackend::data<int32_t>(temp), bytes,
                                                       keys_in, keys_out, values_in, values_out, n,
                                                       0, end_bit, be.stream()));
    be.check_launch(op);
}

// The warp-per-row loop: warp w of block b takes row b * kWarpsPerBlock + w, then strides by
// the grid. The row is the same on all lanes, so whole warps enter and leave the loop together
// (the shuffles inside need all 32 lanes).
__device__ __forceinline__ int64_t first_warp_row() {
    return static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
}
__device__ __forceinline__ int64_t warp_row_stride() {
    return static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
}

// ---------------------------------------------------------------- router top-k

// The order router_topk ranks logits in, as one 64-bit key per logit, all keys distinct: the
// float's bits mapped to an unsigned integer that orders like the float (negative values have
// all bits flipped, positive ones the sign bit set), above the complement of the index, so that
// of two equal logits the lower index ranks higher (the CPU's strict-comparison scan). -0 is
// taken as +0 (they compare equal on the CPU); NaN ranks below every number (the CPU's scan
// has no consistent order for NaN; its gates are NaN either way).
__device__ __forceinline__ uint64_t rank_key(float v, int e) {
    uint32_t bits = __float_as_uint(v == 0.0f ? 0.0f : v);
    bits = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
    if (isnan(v)) bits = 0;
    return (static_cast<uint64_t>(bits) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(e));
}

__device__ __forceinline__ int rank_key_index(uint64_t key) {
    return static_cast<int>(0xFFFFFFFFu - static_cast<uint32_t>(key));
}

// One warp per row. Pick j is the largest key below pick j-1's: the j-th largest logit, so the
// picks come out in descending order with no "taken" flags. Each round rescans the row (L1);
// a lane with no candidate offers 0, below every real key (whose low half is >= 2^32 - E).
// Lane 0 writes the picks and the unnormalised gates exp(l_j - l_0), summing them in j order
// as the CPU does; then the lanes divide.
__global__ void router_topk_kernel(const float* logits, int64_t N, int E, int k, int32_t* indices,
                                   float* gates) {
    const int lane = threadIdx.x % kWarp;
    for (int64_t n = first_warp_row(); n < N; n += warp_row_stride()) {
        const float* row = logits + n * E;
        int32_t* top = indices + n * k;
        float* g = gates + n * k;
        uint64_t previous = ~0ull;  // above every key
        float max_logit = 0.0f, sum = 0.0f;
        for (int j = 0; j < k; ++j) {
            uint64_t best = 0;
            for (int e = lane; e < E; e += kWarp) {
                const uint64_t key = rank_key(row[e], e);
                if (key < previous && key > best) best = key;
            }
            for (int o = kWarp / 2; o > 0; o /= 2) {
                const uint64_t other = __shfl_xor_sync(0xffffffffu, best, o);
                best = other > best ? other : best;
            }
            previous = best;
            if (lane == 0) {
                const int e = rank_key_index(best);
                const float v = row[e];
                if (j == 0) max_logit = v;
                const float w = expf(v - max_logit);
                top[j] = e;
                g[j] = w;
                sum += w;
            }
        }
        sum = __shfl_sync(0xffffffffu, sum, 0);
        __syncwarp();  // orders lane 0's stores to g before the other lanes read them
        for (int j = lane; j < k; j += kWarp) g[j] /= sum;
    }
}

// ---------------------------------------------------------------- grouping slots by expert

// keys[s] = expert of slot s, values[s] = s. An expert outside [0, E) is reported and clamped
// into it, so that the sort and the offsets below stay in bounds.
__global__ void expert_keys_kernel(const int32_t* indices, int S, int E, uint32_t* keys,
                                   int32_t* slots, int* status) {
    for (int64_t s = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; s < S;
         s += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        int e = indices[s];
        if (e < 0 || e >= E) {
            cuda::report_error(status, cuda::kBadExpert, e, E);
            e = e < 0 || E == 0 ? 0 : E - 1;
        }
        keys[s] = static_cast<uint32_t>(e);
        slots[s] = static_cast<int32_t>(s);
    }
}

// Sorted position p holds slot s = sorted_slots[p]: its token is s / k, and s's sorted slot is
// p. Stability put each expert's slots in increasing s, i.e. in the CPU's scatter order.
__global__ void place_slots_kernel(const int32_t* sorted_slots, int S, int k, int32_t* slot_rows,
                                   int32_t* slot_of) {
    for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < S;
         p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int32_t s = sorted_slots[p];
        slot_rows[p] = s / k;
        slot_of[s] = static_cast<int32_t>(p);
    }
}

// offsets[e] = the number of sorted keys below e (a binary search): the prefix sum of the
// per-expert counts, with no counting pass. offsets[E] = S.
__global__ void expert_offsets_kernel(const uint32_t* sorted_keys, int S, int E, int32_t* offsets) {
    for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e <= E;
         e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        int lo = 0, hi = S;  // the first position in [lo, hi) whose key is >= e
        while (lo < hi) {
            const int mid = lo + (hi - lo) / 2;
            if (sorted_keys[mid] < static_cast<uint32_t>(e))
                lo = mid + 1;
            else
                hi = mid;
        }
        offsets[e] = lo;
    }
}

// ---------------------------------------------------------------- gather rows

// One block per slot s (grid-stride), threads over columns. A bad row is reported and its
// output row zeroed. X: a pointer to T, the same type as out (F32, or BF16 copied as it is), or
// a weights.cuh reader of a stored weight format (an embedding table) with T float.
template <typename X, typename T>
__global__ void gather_rows_kernel(X x, const int32_t* rows, int64_t S, int N, int64_t d, T* out,
                                   int* status) {
    for (int64_t s = blockIdx.x; s < S; s += gridDim.x) {
        const int32_t r = rows[s];
        T* dst = out + s * d;
        if (r < 0 || r >= N) {
            if (threadIdx.x == 0) cuda::report_error(status, cuda::kBadRow, r, N);
            for (int64_t c = threadIdx.x; c < d; c += blockDim.x) dst[c] = T(0.0f);
            continue;
        }
        const int64_t src = static_cast<int64_t>(r) * d;
        for (int64_t c = threadIdx.x; c < d; c += blockDim.x) dst[c] = x[src + c];
    }
}

// keys[s] = rows[s], values[s] = s. A row outside [0, N) is reported and keyed N: it sorts
// after every valid row and is skipped.
__global__ void row_keys_kernel(const int32_t* rows, int S, int N, uint32_t* keys, int32_t* slots,
                                int* status) {
    for (int64_t s = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; s < S;
         s += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int32_t r = rows[s];
        const bool ok = r >= 0 && r < N;
        if (!ok) cuda::report_error(status, cuda::kBadRow, r, N);
        keys[s] = static_cast<uint32_t>(ok ? r : N);
        slots[s] = static_cast<int32_t>(s);
    }
}

// d_x[row, :] += d_out[s, :] for each run of equal rows in the sorted pairs. Block (p, y) looks
// at sorted position p; only the block at the start of a run works: its threads take columns
// (y-strided) and each adds the run's d_out rows in increasing s, starting from d_x, and stores
// once. That is the CPU's order of additions, so the result is bit-exact; no two blocks write
// the same element.
__global__ void add_row_runs_kernel(const uint32_t* sorted_rows, const int32_t* sorted_slots, int S,
                                    uint32_t N, const float* d_out, int64_t d, float* d_x) {
    for (int64_t p = blockIdx.x; p < S; p += gridDim.x) {
        const uint32_t row = sorted_rows[p];
        if (row >= N || (p > 0 && sorted_rows[p - 1] == row)) continue;  // invalid, or not a start
        float* dst = d_x + static_cast<int64_t>(row) * d;
        for (int64_t c = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; c < d;
             c += static_cast<int64_t>(gridDim.y) * blockDim.x) {
            float acc = dst[c];
            for (int64_t q = p; q < S && sorted_rows[q] == row; ++q)
                acc += d_out[static_cast<int64_t>(sorted_slots[q]) * d + c];
            dst[c] = acc;
        }
    }
}

// ---------------------------------------------------------------- combine

// One block per token n (grid-stride), threads over columns; each column adds its k gated
// expert outputs in ascending j onto out. Bad slots are reported (thread 0) and skipped.
__global__ void moe_combine_kernel(const float* expert_out, const int32_t* slot_of,
                                   const float* gates, int64_t N, int k, int64_t d, int S,
                                   float* out, int* status) {
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
        const int32_t* slots = slot_of + n * k;
        const float* g = gates + n * k;
        if (threadIdx.x == 0)
            for (int j = 0; j < k; ++j)
                if (slots[j] < 0 || slots[j] >= S)
                    cuda::report_error(status, cuda::kBadSlot, slots[j], S);
        float* dst = out + n * d;
        for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
            float acc = dst[c];
            for (int j = 0; j < k; ++j) {
                const int32_t slot = slots[j];
                if (slot < 0 || slot >= S) continue;
                acc += g[j] * expert_out[static_cast<int64_t>(slot) * d + c];
            }
            dst[c] = acc;
        }
    }
}

// One block per token n (grid-stride). For each choice j: every column adds gate * d_out into
// the slot's d_expert_out row (each slot belongs to one (n, j) in valid use, so blocks never
// share a row) and a partial dot(d_out, expert_out[slot]); block_sum combines the partials in
// a fixed order and thread 0 adds it to d_gates. A bad slot skips the whole j (block-uniform,
// so every thread still reaches the same block_sum calls).
__global__ void moe_combine_backward_kernel(const float* expert_out, const int32_t* slot_of,
                                            const float* gates, const float* d_out, int64_t N,
                                            int k, int64_t d, int S, float* d_expert_out,
                                            float* d_gates, int* status) {
    __shared__ float partials[kWarp];
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
        const float* grad = d_out + n * d;
        for (int j = 0; j < k; ++j) {
            const int32_t slot = slot_of[n * k + j];
            if (slot < 0 || slot >= S) {
                if (threadIdx.x == 0) cuda::report_error(status, cuda::kBadSlot, slot, S);
                continue;
            }
            const float gate = gates[n * k + j];
            const float* y = expert_out + static_cast<int64_t>(slot) * d;
            float* dy = d_expert_out + static_cast<int64_t>(slot) * d;
            float dot = 0.0f;
            for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
                dy[c] += gate * grad[c];
                dot += grad[c] * y[c];
            }
            dot = cuda::block_sum(dot, partials);
            if (threadIdx.x == 0) d_gates[n * k + j] += dot;
        }
    }
}

// ---------------------------------------------------------------- router statistics

// Per-chunk partial sums for the load-balancing loss: block b takes rows [b * kStatRows, ...)
// and writes, for every expert e, count_part[b * E + e] = how many of the chunk's choices name
// e and (kProbs) prob_part[b * E + e] = the sum over the chunk's rows of softmax(row)_e, in
// double as the CPU. First a warp per row finds the row's max and softmax denominator (and
// reports invalid expert indices); then a thread per expert walks the chunk's rows in order.
template <bool kProbs>
__global__ void router_stats_kernel(const float* logits, const int32_t* indices, int64_t N, int E,
                                    int k, double* prob_part, int* count_part, int* status) {
    __shared__ float row_max[kStatRows];
    __shared__ double row_z[kStatRows];
    const int lane = threadIdx.x % kWarp;
    const int64_t first = static_cast<int64_t>(blockIdx.x) * kStatRows;
    const int rows = N - first < kStatRows ? static_cast<int>(N - first) : kStatRows;
    for (int r = threadIdx.x / kWarp; r < rows; r += blockDim.x / kWarp) {
        const int64_t n = first + r;
        for (int j = lane; j < k; j += kWarp) {
            const int32_t e = indices[n * k + j];
            if (e < 0 || e >= E) cuda::report_error(status, cuda::kBadExpert, e, E);
        }
        if constexpr (kProbs) {
            const float* row = logits + n * E;
            float m = -INFINITY;
            for (int e = lane; e < E; e += kWarp) m = fmaxf(m, row[e]);
            m = cuda::warp_max(m);
            double z = 0.0;
            for (int e = lane; e < E; e += kWarp) z += exp(static_cast<double>(row[e] - m));
            z = cuda::warp_sum(z);
            if (lane == 0) {
                row_max[r] = m;
                row_z[r] = z;
            }
        }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        double p = 0.0;
        int count = 0;
        for (int r = 0; r < rows; ++r) {
            const int64_t n = first + r;
            if constexpr (kProbs)
                p += exp(static_cast<double>(logits[n * E + e] - row_max[r])) / row_z[r];
            for (int j = 0; j < k; ++j) count += indices[n * k + j] == e;
        }
        if constexpr (kProbs) prob_part[static_cast<int64_t>(blockIdx.x) * E + e] = p;
        count_part[static_cast<int64_t>(blockIdx.x) * E + e] = count;
    }
}

// The chunks' partials of expert e, added in chunk order.
__device__ int64_t total_count(const int* count_part, int chunks, int E, int e) {
    int64_t c = 0;
    for (int b = 0; b < chunks; ++b) c += count_part[static_cast<int64_t>(b) * E + e];
    return c;
}

// out[0] = E * sum_e f_e P_e, f_e = count_e / N, P_e = prob_e / N. One block: a thread per
// expert writes its term to scratch, then thread 0 adds the terms in e order (the CPU's).
// N = 0 gives NaN, as on the CPU.
__global__ void router_aux_loss_final_kernel(const double* prob_part, const int* count_part,
                                             int chunks, int64_t N, int E, double* terms,
                                             float* out) {
    const double n = static_cast<double>(N);
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        double p = 0.0;
        for (int b = 0; b < chunks; ++b) p += prob_part[static_cast<int64_t>(b) * E + e];
        const double c = static_cast<double>(total_count(count_part, chunks, E, e));
        terms[e] = (c / n) * (p / n);
    }
    __syncthreads();  // also orders the global stores to terms before thread 0 reads them
    if (threadIdx.x == 0) {
        double aux = 0.0;
        for (int e = 0; e < E; ++e) aux += terms[e];
        out[0] = static_cast<float>(static_cast<double>(E) * aux);
    }
}

// d aux_total / d p[n, e] = aux_weight * E * f_e / N, the same for every token (f constant),
// written term by term as the CPU.
__global__ void router_aux_grad_kernel(const int* count_part, int chunks, int64_t N, int E,
                                       float aux_weight, double* dprob) {
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        const double c = static_cast<double>(total_count(count_part, chunks, E, e));
        const double n = static_cast<double>(N);
        dprob[e] = static_cast<double>(aux_weight) * static_cast<double>(E) * (c / n) / n;
    }
}

// One warp per row: d_logits[n, e] += the gate softmax's gradient where e is one of the row's
// choices (d r_j = g_j (dg_j - sum_l g_l dg_l)), then (dprob given) the full softmax's
// p_e (dprob_e - <p, dprob>). Each lane owns its experts e and adds their terms in the CPU's
// order (choices in ascending j, then the aux term) before one store, so repeated choices
// cannot race. Invalid choices are reported and match no e.
__global__ void router_backward_kernel(const float* logits, const int32_t* indices,
                                       const float* gates, const float* d_gates,
                                       const double* dprob, int64_t N, int E, int k,
                                       float* d_logits, int* status) {
    const int lane = threadIdx.x % kWarp;
    for (int64_t n = first_warp_row(); n < N; n += warp_row_stride()) {
        const int32_t* top = indices + n * k;
        const float* g = gates + n * k;
        const float* dg = d_gates + n * k;
        const float* row = logits + n * E;
        float* drow = d_logits + n * E;
        double s = 0.0;
        for (int j = lane; j < k; j += kWarp) {
            s += static_cast<double>(g[j]) * dg[j];
            if (top[j] < 0 || top[j] >= E) cuda::report_error(status, cuda::kBadExpert, top[j], E);
        }
        s = cuda::warp_sum(s);
        float m = 0.0f;
        double z = 1.0, dot = 0.0;
        if (dprob) {  // uniform over the grid
            m = -INFINITY;
            for (int e = lane; e < E; e += kWarp) m = fmaxf(m, row[e]);
            m = cuda::warp_max(m);
            z = 0.0;
            for (int e = lane; e < E; e += kWarp) z += exp(static_cast<double>(row[e] - m));
            z = cuda::warp_sum(z);
            for (int e = lane; e < E; e += kWarp)
                dot += exp(static_cast<double>(row[e] - m)) / z * dprob[e];
            dot = cuda::warp_sum(dot);
        }
        for (int e = lane; e < E; e += kWarp) {
            float v = drow[e];
            for (int j = 0; j < k; ++j)
                if (top[j] == e) v += static_cast<float>(g[j] * (dg[j] - s));
            if (dprob) {
                const double p = exp(static_cast<double>(row[e] - m)) / z;
                v += static_cast<float>(p * (dprob[e] - dot));
            }
            drow[e] = v;
        }
    }
}

}  // namespace

// ---------------------------------------------------------------- ops

void CudaBackend::router_topk_impl(const Tensor& logits, const Tensor& indices,
                                   const Tensor& gates) {
    const char* op = "router_topk";
    const int64_t N = logits.dim(0);
    if (N == 0) return;
    const int E = cuda::to_int(logits.dim(1), op), k = cuda::to_int(indices.dim(1), op);
    router_topk_kernel<<<cuda::blocks_for(N, kWarpsPerBlock), kBlock, 0, stream()>>>(
        data<float>(logits), N, E, k, data<int32_t>(indices), data<float>(gates));
    check_launch(op);
}

void CudaBackend::moe_group_impl(const Tensor& indices, int64_t n_experts, const Tensor& offsets,
                                 const Tensor& slot_rows, const Tensor& slot_of) {
    const char* op = "moe_group";
    const int S = cuda::to_int(indices.numel(), op), E = cuda::to_int(n_experts, op);
    const int k = S > 0 ? cuda::to_int(indices.dim(1), op) : 1;
    Tensor keys, sorted_keys;
    if (S > 0) {
        keys = alloc({S}, DType::I32);
        sorted_keys = alloc({S}, DType::I32);
        Tensor slots = alloc({S}, DType::I32), sorted_slots = alloc({S}, DType::I32);
        expert_keys_kernel<<<cuda::blocks_for(S, kBlock), kBlock, 0, stream()>>>(
            data<int32_t>(indices), S, E, data<uint32_t>(keys), data<int32_t>(slots),
            status_word());
        check_launch(op);
        sort_pairs(*this, op, data<uint32_t>(keys), data<uint32_t>(sorted_keys),
                   data<int32_t>(slots), data<int32_t>(sorted_slots), S,
                   key_bits(static_cast<uint32_t>(std::max(E - 1, 0))));
        place_slots_kernel<<<cuda::blocks_for(S, kBlock), kBlock, 0, stream()>>>(
            data<int32_t>(sorted_slots), S, k, data<int32_t>(slot_rows), data<int32_t>(slot_of));
        check_launch(op);
    }
    // With no slots, sorted_keys is never read (S = 0): every offset is 0.
    expert_offsets_kernel<<<cuda::blocks_for(int64_t{E} + 1, kBlock), kBlock, 0, stream()>>>(
        S > 0 ? data<uint32_t>(sorted_keys) : nullptr, S, E, data<int32_t>(offsets));
    check_launch(op);
}

void CudaBackend::gather_rows_impl(const Tensor& x, const Tensor& rows, const Tensor& out) {
    const char* op = "gather_rows";
    const int64_t S = rows.dim(0), d = x.dim(1);
    if (S == 0) return;
    const int N = cuda::to_int(x.dim(0), op);
    auto launch = [&](auto x_read, auto* out_p) {
        gather_rows_kernel<<<cuda::blocks_for(S, 1), row_threads(d), 0, stream()>>>(
            x_read, data<int32_t>(rows), S, N, d, out_p, status_word());
    };
    if (out.dtype() == DType::BF16)  // x too: its bits copied
        launch(data<__nv_bfloat16>(x), data<__nv_bfloat16>(out));
    else  // x in any weight format, its values into F32
        cuda::with_weight_reader(x, [&](auto reader) { launch(reader, data<float>(out)); });
    check_launch(op);
}

void CudaBackend::gather_rows_backward_impl(const Tensor& rows, const Tensor& d_out,
                                            const Tensor& d_x) {
    const char* op = "gather_rows_backward";
    const int S = cuda::to_int(rows.dim(0), op), N = cuda::to_int(d_x.dim(0), op);
    const int64_t d = d_x.dim(1);
    if (S == 0) return;
    Tensor keys = alloc({S}, DType::I32), sorted_keys = alloc({S}, DType::I32);
    Tensor slots = alloc({S}, DType::I32), sorted_slots = alloc({S}, DType::I32);
    row_keys_kernel<<<cuda::blocks_for(S, kBlock), kBlock, 0, stream()>>>(
        data<int32_t>(rows), S, N, data<uint32_t>(keys), data<int32_t>(slots), status_word());
    check_launch(op);
    // Keys go up to N (the invalid-row key).
    sort_pairs(*this, op, data<uint32_t>(keys), data<uint32_t>(sorted_keys), data<int32_t>(slots),
               data<int32_t>(sorted_slots), S, key_bits(static_cast<uint32_t>(N)));
    const int threads = row_threads(d);
    // y: column chunks of `threads` (at least 1, at most the grid's y limit; more columns loop).
    const int64_t column_chunks = std::clamp<int64_t>((d + threads - 1) / threads, 1, 65535);
    const dim3 grid(cuda::blocks_for(S, 1), static_cast<unsigned>(column_chunks));
    add_row_runs_kernel<<<grid, threads, 0, stream()>>>(
        data<uint32_t>(sorted_keys), data<int32_t>(sorted_slots), S, static_cast<uint32_t>(N),
        data<float>(d_out), d, data<float>(d_x));
    check_launch(op);
}

void CudaBackend::moe_combine_impl(const Tensor& expert_out, const Tensor& slot_of,
                                   const Tensor& gates, const Tensor& out) {
    const char* op = "moe_combine";
    const int64_t N = gates.dim(0), d = out.dim(1);
    const int S = cuda::to_int(gates.numel(), op);
    if (S == 0) return;
    const int k = cuda::to_int(gates.dim(1), op);
    moe_combine_kernel<<<cuda::blocks_for(N, 1), row_threads(d), 0, stream()>>>(
        data<float>(expert_out), data<int32_t>(slot_of), data<float>(gates), N, k, d, S,
        data<float>(out), status_word());
    check_launch(op);
}

void CudaBackend::moe_combine_backward_impl(const Tensor& expert_out, const Tensor& slot_of,
                                            const Tensor& gates, const Tensor& d_out,
                                            const Tensor& d_expert_out, const Tensor& d_gates) {
    const char* op = "moe_combine_backward";
    const int64_t N = gates.dim(0), d = d_out.dim(1);
    const int S = cuda::to_int(gates.numel(), op);
    if (S == 0) return;
    const int k = cuda::to_int(gates.dim(1), op);
    moe_combine_backward_kernel<<<cuda::blocks_for(N, 1), row_threads(d), 0, stream()>>>(
        data<float>(expert_out), data<int32_t>(slot_of), data<float>(gates), data<float>(d_out), N,
        k, d, S, data<float>(d_expert_out), data<float>(d_gates), status_word());
    check_launch(op);
}

void CudaBackend::router_aux_loss_impl(const Tensor& logits, const Tensor& indices,
                                       const Tensor& out) {
    const char* op = "router_aux_loss";
    const int64_t N = logits.dim(0);
    const int E = cuda::to_int(logits.dim(1), op), k = cuda::to_int(indices.dim(1), op);
    const int chunks = cuda::to_int((N + kStatRows - 1) / kStatRows, op);
    const int64_t parts = std::max<int64_t>(int64_t{chunks} * E, 1);
    // Doubles live in F32 tensors of twice the length (fresh allocations: 256-byte aligned).
    Tensor prob_part = alloc({2 * parts}, DType::F32), count_part = alloc({parts}, DType::I32);
    Tensor terms = alloc({2 * std::max(E, 1)}, DType::F32);
    auto* probs = reinterpret_cast<double*>(data<float>(prob_part));
    if (chunks > 0) {
        router_stats_kernel<true>
            <<<chunks, kBlock, 0, stream()>>>(data<float>(logits), data<int32_t>(indices), N, E, k,
                                              probs, data<int>(count_part), status_word());
        check_launch(op);
    }
    router_aux_loss_final_kernel<<<1, kBlock, 0, stream()>>>(
        probs, data<int>(count_part), chunks, N, E, reinterpret_cast<double*>(data<float>(terms)),
        data<float>(out));
    check_launch(op);
}

void CudaBackend::router_backward_impl(const Tensor& logits, const Tensor& indices,
                                       const Tensor& gates, const Tensor& d_gates, float aux_weight,
                                       const Tensor& d_logits) {
    const char* op = "router_backward";
    const int64_t N = logits.dim(0);
    if (N == 0) return;
    const int E = cuda::to_int(logits.dim(1), op), k = cuda::to_int(indices.dim(1), op);
    // The aux term is on whenever aux_weight != 0, as on the CPU.
    Tensor dprob;
    if (aux_weight != 0.0f) {
        const int chunks = cuda::to_int((N + kStatRows - 1) / kStatRows, op);
        Tensor count_part = alloc({std::max<int64_t>(int64_t{chunks} * E, 1)}, DType::I32);
        dprob = alloc({2 * std::max(E, 1)}, DType::F32);  // E doubles
        router_stats_kernel<false>
            <<<chunks, kBlock, 0, stream()>>>(data<float>(logits), data<int32_t>(indices), N, E, k,
                                              nullptr, data<int>(count_part), status_word());
        check_launch(op);
        router_aux_grad_kernel<<<1, kBlock, 0, stream()>>>(
            data<int>(count_part), chunks, N, E, aux_weight,
            reinterpret_cast<double*>(data<float>(dprob)));
        check_launch(op);
    }
    router_backward_kernel<<<cuda::blocks_for(N, kWarpsPerBlock), kBlock, 0, stream()>>>(
        data<float>(logits), data<int32_t>(indices), data<float>(gates), data<float>(d_gates),
        dprob.defined() ? reinterpret_cast<double*>(data<float>(dprob)) : nullptr, N, E, k,
        data<float>(d_logits), status_word());
    check_launch(op);
}

}  // namespace tmx

// The tiled GEMM core of matmul.comp and grouped_matmul.comp on cooperative matrices (NVIDIA's
// GL_NV_cooperative_matrix: tensor cores): the variants ".cm" (vulkan_tuning.h), built for fp16
// weights only (the *_cm_f16w modules), whose values fp16 holds exactly.
//
// A workgroup computes a BM x BN tile of op(a) . op(b) as matmul_tile.glsl does, staging BK-deep
// slices in shared memory (the next slice's global reads issued before the current slice's
// products), but as fp16: b's as they are, a's as two halves, hi = fp16(a) and
// lo = fp16((a - hi) * 2^11), each multiplied by b in fp32 (lo's product scaled back by 2^-11:
// scaled, lo stays clear of fp16's subnormals, which a device may flush). hi + lo 2^-11 holds a
// to about 2^-22 of its value, so the product keeps fp32's accuracy (the tests' and `tmx
// tune`'s fp32 tolerances hold) at two tensor-core products per block; a value of a beyond
// fp16's range (|a| > 65504) is no longer held and gives an infinite or NaN result, which the
// callers' checks of non-finite values then name.
//
// The tile is (BM / 16) x (BN / CN) blocks of 16 x CN; each of the workgroup's WG / SGS
// subgroups owns BPS consecutive blocks (in row-major order) and their accumulators. After the
// product, tile_store() hands every element of the tile to the includer's emit(i, j, r) (tile
// row i, tile column j, the product r), through a per-subgroup staging block in shared memory.
//
// The host (vulkan_tuning.cpp) makes these hold: BM and BK multiples of 16, BN of CN, WG of
// SGS, and the block count of the subgroup count; SGS is the device's subgroup size (NVIDIA's
// fixed 32) and CN 16 or 8, the 16 x CN x 16 fp16 shape the device reports.
//
// Include after declaring: the extensions (matmul.comp), the specialization constants WG, BM,
// BN, BK (0..3), the buffer `float a[]`, weights.glsl (b), and void emit(uint, uint, float).

layout(constant_id = 6) const uint SGS = 32;  // the subgroup's invocations
layout(constant_id = 7) const uint CN = 16;   // a block's columns

const uint NSG = WG / SGS;
const uint BLOCKS_N = BN / CN;
const uint BPS = (BM / 16) * BLOCKS_N / NSG;  // blocks per subgroup
// Row pitches in halves: a slice row of a (BK along k) and a slice column of b (BK along k),
// padded by 8 halves so that rows start 16 bytes apart from a bank's stride (a cooperative
// load needs rows on 16-byte boundaries).
const uint AP = BK + 8, BP = BK + 8;
const float LO_SCALE = 2048.0;  // 2^11: a's low half, scaled into fp16's normal range
shared float16_t tile_hi[BM * AP];
shared float16_t tile_lo[BM * AP];
shared float16_t tile_b[BN * BP];
shared float tile_out[NSG * 16 * CN];

fcoopmatNV<32, gl_ScopeSubgroup, 16, CN> acc_cm[BPS];

// A slice is fetched into registers (UA values of a and UB of b an invocation) while the
// previous one is multiplied, then stored to shared memory, as matmul_tile.glsl does. Element u
// of a slice: row (or column) and k, consecutive invocations taking consecutive k where k is
// the operand's contiguous dimension.
const uint UA = (BM * BK + WG - 1) / WG, UB = (BN * BK + WG - 1) / WG;
float next_a[UA], next_b[UB];

uvec2 coop_place(uint u, bool k_contiguous, uint side) {
    return k_contiguous ? uvec2(u / BK, u % BK) : uvec2(u % side, u / side);
}

// The slice at k0: the tile's rows [0, rows) of a and columns [0, cols) of b, zeros beyond
// them and beyond K.
void fetch_coop_slice(uint k0, uint row0, uint rows, uint col0, uint cols, uint K, uint a_base,
                      uint a_sm, uint a_sk, uint b_origin, uint b_base, uint b_sk, uint b_sn) {
    const uint t = gl_LocalInvocationID.x;
    for (uint s = 0; s < UA; ++s) {
        const uint u = t + s * WG;
        const uvec2 p = coop_place(u, a_sk == 1, BM);
        next_a[s] = u < BM * BK && p.x < rows && k0 + p.y < K
                        ? a[a_base + (row0 + p.x) * a_sm + (k0 + p.y) * a_sk]
                        : 0.0;
    }
    for (uint s = 0; s < UB; ++s) {
        const uint u = t + s * WG;
        const uvec2 p = coop_place(u, b_sk == 1, BN);
        next_b[s] = u < BN * BK && p.x < cols && k0 + p.y < K
                        ? weight_at(b_origin, b_base + (k0 + p.y) * b_sk + (col0 + p.x) * b_sn)
                        : 0.0;
    }
}

// The fetched slice to shared memory: a as its two halves, b as fp16.
void stage_coop_slice(bool a_k_contiguous, bool b_k_contiguous) {
    const uint t = gl_LocalInvocationID.x;
    for (uint s = 0; s < UA; ++s) {
        const uint u = t + s * WG;
        if (u >= BM * BK) break;
        const uvec2 p = coop_place(u, a_k_contiguous, BM);
        const float16_t hi = float16_t(next_a[s]);
        tile_hi[p.x * AP + p.y] = hi;
        tile_lo[p.x * AP + p.y] = float16_t((next_a[s] - float(hi)) * LO_SCALE);
    }
    for (uint s = 0; s < UB; ++s) {
        const uint u = t + s * WG;
        if (u >= BN * BK) break;
        const uvec2 p = coop_place(u, b_k_contiguous, BN);
        tile_b[p.x * BP + p.y] = float16_t(next_b[s]);
    }
}

// The product of the tile at (row0, col0), its operands as matmul_tile.glsl's tile_gemm takes
// them.
void tile_gemm(uint row0, uint rows, uint col0, uint cols, uint K, uint a_base, uint a_sm,
               uint a_sk, uint b_origin, uint b_base, uint b_sk, uint b_sn) {
    const uint sg = gl_SubgroupID;
    fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> a_hi, a_lo;
    fcoopmatNV<16, gl_ScopeSubgroup, 16, CN> b_blk;
    const fcoopmatNV<32, gl_ScopeSubgroup, 16, CN> zero =
        fcoopmatNV<32, gl_ScopeSubgroup, 16, CN>(0.0);
    for (uint b = 0; b < BPS; ++b) acc_cm[b] = zero;
    fetch_coop_slice(0, row0, rows, col0, cols, K, a_base, a_sm, a_sk, b_origin, b_base, b_sk,
                     b_sn);
    for (uint k0 = 0; k0 < K; k0 += BK) {
        stage_coop_slice(a_sk == 1, b_sk == 1);
        barrier();
        if (k0 + BK < K)
            fetch_coop_slice(k0 + BK, row0, rows, col0, cols, K, a_base, a_sm, a_sk, b_origin,
                             b_base, b_sk, b_sn);
        for (uint kk = 0; kk < BK; kk += 16) {
            uint loaded_row = ~0u;
            for (uint b = 0; b < BPS; ++b) {
                const uint blk = sg * BPS + b, bi = blk / BLOCKS_N, bj = blk % BLOCKS_N;
                if (bi != loaded_row) {  // the same for the whole subgroup
                    coopMatLoadNV(a_hi, tile_hi, bi * 16 * AP + kk, AP, false);
                    coopMatLoadNV(a_lo, tile_lo, bi * 16 * AP + kk, AP, false);
                    loaded_row = bi;
                }
                // b's slice is stored column by column: column-major K x CN blocks.
                coopMatLoadNV(b_blk, tile_b, bj * CN * BP + kk, BP, true);
                acc_cm[b] = coopMatMulAddNV(a_hi, b_blk, acc_cm[b]);
                acc_cm[b] += coopMatMulAddNV(a_lo, b_blk, zero) * (1.0 / LO_SCALE);
            }
        }
        barrier();
    }
}

void emit(uint i, uint j, float r);

// emit() for every element of the subgroup's blocks: each block through the subgroup's staging
// area, its elements spread over the subgroup's invocations.
void tile_store() {
    const uint sg = gl_SubgroupID, lane = gl_SubgroupInvocationID, base = sg * 16 * CN;
    for (uint b = 0; b < BPS; ++b) {
        const uint blk = sg * BPS + b, bi = blk / BLOCKS_N, bj = blk % BLOCKS_N;
        coopMatStoreNV(acc_cm[b], tile_out, base, CN, false);
        subgroupMemoryBarrierShared();
        subgroupBarrier();
        for (uint e = lane; e < 16 * CN; e += SGS)
            emit(bi * 16 + e / CN, bj * CN + e % CN, tile_out[base + e]);
        subgroupBarrier();  // read before the next block overwrites it
    }
}

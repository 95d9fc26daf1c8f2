// The tiled GEMM core shared by matmul.comp and grouped_matmul.comp: a workgroup computes a
// BM x BN tile of op(a) . op(b), staging BM x BK and BK x BN slices in shared memory; each
// invocation accumulates a TM x TN register block (rows ty + i*BM/TM, columns tx + j*BN/TN:
// strided, so neighbouring invocations touch neighbouring shared-memory words and output
// columns). Tile sizes are specialization constants; the host sets WG = (BM/TM) * (BN/TN).
//
// Include after declaring: the specialization constants WG, BM, BN, BK, TM, TN and the
// buffer `float a[]`, and include weights.glsl (b).

const uint BM_PAD = BM + 1;  // the padding column spreads strided stores over all banks
shared float tile_a[BK * BM_PAD];
shared float tile_b[BK * BN];
float acc[TM * TN];

// a(m, k) = a[a_base + m * a_sm + k * a_sk] for tile rows m < rows (from row0),
// b(k, n) = weight_at(b_origin, b_base + k * b_sk + n * b_sn) for tile columns n < cols (from
// col0).
void tile_gemm(uint row0, uint rows, uint col0, uint cols, uint K, uint a_base, uint a_sm,
               uint a_sk, uint b_origin, uint b_base, uint b_sk, uint b_sn) {
    const uint t = gl_LocalInvocationID.x;
    const uint tx = t % (BN / TN), ty = t / (BN / TN);
    for (uint r = 0; r < TM * TN; ++r) acc[r] = 0.0;
    const bool a_k_contiguous = a_sk == 1, b_k_contiguous = b_sk == 1;

    for (uint k0 = 0; k0 < K; k0 += BK) {
        // Consecutive invocations load consecutive addresses: along k when k is the
        // contiguous dimension, along m (n) otherwise.
        for (uint l = t; l < BM * BK; l += WG) {
            const uint mm = a_k_contiguous ? l / BK : l % BM;
            const uint kk = a_k_contiguous ? l % BK : l / BM;
            const uint gk = k0 + kk;
            tile_a[kk * BM_PAD + mm] =
                mm < rows && gk < K ? a[a_base + (row0 + mm) * a_sm + gk * a_sk] : 0.0;
        }
        for (uint l = t; l < BN * BK; l += WG) {
            const uint nn = b_k_contiguous ? l / BK : l % BN;
            const uint kk = b_k_contiguous ? l % BK : l / BN;
            const uint gk = k0 + kk;
            tile_b[kk * BN + nn] =
                nn < cols && gk < K ? weight_at(b_origin, b_base + gk * b_sk + (col0 + nn) * b_sn)
                                 : 0.0;
        }
        barrier();
        for (uint kk = 0; kk < BK; ++kk) {
            float ra[TM], rb[TN];
            for (uint i = 0; i < TM; ++i) ra[i] = tile_a[kk * BM_PAD + ty + i * (BM / TM)];
            for (uint j = 0; j < TN; ++j) rb[j] = tile_b[kk * BN + tx + j * (BN / TN)];
            for (uint i = 0; i < TM; ++i)
                for (uint j = 0; j < TN; ++j) acc[i * TN + j] += ra[i] * rb[j];
        }
        barrier();
    }
}

// Tile-local row and column of accumulator (i, j) of this invocation.
uint tile_row(uint i) { return gl_LocalInvocationID.x / (BN / TN) + i * (BM / TM); }
uint tile_col(uint j) { return gl_LocalInvocationID.x % (BN / TN) + j * (BN / TN); }

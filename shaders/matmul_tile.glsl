// The tiled GEMM core shared by matmul.comp, grouped_matmul.comp and the grouped backward's d_x
// and d_w: a workgroup computes a BM x BN tile of op(a) . op(b), staging BM x BK and BK x BN
// slices in shared memory (k-major: slice row kk holds the tile's BM, or BN, values at that k);
// each invocation accumulates a TM x TN register block. Tile sizes are specialization constants;
// the host sets WG = (BM/TM) * (BN/TN).
//
// Runs of four: where TM is a multiple of 4, an invocation's rows come in runs of 4 (rows 4ty ..
// 4ty+3, then the same 4*BM/TM further on, ...), each run staged and read as one vec4; otherwise
// its rows are ty, ty + BM/TM, ..., a float each. Columns likewise with TN. A 4x4 block then takes
// 2 shared-memory reads per k for its 16 products instead of 8 (neighbouring invocations reading
// neighbouring vec4s), so that arithmetic rather than shared memory bounds the loop on a GPU.
//
// The next slice's global reads are issued before the current slice's products and held in
// registers until its turn: a GPU running a workgroup or two per core (a small product) hides
// their latency behind the arithmetic instead of waiting at every slice.
//
// Include after declaring: the specialization constants WG, BM, BN, BK, TM, TN and the
// buffer `float a[]`, and include weights.glsl (b). tile_store() hands the tile's products to
// the includer's emit(i, j, r), as matmul_tile_coopmat.glsl's does (the ".cm" variants' core);
// an includer that reads acc itself need not define emit.

const uint VM = TM % 4 == 0 ? 4 : 1, VN = TN % 4 == 0 ? 4 : 1;  // run lengths
// The slices' row pitches in floats, padded so that invocations storing neighbouring k hit other
// banks (by 4 where runs are vec4s, which keeps them 16-byte aligned); vulkan_tuning.cpp counts
// these arrays against the device's shared memory.
const uint AP = VM == 4 ? BM + 4 : BM + 1, BP = VN == 4 ? BN + 4 : BN + 1;
shared vec4 tile_a4[VM == 4 ? BK * AP / 4 : 1];
shared float tile_a1[VM == 4 ? 1 : BK * AP];
shared vec4 tile_b4[VN == 4 ? BK * BP / 4 : 1];
shared float tile_b1[VN == 4 ? 1 : BK * BP];
float acc[TM * TN];

// A slice is staged in units of a run (VM rows, or VN columns, at one k); each invocation
// fetches UA and UB of them.
const uint A_UNITS = BM / VM * BK, B_UNITS = BN / VN * BK;
const uint UA = (A_UNITS + WG - 1) / WG, UB = (B_UNITS + WG - 1) / WG;
vec4 next_a[UA], next_b[UB];

// Unit u's run (counted in runs) and k within the slice: consecutive invocations take
// consecutive k where k is the operand's contiguous dimension, else consecutive runs.
uvec2 unit_place(uint u, bool k_contiguous, uint runs) {
    return k_contiguous ? uvec2(u / BK, u % BK) : uvec2(u % runs, u / runs);
}

// a(m, k) = a[a_base + m * a_sm + k * a_sk] for tile rows m < rows (from row0),
// b(k, n) = weight_at(b_origin, b_base + k * b_sk + n * b_sn) for tile columns n < cols (from
// col0).
void fetch_slice(uint k0, uint row0, uint rows, uint col0, uint cols, uint K, uint a_base,
                 uint a_sm, uint a_sk, uint b_origin, uint b_base, uint b_sk, uint b_sn) {
    const uint t = gl_LocalInvocationID.x;
    for (uint s = 0; s < UA; ++s) {
        const uint u = t + s * WG;
        const uvec2 p = unit_place(u, a_sk == 1, BM / VM);
        const uint gk = k0 + p.y;
        vec4 v = vec4(0.0);
        for (uint c = 0; c < VM; ++c) {
            const uint mm = p.x * VM + c;
            if (u < A_UNITS && mm < rows && gk < K)
                v[c] = a[a_base + (row0 + mm) * a_sm + gk * a_sk];
        }
        next_a[s] = v;
    }
    for (uint s = 0; s < UB; ++s) {
        const uint u = t + s * WG;
        const uvec2 p = unit_place(u, b_sk == 1, BN / VN);
        const uint gk = k0 + p.y;
        vec4 v = vec4(0.0);
        for (uint c = 0; c < VN; ++c) {
            const uint nn = p.x * VN + c;
            if (u < B_UNITS && nn < cols && gk < K)
                v[c] = weight_at(b_origin, b_base + gk * b_sk + (col0 + nn) * b_sn);
        }
        next_b[s] = v;
    }
}

void stage_slice(bool a_k_contiguous, bool b_k_contiguous) {
    const uint t = gl_LocalInvocationID.x;
    for (uint s = 0; s < UA; ++s) {
        const uint u = t + s * WG;
        if (u >= A_UNITS) break;
        const uvec2 p = unit_place(u, a_k_contiguous, BM / VM);
        if (VM == 4)
            tile_a4[p.y * (AP / 4) + p.x] = next_a[s];
        else
            tile_a1[p.y * AP + p.x] = next_a[s].x;
    }
    for (uint s = 0; s < UB; ++s) {
        const uint u = t + s * WG;
        if (u >= B_UNITS) break;
        const uvec2 p = unit_place(u, b_k_contiguous, BN / VN);
        if (VN == 4)
            tile_b4[p.y * (BP / 4) + p.x] = next_b[s];
        else
            tile_b1[p.y * BP + p.x] = next_b[s].x;
    }
}

void tile_gemm(uint row0, uint rows, uint col0, uint cols, uint K, uint a_base, uint a_sm,
               uint a_sk, uint b_origin, uint b_base, uint b_sk, uint b_sn) {
    const uint t = gl_LocalInvocationID.x;
    const uint tx = t % (BN / TN), ty = t / (BN / TN);
    for (uint r = 0; r < TM * TN; ++r) acc[r] = 0.0;

    fetch_slice(0, row0, rows, col0, cols, K, a_base, a_sm, a_sk, b_origin, b_base, b_sk, b_sn);
    for (uint k0 = 0; k0 < K; k0 += BK) {
        stage_slice(a_sk == 1, b_sk == 1);
        barrier();
        if (k0 + BK < K)
            fetch_slice(k0 + BK, row0, rows, col0, cols, K, a_base, a_sm, a_sk, b_origin, b_base,
                        b_sk, b_sn);
        for (uint kk = 0; kk < BK; ++kk) {
            float ra[TM], rb[TN];
            if (VM == 4) {
                for (uint r = 0; r < TM / 4; ++r) {
                    const vec4 v = tile_a4[kk * (AP / 4) + r * (BM / TM) + ty];
                    for (uint c = 0; c < 4; ++c) ra[r * 4 + c] = v[c];
                }
            } else {
                for (uint i = 0; i < TM; ++i) ra[i] = tile_a1[kk * AP + ty + i * (BM / TM)];
            }
            if (VN == 4) {
                for (uint r = 0; r < TN / 4; ++r) {
                    const vec4 v = tile_b4[kk * (BP / 4) + r * (BN / TN) + tx];
                    for (uint c = 0; c < 4; ++c) rb[r * 4 + c] = v[c];
                }
            } else {
                for (uint j = 0; j < TN; ++j) rb[j] = tile_b1[kk * BP + tx + j * (BN / TN)];
            }
            for (uint i = 0; i < TM; ++i)
                for (uint j = 0; j < TN; ++j) acc[i * TN + j] += ra[i] * rb[j];
        }
        barrier();
    }
}

// Tile-local row and column of accumulator (i, j) of this invocation (increasing in i and j).
uint tile_row(uint i) {
    const uint ty = gl_LocalInvocationID.x / (BN / TN);
    return VM == 4 ? (i / 4) * (4 * (BM / TM)) + 4 * ty + i % 4 : ty + i * (BM / TM);
}
uint tile_col(uint j) {
    const uint tx = gl_LocalInvocationID.x % (BN / TN);
    return VN == 4 ? (j / 4) * (4 * (BN / TN)) + 4 * tx + j % 4 : tx + j * (BN / TN);
}

void emit(uint i, uint j, float r);

// emit() for every product this invocation holds (tile row i, tile column j).
void tile_store() {
    for (uint i = 0; i < TM; ++i)
        for (uint j = 0; j < TN; ++j) emit(tile_row(i), tile_col(j), acc[i * TN + j]);
}

// Tile and window arithmetic of the CUDA attention kernels (backends/cuda/attention.cu), shared
// by the host and the device and free of CUDA so that g++ tests it without a GPU
// (tests/backends/cuda/attention_tiles_test.cpp: the loops built from these functions visit
// every visible (query, key) pair exactly once, for many sizes, windows and cache fills).
//
// Coordinates. Queries t are the chunk's tokens, 0 <= t < T. Keys are counted from the chunk's
// first position: key r >= 0 is the chunk's own token r; key r < 0 is the cached position
// start + r. `lo` is the first key that exists: 0 without a cache, -min(start, S) with a
// rolling cache of S slots (its positions are [max(0, start - S), start)). Query t sees key r
// when lo <= r <= t and t - r < window (window 0 = unlimited): the contract's
// i - window < j <= i in these coordinates.
//
// Rows. The query heads that read one kv head are served together: query t of head
// kvh * G + g is row t * G + g (G = H / Hkv), so one staged key tile serves all G heads.
//
// Sizes fit int: the host checks that 2 * (T + S) does, so no sum below overflows.
#pragma once

#include <cstdint>

#include "backends/cuda/host_device.h"

namespace tmx::cuda::attention_tiles {

// Half-open range [begin, end).
struct Range {
    int begin = 0, end = 0;
};

TMX_HOST_DEVICE inline int min_int(int a, int b) {
    return a < b ? a : b;
}
TMX_HOST_DEVICE inline int max_int(int a, int b) {
    return a > b ? a : b;
}

// A window the kernels treat as unlimited (0) when it covers every key a query can see: the
// T - 1 earlier tokens of the chunk and the S cached ones (S = 0 without a cache). Then it fits
// int.
inline int64_t effective_window(int64_t window, int64_t T, int64_t S) {
    return window >= T + S ? 0 : window;
}

// Whether query t sees key r (see the coordinates above).
TMX_HOST_DEVICE inline bool key_visible(int t, int r, int window, int lo) {
    return r >= lo && r <= t && (window == 0 || t - r < window);
}

// The first key query t sees.
TMX_HOST_DEVICE inline int first_visible_key(int t, int window, int lo) {
    return window > 0 ? max_int(lo, t - window + 1) : lo;
}

// The queries of rows [rows.begin, rows.end) (not empty).
TMX_HOST_DEVICE inline Range queries_of_rows(Range rows, int G) {
    return {rows.begin / G, (rows.end - 1) / G + 1};
}

// The rows of queries [queries.begin, queries.end).
TMX_HOST_DEVICE inline Range rows_of_queries(Range queries, int G) {
    return {queries.begin * G, queries.end * G};
}

// Every key that some query in [queries.begin, queries.end) (not empty) sees: from the first
// key of the earliest query to the latest query itself. Inside [lo, T).
TMX_HOST_DEVICE inline Range keys_of_queries(Range queries, int window, int lo) {
    return {first_visible_key(queries.begin, window, lo), queries.end};
}

// Every query of a chunk of T that sees some key in [keys.begin, keys.end) (not empty, keys of
// the chunk: keys.begin >= 0): from the first key itself to the last query whose window still
// reaches the last key.
TMX_HOST_DEVICE inline Range queries_of_keys(Range keys, int T, int window) {
    return {keys.begin, window > 0 ? min_int(T, keys.end - 1 + window) : T};
}

// Tiles of `tile` items covering n items.
TMX_HOST_DEVICE inline int tile_count(int n, int tile) {
    return (n + tile - 1) / tile;
}

// The tiles [begin, end) that slice s of n_slices processes out of n_tiles: consecutive runs of
// ceil(n_tiles / n_slices), the last ones possibly empty.
TMX_HOST_DEVICE inline Range slice_tiles(int n_tiles, int n_slices, int s) {
    const int per = tile_count(n_tiles, n_slices);
    return {min_int(n_tiles, s * per), min_int(n_tiles, (s + 1) * per)};
}

// The cache slot of key r < 0 (position start + r, lo <= r), given slot0 = start mod S: the
// position's residue mod S without 64-bit arithmetic (slot0 + r >= -S since r >= -S).
TMX_HOST_DEVICE inline int cache_slot(int slot0, int r, int S) {
    const int slot = slot0 + r;
    return slot < 0 ? slot + S : slot;
}

// The head-dim chunk a block stages at step `step` of its loop over the n chunks: every chunk
// once, its own chunk `mine` last, so that the tiles it accumulates from stay in shared memory
// after the loop.
TMX_HOST_DEVICE inline int chunk_at_step(int step, int mine, int n) {
    return (mine + 1 + step) % n;
}

}  // namespace tmx::cuda::attention_tiles

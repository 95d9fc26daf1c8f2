// The tile loops of the CUDA attention kernels (backends/cuda/attention.cu), replayed on the
// host with the same functions (backends/cuda/attention_tiles.h): every visible (query, head,
// key) must be visited exactly once and nothing else, and every key a loop stages must exist.
// "Visible" is written here independently, in absolute positions, as the CPU backend forms it
// (backends/cpu/attention.cpp): query at position p sees position j when
// max(0, start - S) <= j <= p and p - window < j (window 0 = unlimited).
//
// The kernels use 32-row and 32-key tiles; the loops are replayed for other tile sizes too, so
// that an error that 32 happens to hide still shows.
#include "backends/cuda/attention_tiles.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace tmx::cuda::attention_tiles {
namespace {

struct Problem {
    int T = 1;       // queries in the chunk
    int G = 1;       // query heads per kv head
    int window = 0;  // the contract's window (0 = unlimited)
    int S = 0;       // cache slots (0: plain attention, no cache)
    int start = 0;   // position of the chunk's first token (0 without a cache)

    int lo() const { return -std::min(start, S); }
    int n_keys() const { return T - lo(); }  // keys lo .. T-1
    int kernel_window() const { return static_cast<int>(effective_window(window, T, S)); }
    std::string str() const {
        return "T=" + std::to_string(T) + " G=" + std::to_string(G) +
               " window=" + std::to_string(window) + " S=" + std::to_string(S) +
               " start=" + std::to_string(start);
    }
};

// The CPU backend's rule, in absolute positions.
bool cpu_visible(const Problem& p, int t, int r) {
    const int pos = p.start + t, key = p.start + r;
    int first = std::max(0, p.start - p.S);
    if (p.window > 0) first = std::max(first, pos - p.window + 1);
    return first <= key && key <= pos;
}

// Visit counts per (row, key), row = t * G + g, key index r - lo.
class Visits {
  public:
    explicit Visits(const Problem& p)
        : p_(p), counts_(static_cast<size_t>(p.T) * p.G * p.n_keys(), 0) {}

    // The kernel stages key r; it must exist (or be past the chunk's end: zero-filled, and
    // then never visible).
    void staged(int r) {
        if (r < p_.lo()) ++bad_reads_;
    }
    void visit(int row, int r) {
        if (row < 0 || row >= p_.T * p_.G || r < p_.lo() || r >= p_.T) {
            ++bad_reads_;
            return;
        }
        ++counts_[static_cast<size_t>(row) * p_.n_keys() + (r - p_.lo())];
    }

    // Every visible pair once, every other pair never.
    void expect_exactly_once(const std::string& what) const {
        int wrong = 0;
        std::string first;
        for (int row = 0; row < p_.T * p_.G; ++row)
            for (int r = p_.lo(); r < p_.T; ++r) {
                const int want = cpu_visible(p_, row / p_.G, r) ? 1 : 0;
                const int got = counts_[static_cast<size_t>(row) * p_.n_keys() + (r - p_.lo())];
                if (got != want && wrong++ == 0)
                    first = "row " + std::to_string(row) + " key " + std::to_string(r) +
                            ": visited " + std::to_string(got) + " times, want " +
                            std::to_string(want);
            }
        EXPECT_EQ(wrong, 0) << what << ", " << p_.str() << ": " << first;
        EXPECT_EQ(bad_reads_, 0) << what << ", " << p_.str() << ": keys or rows out of range";
    }

  private:
    Problem p_;
    std::vector<int> counts_;
    int bad_reads_ = 0;
};

// The forward kernel's loops (and, with one slice, the backward's stats and dQ kernels): per
// tile of `R` rows, the keys its queries see, in tiles of `K` keys, split over `n_slices`
// blocks; each (row, key) of a tile counts when key_visible() says so.
Visits replay_query_tiles(const Problem& p, int R, int K, int n_slices) {
    Visits visits(p);
    const int n_rows = p.T * p.G, window = p.kernel_window(), lo = p.lo();
    for (int row0 = 0; row0 < n_rows; row0 += R) {
        const Range rows{row0, std::min(row0 + R, n_rows)};
        const Range keys = keys_of_queries(queries_of_rows(rows, p.G), window, lo);
        const int n_tiles = tile_count(keys.end - keys.begin, K);
        for (int s = 0; s < n_slices; ++s) {
            const Range tiles = slice_tiles(n_tiles, n_slices, s);
            for (int tile = tiles.begin; tile < tiles.end; ++tile) {
                const int k0 = keys.begin + tile * K;
                for (int r = k0; r < k0 + K; ++r) visits.staged(r);
                for (int row = rows.begin; row < rows.end; ++row)
                    for (int r = k0; r < k0 + K; ++r)
                        if (key_visible(row / p.G, r, window, lo)) visits.visit(row, r);
            }
        }
    }
    return visits;
}

// The dK/dV kernel's loops (no cache): per tile of `K` keys, the rows of the queries that see
// them, in tiles of `R` rows.
Visits replay_key_tiles(const Problem& p, int R, int K) {
    Visits visits(p);
    const int window = p.kernel_window();
    for (int k0 = 0; k0 < p.T; k0 += K) {
        const Range keys{k0, std::min(k0 + K, p.T)};
        const Range rows = rows_of_queries(queries_of_keys(keys, p.T, window), p.G);
        for (int row0 = rows.begin; row0 < rows.end; row0 += R)
            for (int row = row0; row < std::min(row0 + R, rows.end); ++row)
                for (int r = keys.begin; r < keys.end; ++r)
                    if (key_visible(row / p.G, r, window, 0)) visits.visit(row, r);
    }
    return visits;
}

struct TileShape {
    int R, K;
};
const TileShape kTileShapes[] = {{32, 32}, {1, 1}, {5, 3}, {8, 32}, {32, 7}};

std::vector<int> windows_for(int T, int S) {
    std::vector<int> w;
    for (int x : {0, 1, 2, 3, 5, 31, 32, 33, T - 1, T, T + 1, T + S, T + S + 1, 1000})
        if (x >= 0) w.push_back(x);
    return w;
}

TEST(AttentionTiles, QueryTilesVisitEveryVisiblePairOnce) {
    for (int T : {1, 2, 3, 5, 8, 17, 32, 33, 70})
        for (int G : {1, 3, 4})
            for (int window : windows_for(T, 0))
                for (TileShape ts : kTileShapes)
                    for (int n_slices : {1, 3, 8}) {
                        const Problem p{.T = T, .G = G, .window = window};
                        replay_query_tiles(p, ts.R, ts.K, n_slices)
                            .expect_exactly_once("query tiles R=" + std::to_string(ts.R) +
                                                 " K=" + std::to_string(ts.K) +
                                                 " slices=" + std::to_string(n_slices));
                    }
}

TEST(AttentionTiles, KeyTilesVisitEveryVisiblePairOnce) {
    for (int T : {1, 2, 3, 5, 8, 17, 32, 33, 70})
        for (int G : {1, 3, 4})
            for (int window : windows_for(T, 0))
                for (TileShape ts : kTileShapes) {
                    const Problem p{.T = T, .G = G, .window = window};
                    replay_key_tiles(p, ts.R, ts.K)
                        .expect_exactly_once("key tiles R=" + std::to_string(ts.R) +
                                             " K=" + std::to_string(ts.K));
                }
}

// The cached forward: chunks of T at every kind of cache fill (empty, partial, exactly full,
// wrapped), windows up to S + 1 (the most a cache of S slots serves) and unlimited.
TEST(AttentionTiles, CachedQueryTilesVisitEveryVisiblePairOnce) {
    for (int S : {1, 4, 7, 8, 16})
        for (int T : {1, 2, 3, 6, 9})
            for (int start : {0, 1, 3, S - 1, S, S + 1, 2 * S + 3, 50})
                for (int window = 0; window <= S + 1; ++window)
                    for (int G : {1, 2})
                        for (TileShape ts : kTileShapes)
                            for (int n_slices : {1, 2, 5}) {
                                const Problem p{
                                    .T = T, .G = G, .window = window, .S = S, .start = start};
                                replay_query_tiles(p, ts.R, ts.K, n_slices)
                                    .expect_exactly_once("cached, R=" + std::to_string(ts.R) +
                                                         " K=" + std::to_string(ts.K) +
                                                         " slices=" + std::to_string(n_slices));
                            }
}

// A row past the end of the data is given the query lo - 1: it must see no key at all.
TEST(AttentionTiles, QueryBeforeTheFirstKeySeesNothing) {
    for (int lo : {0, -1, -7})
        for (int window : {0, 1, 4})
            for (int r = lo; r < 40; ++r) EXPECT_FALSE(key_visible(lo - 1, r, window, lo));
}

TEST(AttentionTiles, EffectiveWindowKeepsVisibility) {
    for (int S : {0, 3, 8})
        for (int T : {1, 4, 9})
            for (int window = 0; window <= T + S + 3; ++window) {
                const int w = static_cast<int>(effective_window(window, T, S));
                EXPECT_TRUE(w == window || w == 0);
                for (int t = 0; t < T; ++t)
                    for (int r = -S; r < T; ++r)
                        EXPECT_EQ(key_visible(t, r, w, -S), key_visible(t, r, window, -S))
                            << "window " << window << " T " << T << " S " << S;
            }
}

TEST(AttentionTiles, CacheSlotIsThePositionModS) {
    for (int S : {1, 2, 5, 8})
        for (int start = 0; start < 30; ++start)
            for (int r = -std::min(start, S); r < 0; ++r)
                EXPECT_EQ(cache_slot(start % S, r, S), (start + r) % S)
                    << "S " << S << " start " << start << " r " << r;
}

TEST(AttentionTiles, SlicesSplitTheTilesInOrder) {
    for (int n_tiles = 0; n_tiles < 20; ++n_tiles)
        for (int n_slices = 1; n_slices < 9; ++n_slices) {
            int next = 0;
            for (int s = 0; s < n_slices; ++s) {
                const Range r = slice_tiles(n_tiles, n_slices, s);
                EXPECT_EQ(r.begin, next);
                EXPECT_LE(r.begin, r.end);
                next = r.end;
            }
            EXPECT_EQ(next, n_tiles);
        }
}

TEST(AttentionTiles, ChunkStepsVisitEveryChunkOnceEndingWithTheBlocksOwn) {
    for (int n = 1; n < 6; ++n)
        for (int mine = 0; mine < n; ++mine) {
            std::vector<int> seen(n, 0);
            for (int step = 0; step < n; ++step) ++seen[chunk_at_step(step, mine, n)];
            EXPECT_EQ(seen, std::vector<int>(n, 1));
            EXPECT_EQ(chunk_at_step(n - 1, mine, n), mine);
        }
}

}  // namespace
}  // namespace tmx::cuda::attention_tiles

// The MPI communicator as an MPI job runs it (tests/CMakeLists.txt runs it under mpirun).
//
//   tmx_dist_check collectives   every collective on the CPU backend, against sums each rank
//                                computes itself (every rank's data comes from a seed): the
//                                tensor sums bit for bit in rank order, also when started and
//                                overlapped; every result bit-identical on every rank (hash)
//   tmx_dist_check watchdog      rank 1 stops answering before a barrier: the others' watchdog
//                                must end the job (2 s timeout)
//
// Exits 0 when every check passed on every rank.
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "backends/registry.h"
#include "dist/mpi_communicator.h"

namespace tmx {
namespace {

// The small bucket makes the tensors below span several buckets, and parts that do not divide
// evenly among 2 or 3 ranks.
constexpr size_t kBucket = 1000;

uint64_t splitmix(uint64_t& state) {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Rank `rank`'s data for check `check`: any rank can compute any rank's. Magnitudes from 2^-8
// to 2^8, so that sums round, and differently in another order.
std::vector<float> data_of(int check, int rank, size_t n) {
    uint64_t state = static_cast<uint64_t>(check) * 1000003u + static_cast<uint64_t>(rank);
    std::vector<float> v(n);
    for (float& x : v) {
        const uint64_t bits = splitmix(state);
        const float unit = static_cast<float>(bits >> 40) / float(1 << 24) * 2 - 1;
        x = std::ldexp(unit, static_cast<int>(bits % 17) - 8);
    }
    return v;
}

uint32_t fnv1a(const void* data, size_t bytes) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < bytes; ++i)
        h = (h ^ static_cast<const unsigned char*>(data)[i]) * 16777619u;
    return h;
}

class Checker {
  public:
    Checker(MpiCommunicator& comm) : comm_(comm), backend_(make_backend("cpu")) {}

    int failures() const { return failures_; }

    // Every rank's result of `what` must be the same bits.
    void same_everywhere(const std::string& what, const void* data, size_t bytes) {
        const uint32_t mine = fnv1a(data, bytes);
        std::vector<uint32_t> all(static_cast<size_t>(comm_.size()));
        MPI_Allgather(&mine, 1, MPI_UINT32_T, all.data(), 1, MPI_UINT32_T, MPI_COMM_WORLD);
        for (uint32_t h : all)
            if (h != mine) return fail(what + ": the ranks' results differ in their bits");
    }

    // got[i] == the sum over the ranks of each rank's want[r][i], up to float rounding.
    void near_sum(const std::string& what, const std::vector<float>& got,
                  const std::vector<std::vector<float>>& parts) {
        for (size_t i = 0; i < got.size(); ++i) {
            double sum = 0, magnitude = 0;
            for (const auto& p : parts) sum += p[i], magnitude += std::fabs(p[i]);
            const double tolerance = 4.0 * parts.size() * 1.2e-7 * magnitude + 1e-30;
            if (std::fabs(got[i] - sum) > tolerance)
                return fail(what + ": element " + std::to_string(i) + " is " +
                            std::to_string(got[i]) + ", expected " + std::to_string(sum));
        }
    }

    // got == the float sum of parts in rank order (parts[0][i] + parts[1][i] + ...), bit for bit,
    // which the communicator promises whatever its bucketing; and near the exact sum.
    void rank_order_sum(const std::string& what, const std::vector<float>& got,
                        const std::vector<std::vector<float>>& parts) {
        near_sum(what, got, parts);
        for (size_t i = 0; i < got.size(); ++i) {
            float want = parts[0][i];
            for (size_t r = 1; r < parts.size(); ++r) want += parts[r][i];
            if (std::memcmp(&got[i], &want, sizeof want) != 0)
                return fail(what + ": element " + std::to_string(i) +
                            " is not the sum in rank order, bit for bit");
        }
    }

    // Sums of views inside one larger tensor, each with untouched elements around it: all of
    // them with the blocking all_reduce_sum, or all started one after the other (more buckets
    // than are in flight at once), progressed and finished.
    void all_reduce(int check, const std::vector<size_t>& sizes, bool started) {
        std::string what = started ? "started all_reduce_sums of" : "all_reduce_sum of";
        for (size_t n : sizes) what += " " + std::to_string(n);
        const size_t gap = 3;
        size_t total = gap;
        for (size_t n : sizes) total += n + gap;
        std::vector<float> host(total, 7.0f);
        std::vector<size_t> at;
        for (size_t i = 0, pos = gap; i < sizes.size(); pos += sizes[i] + gap, ++i) {
            const std::vector<float> mine =
                data_of(check + static_cast<int>(i), comm_.rank(), sizes[i]);
            std::copy(mine.begin(), mine.end(), host.begin() + pos);
            at.push_back(pos);
        }
        Tensor whole = backend_->alloc({static_cast<int64_t>(total)});
        backend_->upload(whole, host.data());
        for (size_t i = 0; i < sizes.size(); ++i) {
            const Tensor view =
                whole.slice(static_cast<int64_t>(at[i]), {static_cast<int64_t>(sizes[i])});
            if (!started) {
                comm_.all_reduce_sum(*backend_, view);
                continue;
            }
            comm_.start_all_reduce_sum(*backend_, view);
            comm_.progress_sums();
        }
        if (started) comm_.finish_sums();
        backend_->download(whole, host.data());
        for (size_t i = 0, pos = 0; i < sizes.size(); pos = at[i] + sizes[i], ++i) {
            for (size_t j = pos; j < at[i]; ++j)
                if (host[j] != 7.0f) return fail(what + ": wrote between the tensors");
            const std::vector<float> got(host.begin() + at[i], host.begin() + at[i] + sizes[i]);
            rank_order_sum(what, got, every_rank(check + static_cast<int>(i), sizes[i]));
        }
        for (size_t j = at.back() + sizes.back(); j < total; ++j)
            if (host[j] != 7.0f) return fail(what + ": wrote after the tensors");
        same_everywhere(what, host.data(), total * sizeof(float));
    }

    void reduce_scatter(int check, size_t shard_n) {
        const std::string what = "reduce_scatter_sum into " + std::to_string(shard_n);
        const size_t ranks = static_cast<size_t>(comm_.size()), n = shard_n * ranks;
        Tensor t = backend_->alloc({static_cast<int64_t>(n)});
        Tensor shard = backend_->alloc({static_cast<int64_t>(shard_n)});
        backend_->upload(t, data_of(check, comm_.rank(), n).data());
        comm_.reduce_scatter_sum(*backend_, t, shard);
        std::vector<float> got(shard_n);
        backend_->download(shard, got.data());
        std::vector<std::vector<float>> parts = every_rank(check, n);
        for (auto& p : parts)  // this rank's part of each rank's data
            p = std::vector<float>(p.begin() + comm_.rank() * shard_n,
                                   p.begin() + (comm_.rank() + 1) * shard_n);
        rank_order_sum(what, got, parts);
        // The shards differ by rank; their sums must agree as the all-reduce's would.
        std::vector<float> all(n);
        MPI_Allgather(got.data(), static_cast<int>(shard_n), MPI_FLOAT, all.data(),
                      static_cast<int>(shard_n), MPI_FLOAT, MPI_COMM_WORLD);
        same_everywhere(what, all.data(), n * sizeof(float));
    }

    void all_gather(int check, size_t shard_n) {
        const std::string what = "all_gather of " + std::to_string(shard_n);
        const size_t ranks = static_cast<size_t>(comm_.size()), n = shard_n * ranks;
        Tensor shard = backend_->alloc({static_cast<int64_t>(shard_n)});
        Tensor t = backend_->alloc({static_cast<int64_t>(n)});
        backend_->upload(shard, data_of(check, comm_.rank(), shard_n).data());
        comm_.all_gather(*backend_, shard, t);
        std::vector<float> got(n);
        backend_->download(t, got.data());
        for (size_t r = 0; r < ranks; ++r)
            if (std::memcmp(got.data() + r * shard_n,
                            data_of(check, static_cast<int>(r), shard_n).data(),
                            shard_n * sizeof(float)) != 0)
                return fail(what + ": part " + std::to_string(r) + " is not rank " +
                            std::to_string(r) + "'s shard");
    }

    void broadcast_tensor(int check, size_t n, int root) {
        const std::string what =
            "broadcast of " + std::to_string(n) + " from " + std::to_string(root);
        Tensor t = backend_->alloc({static_cast<int64_t>(n)});
        backend_->upload(t, data_of(check, comm_.rank(), n).data());
        comm_.broadcast(*backend_, t, root);
        std::vector<float> got(n);
        backend_->download(t, got.data());
        if (std::memcmp(got.data(), data_of(check, root, n).data(), n * sizeof(float)) != 0)
            fail(what + ": not the root's data");
    }

    void host_sum(int check) {
        std::vector<double> values(5);
        for (size_t i = 0; i < values.size(); ++i)
            values[i] = data_of(check, comm_.rank(), values.size())[i] * 1e3 + comm_.rank();
        comm_.all_reduce_sum(values);
        for (size_t i = 0; i < values.size(); ++i) {
            double want = 0;
            for (int r = 0; r < comm_.size(); ++r)
                want += data_of(check, r, values.size())[i] * 1e3 + r;
            if (std::fabs(values[i] - want) > 1e-9 * (std::fabs(want) + 1))
                fail("host all_reduce_sum: value " + std::to_string(i) + " is " +
                     std::to_string(values[i]) + ", expected " + std::to_string(want));
        }
        same_everywhere("host all_reduce_sum", values.data(), values.size() * sizeof(double));
    }

    void broadcast_string(size_t length, int root) {
        const std::string want(length, static_cast<char>('a' + root));
        // Each rank starts from another size, larger and smaller than the root's.
        std::string bytes = comm_.rank() == root ? want : std::string(comm_.rank() * 997, 'x');
        comm_.broadcast(bytes, root);
        if (bytes != want)
            fail("string broadcast of " + std::to_string(length) + " bytes from " +
                 std::to_string(root) + ": got " + std::to_string(bytes.size()) + " bytes");
    }

    void fail(const std::string& what) {
        ++failures_;
        std::fprintf(stderr, "tmx_dist_check: rank %d: %s\n", comm_.rank(), what.c_str());
    }

  private:
    std::vector<std::vector<float>> every_rank(int check, size_t n) const {
        std::vector<std::vector<float>> all;
        for (int r = 0; r < comm_.size(); ++r) all.push_back(data_of(check, r, n));
        return all;
    }

    MpiCommunicator& comm_;
    std::unique_ptr<Backend> backend_;
    int failures_ = 0;
};

int collectives() {
    MpiCommunicator comm({.collective_timeout_s = 60, .bucket_elements = kBucket});
    Checker check(comm);
    const int last = comm.size() - 1;
    int id = 0;  // seeds the checks' data; a multi-tensor check takes one per tensor
    // Sizes below, at and above one bucket, and not multiples of 2 or 3.
    for (size_t n : {size_t{1}, size_t{7}, kBucket - 1, kBucket, kBucket + 1, 2 * kBucket + 501})
        check.all_reduce(id += 8, {n}, /*started=*/false);
    // Started: one bucket, and more buckets than MpiCommunicator::kSumsInFlight over 3 tensors.
    check.all_reduce(id += 8, {7}, /*started=*/true);
    check.all_reduce(id += 8, {2 * kBucket + 501, 1, kBucket * 3 + 2}, /*started=*/true);
    check.all_reduce(id += 8, {kBucket - 1, 5, kBucket + 1}, /*started=*/false);
    for (size_t n : {size_t{1}, size_t{5}, kBucket / 2 + 1, 2 * kBucket + 1})
        check.reduce_scatter(++id, n);
    for (size_t n : {size_t{1}, size_t{5}, kBucket / 2 + 1, 2 * kBucket + 1})
        check.all_gather(++id, n);
    check.broadcast_tensor(++id, 2 * kBucket + 501, 0);
    check.broadcast_tensor(++id, 7, last);
    check.host_sum(++id);
    check.broadcast_string(0, last);
    check.broadcast_string(5, 0);
    check.broadcast_string(100'003, last);
    comm.barrier();

    int failures = check.failures(), total = 0;
    MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (comm.rank() == 0) {
        if (total == 0)
            std::printf("tmx_dist_check: %s: every collective agrees\n",
                        comm.description().c_str());
        else
            std::printf("tmx_dist_check: %d failed checks over %d ranks\n", total, comm.size());
    }
    return total == 0 ? 0 : 1;
}

int watchdog() {
    MpiCommunicator comm({.collective_timeout_s = 2, .bucket_elements = kBucket});
    comm.barrier();  // every rank is up
    if (comm.rank() == 1) std::this_thread::sleep_for(std::chrono::seconds(30));
    comm.barrier();  // the others wait here, past their 2 s
    if (comm.rank() == 0) std::printf("tmx_dist_check: the watchdog never fired\n");
    return 0;
}

}  // namespace
}  // namespace tmx

int main(int argc, char** argv) {
    const std::string mode = argc == 2 ? argv[1] : "";
    try {
        if (mode == "collectives") return tmx::collectives();
        if (mode == "watchdog") return tmx::watchdog();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "tmx_dist_check: %s\n", e.what());
        return 1;
    }
    std::fprintf(stderr, "usage: tmx_dist_check collectives|watchdog\n");
    return 2;
}

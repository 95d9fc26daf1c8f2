#include "engine/train/data_parallel.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "engine/core/errors.h"
#include "engine/model/adamw.h"

namespace tmx {

void check_ranks_share_the_batch(int64_t grad_accum, int64_t batch_size, int ranks) {
    if (grad_accum % ranks != 0)
        throw UsageError("the run's global batch is " + std::to_string(grad_accum) +
                         " micro-batches of " + std::to_string(batch_size) +
                         " sequences per step, which " + std::to_string(ranks) +
                         " ranks cannot share evenly: run it on a number of ranks that divides " +
                         std::to_string(grad_accum));
}

DataParallelOptimizer::DataParallelOptimizer(Model& model, Backend& backend, Communicator& comm,
                                             const DataParallel& dp, CollectiveClock& clock)
    : model_(model), backend_(backend), comm_(comm), clock_(clock) {
    const int64_t N = comm_.size(), P = model_.num_params();
    sharded_ = dp.shard_optimizer && N > 1;
    shard_ = sharded_ ? P / N : P;
    tail_ = sharded_ ? P - N * shard_ : 0;
    if (dp.bucket_bytes < 0) throw std::invalid_argument("DataParallel: bucket_bytes < 0");
    const int64_t bucket = dp.bucket_bytes / static_cast<int64_t>(sizeof(float));
    // Also on one rank: a one-rank NCCL communicator (TMX_FORCE_NCCL) runs the started sums;
    // the solo communicator's are no-ops.
    bucket_elements_ = !sharded_ && dp.bucket_bytes > 0 ? std::max<int64_t>(bucket, 1) : 0;
    adam_m_ = backend_.alloc({shard_ + tail_});
    adam_v_ = backend_.alloc({shard_ + tail_});
    backend_.fill(adam_m_, 0.0f);
    backend_.fill(adam_v_, 0.0f);
}

Model::GradsFinal DataParallelOptimizer::start_gradient_sums() {
    // [from, unsent) is final and not yet started; the pass reports lower offsets as it goes.
    return [this, unsent = model_.num_params()](int64_t from) mutable {
        const Tensor& grads = model_.grads();
        timed([&] {
            if (unsent - from >= bucket_elements_ || (from == 0 && unsent > 0)) {
                comm_.start_all_reduce_sum(backend_, grads.slice(from, {unsent - from}));
                unsent = from;
            }
            comm_.progress_sums();
        });
    };
}

double DataParallelOptimizer::reduce_gradients(bool started) {
    const Tensor& grads = model_.grads();
    const int64_t N = ranks(), P = model_.num_params();
    // The norm is summed from the parts the sharded optimizer owns (P / N elements each, then
    // the tail), each part's sum of squares on the device and their total in double in part
    // order: the same bits whether the optimizer is sharded or not, so clipping, and with it
    // the whole run, is the same either way. One process: one part.
    const int64_t part = P / N, tail = P - N * part;
    std::vector<double> parts(static_cast<size_t>(N + 1), 0.0);
    // Each part's sum of squares into its own element of sq, then one download for them all.
    Tensor sq = backend_.alloc({N + 1});
    backend_.fill(sq, 0.0f);
    const auto download_parts = [&] {
        std::vector<float> host(static_cast<size_t>(N + 1));
        backend_.download(sq, host.data());
        for (size_t i = 0; i < host.size(); ++i) parts[i] = static_cast<double>(host[i]);
    };
    if (!sharded_) {
        if (started)
            timed([&] { comm_.finish_sums(); });
        else
            timed([&] { comm_.all_reduce_sum(backend_, grads); });
        for (int64_t r = 0; r < N && part > 0; ++r)
            backend_.sum_squares(grads.slice(r * part, {part}), sq.slice(r, {1}));
        if (tail > 0) backend_.sum_squares(grads.slice(N * part, {tail}), sq.slice(N, {1}));
        download_parts();
    } else {
        const Tensor own = grads.slice(rank() * shard_, {shard_});
        timed([&] { comm_.reduce_scatter_sum(backend_, grads.slice(0, {N * shard_}), own); });
        backend_.sum_squares(own, sq.slice(rank(), {1}));
        if (tail_ > 0) {
            const Tensor tail_grads = grads.slice(N * shard_, {tail_});
            timed([&] { comm_.all_reduce_sum(backend_, tail_grads); });
            // Every rank has the tail: counted once.
            if (is_root()) backend_.sum_squares(tail_grads, sq.slice(N, {1}));
        }
        download_parts();
        // Each part has one contributor and zeros elsewhere: the sum over ranks is exact.
        timed([&] { comm_.all_reduce_sum(parts); });
    }
    double total = 0.0;
    for (double p : parts) total += p;
    return std::sqrt(total);
}

void DataParallelOptimizer::step(const Backend::AdamWParams& hp) {
    if (!sharded_) {
        adamw_step(model_, adam_m_, adam_v_, hp);
        return;
    }
    const int64_t N = ranks();
    adamw_step(model_, adam_m_.slice(0, {shard_}), adam_v_.slice(0, {shard_}), hp, rank() * shard_);
    if (tail_ > 0)
        adamw_step(model_, adam_m_.slice(shard_, {tail_}), adam_v_.slice(shard_, {tail_}), hp,
                   N * shard_);
    const Tensor& params = model_.params();
    timed([&] {
        comm_.all_gather(backend_, params.slice(rank() * shard_, {shard_}),
                         params.slice(0, {N * shard_}));
    });
}

void DataParallelOptimizer::moments_to_host(std::vector<float>& m, std::vector<float>& v) {
    const int64_t P = model_.num_params();
    m.clear();
    v.clear();
    if (!sharded_) {
        if (!is_root()) return;
        m.resize(static_cast<size_t>(P));
        v.resize(static_cast<size_t>(P));
        backend_.download(adam_m_, m.data());
        backend_.download(adam_v_, v.data());
        return;
    }
    const int64_t N = ranks();
    Tensor full = backend_.alloc({N * shard_});  // for the time of the gather only
    for (auto [moment, host] : {std::pair{&adam_m_, &m}, {&adam_v_, &v}}) {
        comm_.all_gather(backend_, moment->slice(0, {shard_}), full);
        if (!is_root()) continue;
        host->resize(static_cast<size_t>(P));
        backend_.download(full, host->data());
        if (tail_ > 0) backend_.download(moment->slice(shard_, {tail_}), host->data() + N * shard_);
    }
}

void DataParallelOptimizer::moments_from_host(const std::vector<float>& m,
                                              const std::vector<float>& v) {
    for (auto [moment, host] : {std::pair{&adam_m_, &m}, {&adam_v_, &v}}) {
        if (!sharded_) {
            backend_.upload(*moment, host->data());
            continue;
        }
        backend_.upload(moment->slice(0, {shard_}), host->data() + rank() * shard_);
        if (tail_ > 0)
            backend_.upload(moment->slice(shard_, {tail_}), host->data() + ranks() * shard_);
    }
}

}  // namespace tmx

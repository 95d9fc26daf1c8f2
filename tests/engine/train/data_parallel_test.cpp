// The data-parallel optimizer alone, on the CPU: its AdamW step against the update written out
// in double precision, and its ranks (threads of one process, through a communicator that sums
// in rank order as MPI's does) against one process holding the summed gradients, its moments
// replicated and sharded.
#include "engine/train/data_parallel.h"

#include <gtest/gtest.h>

#include <barrier>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <thread>

#include "backends/registry.h"
#include "tests/test_util.h"

namespace tmx {
namespace {

ModelConfig tiny_config() {
    return load_config(test::source_dir() + "/assets/configs/test-tiny.json");
}

// What the ranks of a job share: each deposits its part of a collective, waits for the others,
// reads all parts, and waits again before the next collective may overwrite them.
struct Rendezvous {
    explicit Rendezvous(int ranks) : ranks(ranks), sync(ranks), floats(ranks), doubles(ranks) {}
    const int ranks;
    std::barrier<> sync;
    std::vector<std::vector<float>> floats;
    std::vector<std::vector<double>> doubles;
};

// One rank of an in-process job: tensors through host memory, sums in rank order (the bits
// MPI's communicator gives), every rank's result the same.
class ThreadCommunicator final : public Communicator {
  public:
    ThreadCommunicator(Rendezvous& rv, int rank) : rv_(rv), rank_(rank) {}
    int rank() const override { return rank_; }
    int size() const override { return rv_.ranks; }
    std::string description() const override { return "threads"; }

    void all_reduce_sum(std::vector<double>& values) override {
        rv_.doubles[rank_] = values;
        rv_.sync.arrive_and_wait();
        for (size_t i = 0; i < values.size(); ++i) {
            values[i] = rv_.doubles[0][i];
            for (int r = 1; r < rv_.ranks; ++r) values[i] += rv_.doubles[r][i];
        }
        rv_.sync.arrive_and_wait();
    }
    void broadcast(std::string&, int) override { throw std::logic_error("not used"); }
    void barrier() override { rv_.sync.arrive_and_wait(); }
    void all_reduce_sum(Backend& be, const Tensor& t) override {
        const std::vector<float> sum = summed(be, t, 0, t.numel());
        be.upload(t, sum.data());
    }
    void reduce_scatter_sum(Backend& be, const Tensor& t, const Tensor& shard) override {
        check_collective_tensors("reduce_scatter_sum", t, &shard, rv_.ranks);
        const std::vector<float> sum = summed(be, t, rank_ * shard.numel(), shard.numel());
        be.upload(shard, sum.data());
    }
    void all_gather(Backend& be, const Tensor& shard, const Tensor& t) override {
        check_collective_tensors("all_gather", t, &shard, rv_.ranks);
        deposit(be, shard);
        std::vector<float> whole;
        for (int r = 0; r < rv_.ranks; ++r)
            whole.insert(whole.end(), rv_.floats[r].begin(), rv_.floats[r].end());
        rv_.sync.arrive_and_wait();
        be.upload(t, whole.data());
    }
    void broadcast(Backend&, const Tensor&, int) override { throw std::logic_error("not used"); }
    [[noreturn]] void abort(const std::string& message, int) override {
        std::fprintf(stderr, "%s\n", message.c_str());
        std::abort();
    }

  private:
    void deposit(Backend& be, const Tensor& t) {
        rv_.floats[rank_].resize(static_cast<size_t>(t.numel()));
        be.download(t, rv_.floats[rank_].data());
        rv_.sync.arrive_and_wait();
    }
    // Elements [from, from + n) of t summed over the ranks.
    std::vector<float> summed(Backend& be, const Tensor& t, int64_t from, int64_t n) {
        deposit(be, t);
        std::vector<float> sum(rv_.floats[0].begin() + from, rv_.floats[0].begin() + from + n);
        for (int r = 1; r < rv_.ranks; ++r)
            for (int64_t i = 0; i < n; ++i) sum[static_cast<size_t>(i)] += rv_.floats[r][from + i];
        rv_.sync.arrive_and_wait();
        return sum;
    }

    Rendezvous& rv_;
    const int rank_;
};

// Random weights, gradients and moments for a model of `P` parameters (v >= 0).
struct StepInputs {
    std::vector<float> params, m, v;
    std::vector<std::vector<float>> grads;  // per rank
};

StepInputs random_inputs(Rng& rng, size_t P, int ranks) {
    StepInputs in;
    in.params = test::random_normal(rng, P, 0.05);
    in.m = test::random_normal(rng, P, 0.01);
    in.v = test::random_normal(rng, P, 0.01);
    for (float& x : in.v) x *= x;
    for (int r = 0; r < ranks; ++r) in.grads.push_back(test::random_normal(rng, P, 0.1));
    return in;
}

const Backend::AdamWParams kStep{.lr = 3e-3f,
                                 .beta1 = 0.9f,
                                 .beta2 = 0.95f,
                                 .eps = 1e-8f,
                                 .weight_decay = 0.1f,
                                 .step = 4,
                                 .grad_scale = 0.8f};

// What one rank ends with after reduce_gradients and one step.
struct RankResult {
    double grad_norm = 0.0;
    std::vector<float> params, m, v;  // m and v: the full moments (rank 0 only)
    int64_t moment_bytes = 0;
};

RankResult run_rank(const ModelConfig& config, Communicator& comm, bool shard, const StepInputs& in,
                    const std::vector<float>& grads) {
    auto be = make_backend("cpu");
    Model model(config, *be);
    be->upload(model.params(), in.params.data());
    be->upload(model.grads(), grads.data());
    CollectiveClock clock;
    DataParallelOptimizer opt(model, *be, comm, {.shard_optimizer = shard, .bucket_bytes = 0},
                              clock);
    opt.moments_from_host(in.m, in.v);
    RankResult out;
    out.grad_norm = opt.reduce_gradients(/*started=*/false);
    opt.step(kStep);
    out.params = model.params_to_host();
    opt.moments_to_host(out.m, out.v);
    out.moment_bytes = opt.moment_bytes();
    return out;
}

// Every rank of an in-process job of `ranks` threads; rank r holds in.grads[r].
std::vector<RankResult> run_job(const ModelConfig& config, int ranks, bool shard,
                                const StepInputs& in) {
    Rendezvous rv(ranks);
    std::vector<RankResult> results(static_cast<size_t>(ranks));
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r)
        threads.emplace_back([&, r] {
            ThreadCommunicator comm(rv, r);
            results[r] = run_rank(config, comm, shard, in, in.grads[r]);
        });
    for (std::thread& t : threads) t.join();
    return results;
}

// One process, its moments "sharded" (which one rank does not do) or not: the norm of the
// gradients and the AdamW update of every element as written out in double precision, with
// decoupled weight decay on the tensors the layout marks.
TEST(DataParallelOptimizer, OneRanksStepIsTheAdamWUpdateOfEveryElement) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("TMX_TEST_SEED=" + std::to_string(seed));
    Rng rng(seed);
    const ModelConfig config = tiny_config();
    const ParamLayout layout = model_param_layout(config);
    const size_t P = static_cast<size_t>(layout.total);
    const StepInputs in = random_inputs(rng, P, 1);
    const std::vector<float>& g = in.grads[0];
    double sq = 0.0;
    for (float x : g) sq += static_cast<double>(x) * x;

    for (const bool shard : {false, true}) {
        SCOPED_TRACE(shard ? "--shard-optimizer" : "replicated");
        SoloCommunicator solo;
        const RankResult got = run_rank(config, solo, shard, in, g);
        EXPECT_NEAR(got.grad_norm, std::sqrt(sq), 1e-5 * std::sqrt(sq));
        EXPECT_EQ(got.moment_bytes, static_cast<int64_t>(2 * sizeof(float) * P));
        const double bc1 = 1.0 - std::pow(0.9, 4), bc2 = 1.0 - std::pow(0.95, 4);
        const double lr = kStep.lr, b1 = kStep.beta1, b2 = kStep.beta2;
        int64_t decayed = 0;
        for (const ParamSpec& s : layout.specs) {
            decayed += s.decay;
            const double wd = s.decay ? kStep.weight_decay : 0.0;
            for (int64_t i = s.offset; i < s.offset + s.numel(); ++i) {
                const double gi = static_cast<double>(g[i]) * kStep.grad_scale;
                const double m = b1 * in.m[i] + (1 - b1) * gi;
                const double v = b2 * in.v[i] + (1 - b2) * gi * gi;
                const double kept = in.params[i] * (1 - lr * wd);
                const double update = lr / bc1 * m / (std::sqrt(v / bc2) + kStep.eps);
                // fp32 arithmetic: a few roundings of each term.
                ASSERT_NEAR(got.params[i], kept - update,
                            1e-5 * (std::abs(kept) + std::abs(update)))
                    << s.name << " element " << i - s.offset;
                ASSERT_NEAR(got.m[i], m, 1e-6 * (std::abs(b1 * in.m[i]) + std::abs(gi)));
                ASSERT_NEAR(got.v[i], v, 1e-6 * (b2 * in.v[i] + gi * gi));
            }
        }
        EXPECT_GT(decayed, 0);
    }
}

// Three ranks (test-tiny's parameters do not divide by 3: a tail of 2 that every rank holds),
// each with gradients of its own: the same weights and moments as one process holding their
// sum (in rank order), bit for bit, on every rank, whether the moments are replicated or
// sharded; the sharded ranks hold a third of the moments, and compute the same gradient norm
// bit for bit.
TEST(DataParallelOptimizer, RanksReplicatedOrShardedStepAsOneProcessWithTheSummedGradients) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("TMX_TEST_SEED=" + std::to_string(seed));
    Rng rng(seed);
    const ModelConfig config = tiny_config();
    const int N = 3;
    const int64_t P = model_param_layout(config).total;
    ASSERT_NE(P % N, 0) << "the test wants a tail that does not divide";
    const StepInputs in = random_inputs(rng, static_cast<size_t>(P), N);
    std::vector<float> sum = in.grads[0];
    for (int r = 1; r < N; ++r)
        for (int64_t i = 0; i < P; ++i) sum[i] += in.grads[r][i];
    SoloCommunicator solo;
    const RankResult one = run_rank(config, solo, false, in, sum);

    const std::vector<RankResult> replicated = run_job(config, N, false, in);
    const std::vector<RankResult> sharded = run_job(config, N, true, in);
    for (const auto* job : {&replicated, &sharded}) {
        SCOPED_TRACE(job == &sharded ? "sharded" : "replicated");
        for (int r = 0; r < N; ++r) {
            SCOPED_TRACE("rank " + std::to_string(r));
            EXPECT_EQ((*job)[r].params, one.params);
            EXPECT_EQ((*job)[r].grad_norm, replicated[0].grad_norm);
            // The same sum in parts of another size: equal to rounding.
            EXPECT_NEAR((*job)[r].grad_norm, one.grad_norm, 1e-6 * one.grad_norm);
            EXPECT_EQ((*job)[r].m.empty(), r != 0) << "the full moments are rank 0's alone";
        }
        EXPECT_EQ((*job)[0].m, one.m);
        EXPECT_EQ((*job)[0].v, one.v);
    }
    EXPECT_EQ(replicated[0].moment_bytes, one.moment_bytes);
    EXPECT_EQ(sharded[0].moment_bytes, static_cast<int64_t>(2 * sizeof(float)) * (P / N + P % N));
}

TEST(DataParallelOptimizer, OverlapsTheBackwardPassOnlyWithReplicatedMomentsAndABucketSize) {
    const ModelConfig config = tiny_config();
    auto be = make_backend("cpu");
    Model model(config, *be);
    CollectiveClock clock;
    SoloCommunicator solo;
    const auto overlaps = [&](Communicator& comm, DataParallel dp) {
        return DataParallelOptimizer(model, *be, comm, dp, clock).overlaps_backward();
    };
    EXPECT_TRUE(overlaps(solo, {.bucket_bytes = 1}));
    EXPECT_FALSE(overlaps(solo, {.bucket_bytes = 0}));
    // One rank does not shard, so it still overlaps.
    EXPECT_TRUE(overlaps(solo, {.shard_optimizer = true, .bucket_bytes = 1 << 20}));
    Rendezvous rv(2);
    ThreadCommunicator two(rv, 0);  // no collective runs: one rank stands for the job
    EXPECT_FALSE(overlaps(two, {.shard_optimizer = true, .bucket_bytes = 1 << 20}));
    EXPECT_TRUE(overlaps(two, {.shard_optimizer = false, .bucket_bytes = 1 << 20}));
    EXPECT_THROW(overlaps(solo, {.bucket_bytes = -1}), std::invalid_argument);
}

}  // namespace
}  // namespace tmx

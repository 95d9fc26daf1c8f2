// Data-parallel tmx train under OpenMPI's mpirun, end to end through the built binary: N ranks
// against one process accumulating N times as many micro-batches, the sharded optimizer against
// the replicated one, resuming across rank counts, a killed rank and a stopped launcher.
// Skipped where mpirun is not installed (scripts/setup.sh installs OpenMPI) or tmx was built
// without MPI.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>

#include "engine/core/file_io.h"
#include "engine/core/rng.h"
#include "engine/data/dataset.h"
#include "engine/data/prepare.h"
#include "engine/model/safetensors.h"
#include "tests/test_util.h"

namespace tmx {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The tolerance of "the same run": one process sums the micro-batches' gradients in one order,
// N ranks sum their own and then add the ranks' sums, so float rounding differs in the last
// bits and AdamW carries that through 20 steps.
constexpr double kLossTolerance = 1e-4;    // relative, per logged step
constexpr double kWeightTolerance = 1e-4;  // absolute, per weight (weights are O(0.1))

void write_dataset(const std::string& dir) {
    Rng rng(23);
    DatasetWriter w(dir, 97);
    for (int doc = 0; doc < 80; ++doc) {
        std::vector<int32_t> t = {1};
        for (int i = 0; i < 40; ++i) t.push_back(3 + static_cast<int32_t>(rng.below(94)));
        w.add_document(doc % 8 == 7 ? Split::Val : Split::Train, t.data(), t.size());
    }
    w.commit({{"bos_id", 1}, {"eos_id", 2}});
}

struct Shell {
    int exit_code = 0;
    std::string log;
};

Shell shell(const std::string& cmd, const std::string& log_path) {
    const int status = std::system((cmd + " >" + log_path + " 2>&1 </dev/null").c_str());
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_file(log_path)};
}

std::string mpirun(int ranks) {
    // --oversubscribe: more ranks than this machine's 2 cores; root in CI containers.
    return "mpirun --allow-run-as-root --oversubscribe -np " + std::to_string(ranks) + " ";
}

// step -> loss, from a run's metrics.jsonl.
std::map<int64_t, double> losses(const std::string& run) {
    std::map<int64_t, double> out;
    std::istringstream in(read_file(run + "/metrics.jsonl"));
    for (std::string line; std::getline(in, line);) {
        const json j = json::parse(line);
        if (j.contains("loss") && j["loss"].is_number()) out[j["step"]] = j["loss"];
    }
    return out;
}

std::vector<float> tensors_of(const std::string& file) {
    SafetensorsFile f(file);
    std::vector<float> all;
    for (const auto& [name, entry] : f.entries()) {  // std::map: in name order
        std::vector<float> t(static_cast<size_t>(shape_numel(entry.shape)));
        f.read_f32(name, t.data());
        all.insert(all.end(), t.begin(), t.end());
    }
    return all;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    EXPECT_EQ(a.size(), b.size());
    EXPECT_FALSE(a.empty());
    double d = 0.0;
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
        d = std::max(d, std::fabs(static_cast<double>(a[i]) - b[i]));
    std::printf("  max |difference| over %zu values: %.3g\n", a.size(), d);
    return d;
}

class TrainDist : public ::testing::Test {
  protected:
    void SetUp() override {
        if (std::system("command -v mpirun >/dev/null 2>&1") != 0)
            GTEST_SKIP() << "mpirun is not installed (scripts/setup.sh installs OpenMPI)";
        write_dataset(tmp_ / "data");
        // A build without MPI refuses to run under mpirun: nothing of this suite can run.
        const Shell probe = shell(mpirun(2) + cmd("probe", "--max-steps 1"), tmp_ / "probe.log");
        if (probe.log.find("built without MPI") != std::string::npos)
            GTEST_SKIP() << "tmx was built without MPI";
        ASSERT_EQ(probe.exit_code, 0) << probe.log;
    }

    // `tmx train` of test-tiny into RUN; --threads 1 so that ranks do not fight for 2 cores.
    std::string cmd(const std::string& run, const std::string& flags, int eval_every = 10,
                    int log_every = 1) const {
        return std::string(TMX_BINARY) + " train --config " + test::source_dir() +
               "/assets/configs/test-tiny.json --data " + (tmp_ / "data") + " --out " +
               (tmp_ / run) + " --batch-size 2 --seq-len 16 --log-every " +
               std::to_string(log_every) + " --eval-every " + std::to_string(eval_every) +
               " --eval-batches 3 --warmup-steps 5 --lr 0.01 " + "--threads 1 " + flags;
    }

    // Runs a bash script (written to a file: no quoting through a shell command line).
    Shell script(const std::string& name, const std::string& text) const {
        test::write_text(tmp_ / (name + ".sh"), text);
        return shell("bash " + (tmp_ / (name + ".sh")), tmp_ / (name + ".log"));
    }

    std::string ckpt(const std::string& run, int step) const {
        const std::string n = std::to_string(step);
        return tmp_ / (run + "/step_" + std::string(8 - n.size(), '0') + n);
    }

    // A shell loop that waits (up to 30 s) until the run has a step checkpoint.
    std::string wait_for_checkpoint(const std::string& run) const {
        return "for i in $(seq 300); do ls " + (tmp_ / run) +
               " 2>/dev/null | grep -q '^step_[0-9]*$' && break; sleep 0.1; done\n";
    }

    // A long run of 2 ranks into RUN; once it has a checkpoint, rank 1 gets SIGNAL. The job's
    // output and how long it went on after the signal.
    struct Signalled : Shell {
        int seconds_after_signal = -1;
    };
    Signalled signal_rank1(const std::string& run, const std::string& flags, int log_every,
                           const std::string& signal) const {
        Signalled r;
        static_cast<Shell&>(r) = script(
            run, mpirun(2) + cmd(run, flags, 0, log_every) + " &\njob=$!\n" +
                     wait_for_checkpoint(run) + "for p in $(pgrep -f -- '--out " + (tmp_ / run) +
                     " '); do\n"
                     "  grep -qz '^OMPI_COMM_WORLD_RANK=1$' /proc/$p/environ && kill -" +
                     signal +
                     " $p\n"
                     "done\n"
                     "start=$(date +%s)\n"
                     "wait $job; rc=$?\n"
                     "echo \"ended after $(( $(date +%s) - start )) s\"\n"
                     "exit $rc\n");
        const size_t at = r.log.find("ended after ");
        if (at != std::string::npos) r.seconds_after_signal = std::stoi(r.log.substr(at + 12));
        return r;
    }

    // The step of the run's latest step checkpoint, or -1.
    int64_t latest_step(const std::string& run) const {
        int64_t last = -1;
        for (const auto& e : fs::directory_iterator(tmp_ / run)) {
            const std::string name = e.path().filename().string();
            if (name.rfind("step_", 0) == 0 && name.find(".tmp") == std::string::npos)
                last = std::max<int64_t>(last, std::stoll(name.substr(5)));
        }
        return last;
    }

    // The losses and final weights of two runs agree within the tolerances.
    // exact: the same bits, else within kLossTolerance and kWeightTolerance.
    void expect_same_run(const std::string& a, const std::string& b, int step,
                         bool exact = false) const {
        const auto la = losses(tmp_ / a), lb = losses(tmp_ / b);
        ASSERT_EQ(la.size(), lb.size());
        ASSERT_GE(la.size(), static_cast<size_t>(step));
        for (const auto& [s, loss] : la)
            EXPECT_NEAR(lb.at(s), loss, exact ? 0.0 : kLossTolerance * std::fabs(loss))
                << "step " << s;
        EXPECT_LE(max_abs_diff(tensors_of(ckpt(a, step) + "/model.safetensors"),
                               tensors_of(ckpt(b, step) + "/model.safetensors")),
                  exact ? 0.0 : kWeightTolerance);
    }

    test::TempDir tmp_;
};

TEST_F(TrainDist, RanksGiveTheRunOfOneProcessAccumulatingTheirMicroBatches) {
    for (int n : {2, 3}) {
        const std::string one = "one" + std::to_string(n), many = "ranks" + std::to_string(n);
        const std::string budget = " --max-steps 20 --seed 5";
        Shell r = shell(cmd(one, "--grad-accum " + std::to_string(n) + budget), tmp_ / "one.log");
        ASSERT_EQ(r.exit_code, 0) << r.log;
        r = shell(mpirun(n) + cmd(many, "--grad-accum 1" + budget), tmp_ / "many.log");
        ASSERT_EQ(r.exit_code, 0) << r.log;
        // One report per step, from rank 0 alone, and the global batch stated.
        EXPECT_NE(r.log.find("global batch " + std::to_string(2 * n) + " sequences"),
                  std::string::npos)
            << r.log;
        size_t lines = 0;
        for (size_t p = r.log.find("step 20/20"); p != std::string::npos;
             p = r.log.find("step 20/20", p + 1))
            ++lines;
        EXPECT_EQ(lines, 1u) << r.log;
        expect_same_run(one, many, 20);
        // The checkpoint says what the run is: all its micro-batches, whatever the rank count.
        const json state = json::parse(read_file(ckpt(many, 20) + "/trainer_state.json"));
        EXPECT_EQ(state["options"]["grad_accum"], n);
    }
    // A given rank count repeats itself bit for bit: the sums have a fixed order (rank order),
    // whether they run after the backward pass or during it, in buckets of any size.
    // ranks3 above: the default 16 MiB buckets, so one bucket at the end of test-tiny's pass.
    for (const auto& [run, bucket, says] :
         {std::tuple{"after3", "0", "gradients summed after the backward pass"},
          // 512 floats: a bucket or more for each of test-tiny's layers.
          {"buckets3", "0.001953125",
           "gradients summed during the backward pass in 0.00195312 MiB buckets"}}) {
        const Shell r = shell(mpirun(3) + cmd(run,
                                              "--grad-accum 1 --max-steps 20 --seed 5 "
                                              "--grad-bucket-mb " +
                                                  std::string(bucket)),
                              tmp_ / "again.log");
        ASSERT_EQ(r.exit_code, 0) << r.log;
        EXPECT_NE(r.log.find(says), std::string::npos) << r.log;
        expect_same_run("ranks3", run, 20, /*exact=*/true);
    }
}

TEST_F(TrainDist, TheShardedOptimizerTakesTheSameStepsWithAThirdOfTheMoments) {
    // test-tiny has 38,336 parameters: 3 ranks own 12,778 each and share a tail of 2.
    const std::string budget = "--grad-accum 1 --max-steps 20";
    Shell r = shell(mpirun(3) + cmd("replicated", budget), tmp_ / "replicated.log");
    ASSERT_EQ(r.exit_code, 0) << r.log;
    EXPECT_NE(r.log.find("AdamW moments 299.50 KiB per rank"), std::string::npos) << r.log;
    r = shell(mpirun(3) + cmd("sharded", budget + " --shard-optimizer"), tmp_ / "sharded.log");
    ASSERT_EQ(r.exit_code, 0) << r.log;
    EXPECT_NE(r.log.find("AdamW moments 99.84 KiB per rank (sharded)"), std::string::npos) << r.log;
    // The same steps bit for bit: the same gradient sums, the same norm (summed by the shards'
    // parts either way), so the same clipping, and AdamW element by element.
    expect_same_run("replicated", "sharded", 20, /*exact=*/true);
    // The checkpoint holds every rank's moments, gathered: the same file as replicated.
    EXPECT_EQ(max_abs_diff(tensors_of(ckpt("replicated", 20) + "/optimizer.safetensors"),
                           tensors_of(ckpt("sharded", 20) + "/optimizer.safetensors")),
              0.0);
}

TEST_F(TrainDist, ARunResumesOnAnotherNumberOfRanks) {
    const std::string flags = "--max-steps 20 --checkpoint-every 10 --keep-last 5";
    // The uninterrupted run: one process, two micro-batches per step.
    Shell r = shell(cmd("whole", flags + " --grad-accum 2"), tmp_ / "whole.log");
    ASSERT_EQ(r.exit_code, 0) << r.log;
    // 2 ranks -> 1: the first half on two ranks, then the rest in one process.
    r = shell(mpirun(2) + cmd("two", flags + " --grad-accum 1"), tmp_ / "two.log");
    ASSERT_EQ(r.exit_code, 0) << r.log;
    fs::create_directories(tmp_ / "two_then_one");
    fs::copy(ckpt("two", 10), ckpt("two_then_one", 10), fs::copy_options::recursive);
    r = shell(std::string(TMX_BINARY) + " train --threads 1 --resume " + ckpt("two_then_one", 10),
              tmp_ / "resume1.log");
    ASSERT_EQ(r.exit_code, 0) << r.log;
    EXPECT_LE(max_abs_diff(tensors_of(ckpt("whole", 20) + "/model.safetensors"),
                           tensors_of(ckpt("two_then_one", 20) + "/model.safetensors")),
              kWeightTolerance);
    // 1 -> 2 ranks, sharded: the one-process run's checkpoint goes on over two ranks.
    fs::create_directories(tmp_ / "one_then_two");
    fs::copy(ckpt("whole", 10), ckpt("one_then_two", 10), fs::copy_options::recursive);
    r = shell(mpirun(2) + TMX_BINARY + " train --threads 1 --shard-optimizer --resume " +
                  ckpt("one_then_two", 10),
              tmp_ / "resume2.log");
    ASSERT_EQ(r.exit_code, 0) << r.log;
    EXPECT_LE(max_abs_diff(tensors_of(ckpt("whole", 20) + "/model.safetensors"),
                           tensors_of(ckpt("one_then_two", 20) + "/model.safetensors")),
              kWeightTolerance);
    EXPECT_LE(max_abs_diff(tensors_of(ckpt("whole", 20) + "/optimizer.safetensors"),
                           tensors_of(ckpt("one_then_two", 20) + "/optimizer.safetensors")),
              kWeightTolerance);
    // 3 ranks cannot share two micro-batches per step: refused, naming the batch.
    r = shell(mpirun(3) + TMX_BINARY + " train --threads 1 --resume " + ckpt("whole", 20) +
                  " --max-steps 30",
              tmp_ / "resume3.log");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.log.find("3 ranks cannot share evenly"), std::string::npos) << r.log;
}

TEST_F(TrainDist, AKilledRankEndsTheJobAndTheLastCheckpointLoads) {
    // A long run; once its first checkpoint exists, rank 1 is killed with SIGKILL.
    const auto r = signal_rank1("killed", "--max-steps 1000000 --checkpoint-every 5", 1, "KILL");
    EXPECT_NE(r.exit_code, 0) << r.log;
    // OpenMPI's mpirun names the rank that died and ends the others at once.
    EXPECT_NE(r.log.find("rank 1"), std::string::npos) << r.log;
    EXPECT_GE(r.seconds_after_signal, 0) << r.log;  // the job ended
    EXPECT_LE(r.seconds_after_signal, 30) << r.log;
    // The last checkpoint is whole: the run resumes from it (in one process, one more step).
    const int64_t last = latest_step("killed");
    ASSERT_GE(last, 5);
    const Shell resumed =
        shell(std::string(TMX_BINARY) + " train --threads 1 --resume " + (tmp_ / "killed") +
                  " --grad-accum 2 --max-steps " + std::to_string(last + 1),
              tmp_ / "after.log");
    EXPECT_EQ(resumed.exit_code, 0) << resumed.log;
    EXPECT_TRUE(fs::exists(ckpt("killed", static_cast<int>(last + 1)))) << resumed.log;
}

TEST_F(TrainDist, AHungRankEndsTheJobAfterTheCollectiveTimeout) {
    // Rank 1 stopped (SIGSTOP) mid-run: rank 0 waits in its next collective, and after
    // --collective-timeout ends the job, saying why.
    const auto r = signal_rank1(
        "hung", "--max-steps 1000000 --checkpoint-every 5 --collective-timeout 3", 100, "STOP");
    EXPECT_NE(r.exit_code, 0) << r.log;
    EXPECT_NE(r.log.find("tmx: rank 0: no progress in"), std::string::npos) << r.log;
    EXPECT_GE(r.seconds_after_signal, 0) << r.log;  // the job ended
    EXPECT_LE(r.seconds_after_signal, 30) << r.log;
    EXPECT_GE(latest_step("hung"), 5);
}

TEST_F(TrainDist, SigtermToTheLauncherWritesOneCheckpointAndTheRunResumes) {
    // mpirun passes SIGTERM to the ranks, then kills them after odls_base_sigkill_timeout
    // seconds (1 by default): the README says to give the checkpoint longer.
    const Shell r = script("stopped",
                           "mpirun --mca odls_base_sigkill_timeout 5 --allow-run-as-root "
                           "--oversubscribe -np 2 " +
                               cmd("stopped", "--max-steps 1000000 --checkpoint-every 0", 0, 100) +
                               " &\njob=$!\nsleep 3\nkill -TERM $job\nwait $job\n");
    EXPECT_NE(r.exit_code, 0) << r.log;
    const int64_t last = latest_step("stopped");
    ASSERT_GE(last, 1) << r.log;
    EXPECT_NE(r.log.find("stopped by SIGTERM at step " + std::to_string(last)), std::string::npos)
        << r.log;
    const Shell resumed = shell(mpirun(2) + TMX_BINARY + " train --threads 1 --resume " +
                                    (tmp_ / "stopped") + " --max-steps " + std::to_string(last + 2),
                                tmp_ / "after.log");
    EXPECT_EQ(resumed.exit_code, 0) << resumed.log;
    EXPECT_TRUE(fs::exists(ckpt("stopped", static_cast<int>(last + 2)))) << resumed.log;
}

}  // namespace
}  // namespace tmx

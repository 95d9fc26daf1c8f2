// tmx train, eval --text-file/--data and plot end to end through the built binary.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "backends/registry.h"
#include "engine/core/file_io.h"
#include "engine/data/prepare.h"
#include "engine/model/checkpoint.h"
#include "tests/test_util.h"

namespace tmx {
namespace {

namespace fs = std::filesystem;

// A small dataset for test-tiny (vocab 97).
void write_dataset(const std::string& dir, int32_t vocab = 97) {
    Rng rng(11);
    DatasetWriter w(dir, static_cast<uint64_t>(vocab));
    for (int doc = 0; doc < 60; ++doc) {
        std::vector<int32_t> t = {1};
        for (int i = 0; i < 30; ++i) t.push_back(3 + static_cast<int32_t>(rng.below(vocab - 3)));
        w.add_document(doc % 6 == 5 ? Split::Val : Split::Train, t.data(), t.size());
    }
    w.commit({{"bos_id", 1}, {"eos_id", 2}});
}

std::string tiny() {
    return test::source_dir() + "/assets/configs/test-tiny.json";
}

TEST(TrainCli, SigintCheckpointsAndResumeFinishesTheRun) {
    test::TempDir tmp;
    write_dataset(tmp / "data");
    const std::string common =
        " --data " + (tmp / "data") + " --batch-size 2 --seq-len 16 --log-every 1";
    // A long budget, stopped by SIGINT after 2 s.
    auto r = test::run_tmx("train --config " + tiny() + " --out " + (tmp / "run") + common +
                           " --max-steps 1000000 --eval-every 0 --checkpoint-every 0 2>" +
                           (tmp / "log") + " & pid=$!; sleep 2; kill -INT $pid; wait $pid");
    const std::string log = read_file(tmp / "log");
    EXPECT_EQ(r.exit_code, 130) << log;
    EXPECT_NE(log.find("stopped by SIGINT"), std::string::npos) << log;
    EXPECT_NE(log.find("tmx train --resume"), std::string::npos) << log;
    bool has_step = false;
    for (const auto& e : fs::directory_iterator(tmp / "run"))
        has_step |= e.path().filename().string().rfind("step_", 0) == 0;
    ASSERT_TRUE(has_step) << "no checkpoint written on SIGINT";

    // Resume with a budget that ends soon; the math flags cannot change.
    r = test::run_tmx("train --resume " + (tmp / "run") + " --lr 0.5");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("--lr cannot change"), std::string::npos) << r.err;
    // Extending nothing: resume to a budget a few steps past the checkpoint.
    nlohmann::json st;
    for (const auto& e : fs::directory_iterator(tmp / "run"))
        if (e.path().filename().string().rfind("step_", 0) == 0)
            st = nlohmann::json::parse(read_file((e.path() / "trainer_state.json").string()));
    const int64_t at = st["step"].get<int64_t>();
    r = test::run_tmx("train --resume " + (tmp / "run") + " --max-steps " + std::to_string(at + 3));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("resuming"), std::string::npos) << r.err;
    EXPECT_TRUE(
        fs::exists(tmp / ("run/step_" + std::string(8 - std::to_string(at + 3).size(), '0') +
                          std::to_string(at + 3))));
    EXPECT_EQ(test::run_tmx("train --resume " + (tmp / "nowhere")).exit_code, 1);

    r = test::run_tmx("plot " + (tmp / "run"));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    const std::string svg = read_file(tmp / "run/metrics.svg");
    EXPECT_NE(svg.find("<svg"), std::string::npos);
    EXPECT_NE(svg.find("expert load"), std::string::npos);
    EXPECT_NE(svg.find("<polyline"), std::string::npos);
}

TEST(TrainCli, BadFlagsAndVocabularyMismatchAreClearErrors) {
    test::TempDir tmp;
    write_dataset(tmp / "data");
    write_dataset(tmp / "data300", 300);
    const std::string base = "train --config " + tiny() + " --out " + (tmp / "run");
    auto r = test::run_tmx(base + " --data " + (tmp / "data") + " --max-steps 5 --batch-size 0");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("--batch-size"), std::string::npos) << r.err;
    r = test::run_tmx(base + " --data " + (tmp / "data"));
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("--max-steps"), std::string::npos) << r.err;
    r = test::run_tmx(base + " --data " + (tmp / "data") + " --max-steps 5 --seq-len 999");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("--seq-len"), std::string::npos) << r.err;
    r = test::run_tmx(base + " --data " + (tmp / "data300") + " --max-steps 5");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("vocabulary of 300"), std::string::npos) << r.err;
    r = test::run_tmx("train --out " + (tmp / "run") + " --data " + (tmp / "data") +
                      " --max-steps 5");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("--config"), std::string::npos) << r.err;
    r = test::run_tmx("plot " + (tmp / "data"));
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("metrics.jsonl"), std::string::npos) << r.err;
}

// --precision: bf16 trains on the CPU too (emulated rounding) and the run keeps it on resume;
// a precision a backend lacks, or an unknown one, is a usage error naming the flag.
// tmx train on Vulkan as a user runs it: the backend line says f32 weights are read as they
// are (no fp16 copies in training), steps and checkpoints as on the CPU, a resume that
// continues on Vulkan, an eval of the result close to the CPU's, and the memory check against
// the device's heap naming the flags. Skips where no Vulkan device opens (it must on a GPU
// machine: TMX_REQUIRE_BACKENDS).
TEST(TrainCli, VulkanTrainsResumesAndRefusesWhatItsMemoryCannotHold) {
    try {
        make_backend("vulkan");
    } catch (const std::exception& e) {
        TMX_SKIP_UNAVAILABLE("vulkan", e.what());
    }
    test::TempDir tmp;
    write_dataset(tmp / "data");
    const std::string base = "train --backend vulkan --config " + tiny() + " --data " +
                             (tmp / "data") + " --seq-len 16 --log-every 1";
    auto r = test::run_tmx(base + " --out " + (tmp / "run") +
                           " --batch-size 2 --max-steps 4 --eval-every 2 --checkpoint-every 2");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("backend: vulkan: "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("f32 weights read as fp32"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("step 4/4"), std::string::npos) << r.err;
    EXPECT_TRUE(fs::exists(tmp / "run/step_00000004/model.safetensors"));
    r = test::run_tmx("train --backend vulkan --resume " + (tmp / "run") + " --max-steps 6");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("step 6/6"), std::string::npos) << r.err;
    // The trained model evaluates alike on both backends (fp32: to summation order).
    double loss[2];
    int i = 0;
    for (const char* backend : {"cpu", "vulkan"}) {
        r = test::run_tmx("eval --backend " + std::string(backend) + " --model " +
                          (tmp / "run/step_00000006") + " --data " + (tmp / "data") + " --json");
        ASSERT_EQ(r.exit_code, 0) << r.err;
        loss[i++] = nlohmann::json::parse(r.out)["loss"].get<double>();
    }
    EXPECT_NEAR(loss[1], loss[0], 1e-5 * loss[0]);
    // A batch no device holds: refused before anything is allocated, naming the flags.
    r = test::run_tmx(base + " --out " + (tmp / "big") + " --max-steps 1 --batch-size 4000000");
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find("more than the vulkan backend's"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("--batch-size"), std::string::npos) << r.err;
}

TEST(TrainCli, PrecisionFlagTrainsInBf16AndTheRunKeepsIt) {
    test::TempDir tmp;
    write_dataset(tmp / "data");
    // On the CPU throughout: auto would take CUDA (bf16 by default) where a GPU is.
    const std::string base = "train --backend cpu --config " + tiny() + " --data " +
                             (tmp / "data") + " --batch-size 2 --seq-len 16 --eval-every 0";
    auto r = test::run_tmx(base + " --out " + (tmp / "run") + " --max-steps 3 --precision bf16");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("(bf16 matmuls)"), std::string::npos) << r.err;
    r = test::run_tmx("train --backend cpu --resume " + (tmp / "run") + " --max-steps 5");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("(bf16 matmuls)"), std::string::npos) << r.err;
    // The backend line names the run's precision too, not the CPU's default (fp32).
    EXPECT_NE(r.err.find("backend: cpu, bf16 matmuls"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("fp32"), std::string::npos) << r.err;
    r = test::run_tmx("train --backend cpu --resume " + (tmp / "run") +
                      " --max-steps 7 --precision fp32");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("--precision cannot change"), std::string::npos) << r.err;
    // The default on the CPU is fp32.
    r = test::run_tmx(base + " --out " + (tmp / "run32") + " --max-steps 1");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("(fp32 matmuls)"), std::string::npos) << r.err;
    r = test::run_tmx(base + " --out " + (tmp / "bad") + " --max-steps 1 --precision fp16");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("--precision"), std::string::npos) << r.err;
    // Vulkan has no bf16 matmuls (where a Vulkan device exists; otherwise opening it fails).
    r = test::run_tmx("generate --backend vulkan --precision bf16 --model " + test::source_dir() +
                      "/assets/demo --prompt x --max-new-tokens 1");
    EXPECT_NE(r.exit_code, 0);
    if (r.err.find("unavailable") == std::string::npos &&
        r.err.find("not compiled") == std::string::npos &&
        r.err.find("no Vulkan") == std::string::npos) {
        EXPECT_EQ(r.exit_code, 2) << r.err;
        EXPECT_NE(r.err.find("--precision bf16"), std::string::npos) << r.err;
    }
}

// The trainer_state.json of a run's latest step checkpoint (step_N names sort by N: they are
// zero-padded).
std::string latest_state(const std::string& run) {
    std::string latest;
    for (const auto& e : fs::directory_iterator(run)) {
        const std::string name = e.path().filename().string();
        if (name.rfind("step_", 0) == 0 && name > latest) latest = name;
    }
    return run + "/" + latest + "/trainer_state.json";
}

std::string recorded_backend_of(const std::string& run) {
    return nlohmann::json::parse(read_file(latest_state(run)))["options"].value("backend", "");
}

// A resumed run trains on the backend it was trained on, which its checkpoints record, unless
// --backend says otherwise; the backend line says which. A run from before the backend was
// recorded resumes where --backend auto says, and says so; a recorded backend that does not open
// here is a usage error naming it and the way out.
TEST(TrainCli, AResumeKeepsTheRunsBackendUnlessAFlagSaysOtherwise) {
    test::TempDir tmp;
    write_dataset(tmp / "data");
    const std::string run = tmp / "run";
    auto r = test::run_tmx("train --backend cpu --config " + tiny() + " --data " + (tmp / "data") +
                           " --batch-size 2 --seq-len 16 --eval-every 0 --threads 1 --out " + run +
                           " --max-steps 2");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(recorded_backend_of(run), "cpu");
    const std::string resume = "train --threads 1 --resume " + run;
    r = test::run_tmx(resume + " --max-steps 3");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("backend (from run): cpu, fp32 matmuls\n"), std::string::npos) << r.err;
    // The flag naming the run's own backend: the plain line.
    r = test::run_tmx(resume + " --max-steps 4 --backend cpu");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("backend: cpu, fp32 matmuls\n"), std::string::npos) << r.err;

    // A run from before the backend was recorded.
    nlohmann::json state = nlohmann::json::parse(read_file(latest_state(run)));
    state["options"].erase("backend");
    test::write_text(latest_state(run), state.dump());
    r = test::run_tmx(resume + " --max-steps 5");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::string said = "backend (auto: the run has not recorded its backend): ";
    const size_t at = r.err.find(said);
    ASSERT_NE(at, std::string::npos) << r.err;
    // Its checkpoints record the backend it went on with (cpu here; CUDA on a GPU machine).
    const std::string backend = recorded_backend_of(run);
    EXPECT_FALSE(backend.empty());
    EXPECT_EQ(r.err.substr(at + said.size(), backend.size()), backend) << r.err;

    state = nlohmann::json::parse(read_file(latest_state(run)));
    state["options"]["backend"] = "abacus";
    test::write_text(latest_state(run), state.dump());
    r = test::run_tmx(resume + " --max-steps 6");
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find("unknown backend 'abacus'"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("(the run trained on abacus; --backend resumes it on another)"),
              std::string::npos)
        << r.err;
    EXPECT_EQ(test::run_tmx(resume + " --max-steps 6 --backend cpu").exit_code, 0);
    EXPECT_EQ(recorded_backend_of(run), "cpu");
}

// A run trained on Vulkan and resumed without --backend goes on on Vulkan: its steps are those of
// the uninterrupted Vulkan run, bit for bit (before, a resume chose the backend afresh and went
// on on the CPU). With --backend cpu it goes on on the CPU, as the backend line says and its
// checkpoints record. The learning rate is constant (warmup 0, --min-lr = --lr), so a run of 3
// steps continued to 6 takes the steps of a run of 6.
TEST(TrainCli, AVulkanRunResumedWithoutBackendGoesOnOnVulkanBitForBit) {
    try {
        make_backend("vulkan");
    } catch (const std::exception& e) {
        TMX_SKIP_UNAVAILABLE("vulkan", e.what());
    }
    test::TempDir tmp;
    write_dataset(tmp / "data");
    const std::string train = "train --backend vulkan --config " + tiny() + " --data " +
                              (tmp / "data") +
                              " --batch-size 2 --seq-len 16 --grad-accum 2 --log-every 1 "
                              "--eval-every 0 --lr 0.003 --min-lr 0.003 --warmup-steps 0 --out ";
    auto r = test::run_tmx(train + (tmp / "whole") + " --max-steps 6");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    r = test::run_tmx(train + (tmp / "parts") + " --max-steps 3");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(recorded_backend_of(tmp / "parts"), "vulkan");
    r = test::run_tmx("train --resume " + (tmp / "parts") + " --max-steps 6");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("backend (from run): vulkan: "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("step 6/6"), std::string::npos) << r.err;
    for (const char* file : {"model.safetensors", "optimizer.safetensors"})
        EXPECT_EQ(read_file(tmp / ("parts/step_00000006/" + std::string(file))),
                  read_file(tmp / ("whole/step_00000006/" + std::string(file))))
            << file << " differs from the uninterrupted Vulkan run's";
    EXPECT_EQ(recorded_backend_of(tmp / "parts"), "vulkan");

    r = test::run_tmx("train --backend cpu --resume " + (tmp / "parts") + " --max-steps 7");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("backend (overriding the run's vulkan): cpu, fp32 matmuls\n"),
              std::string::npos)
        << r.err;
    EXPECT_EQ(recorded_backend_of(tmp / "parts"), "cpu");
}

// Runs `train_args` in the background and, once its log says training has begun, sends
// `signals` (kill arguments, in order; "pause" waits 0.6 s, longer than tmx's 0.5 s window
// for a repeated signal). Before each signal the shell appends "test: sending SIG" to the log,
// which the run writes in append mode too, so the log orders the run's lines against the
// signals. The run then has 5 s to end before SIGKILL (exit code 137). Waiting for the log,
// not a fixed time, keeps a slow start from eating into the micro-batch the signals must hit.
test::CommandResult signal_training(const std::string& train_args, const std::string& signals,
                                    const std::string& log) {
    std::string send;
    for (size_t at = 0, next; at < signals.size(); at = next + 1) {
        next = signals.find(' ', at);
        if (next == std::string::npos) next = signals.size();
        const std::string token = signals.substr(at, next - at);
        send += token == "pause" ? "sleep 0.6; "
                                 : "echo 'test: sending SIG" + token + "' >>" + log + "; kill -" +
                                       token + " $pid; ";
    }
    return test::run_tmx(train_args + " 2>>" + log + " & pid=$!; " +
                         "for i in $(seq 400); do grep -q '^training ' " + log +
                         " 2>/dev/null && break; sleep 0.05; done; sleep 0.2; " + send +
                         "for i in $(seq 100); do kill -0 $pid 2>/dev/null || break; sleep 0.05; "
                         "done; kill -KILL $pid 2>/dev/null; wait $pid");
}

TEST(TrainCli, ASignalStopsALongStepWithinAMicroBatchAndASecondExitsAtOnce) {
    test::TempDir tmp;
    write_dataset(tmp / "data");
    // One optimizer step of 10^8 micro-batches: hours, were it not interrupted.
    const std::string train = "train --config " + tiny() + " --data " + (tmp / "data") +
                              " --batch-size 2 --seq-len 16 --max-steps 1 --grad-accum 100000000" +
                              " --threads 1 --out ";
    auto r = signal_training(train + (tmp / "run1"), "INT", tmp / "log1");
    std::string log = read_file(tmp / "log1");
    EXPECT_EQ(r.exit_code, 130) << "(137: it did not stop within 5 s of SIGINT)\n" << log;
    EXPECT_NE(log.find("stopped by SIGINT before the first step"), std::string::npos) << log;

    // Two signals a while apart: the first asks for a checkpoint, the second exits at once,
    // without one. (Two different ones, since a signal sent twice before delivery arrives once.)
    // One micro-batch of 16384 sequences (5 s on a 2-core CI machine, 1.8 GB), so the run is
    // still inside it when the second signal comes 0.8 s after training begins.
    const std::string slow = "train --config " + tiny() + " --data " + (tmp / "data") +
                             " --batch-size 16384 --seq-len 16 --max-steps 1 --threads 1 --out ";
    r = signal_training(slow + (tmp / "run2"), "TERM pause INT", tmp / "log2");
    log = read_file(tmp / "log2");
    // Had the micro-batch ended before the second signal was sent, this test would prove
    // nothing: say so rather than blame the signal handling.
    const size_t second_sent = log.find("test: sending SIGINT");
    for (const char* end_of_step : {"step 1/", "stopped by", "done:"})
        ASSERT_GT(log.find(end_of_step), second_sent)
            << "the micro-batch ended before the second signal was sent; make it longer\n"
            << log;
    EXPECT_EQ(r.exit_code, 130) << "(137: it did not exit on the second signal)\n" << log;
    EXPECT_NE(log.find("second signal: exiting without a checkpoint"), std::string::npos) << log;
    EXPECT_EQ(log.find("stopped by"), std::string::npos) << log;

    // Two signals at once, as `timeout` sends them (to the command, then to its process
    // group): one request, so the run stops as after one signal. (The kernel delivers SIGINT
    // first when both are pending, so the stop is either's.)
    r = signal_training(train + (tmp / "run3"), "TERM INT", tmp / "log3");
    log = read_file(tmp / "log3");
    EXPECT_TRUE(r.exit_code == 130 || r.exit_code == 143)
        << "exit code " << r.exit_code << " (137: it did not stop)\n"
        << log;
    EXPECT_EQ(log.find("second signal"), std::string::npos) << log;
    EXPECT_NE(log.find("before the first step"), std::string::npos) << log;
}

TEST(TrainCli, NonFiniteFlagsAreUsageErrorsAndADivergingRunStopsWithoutNaNCheckpoints) {
    test::TempDir tmp;
    write_dataset(tmp / "data");
    const std::string base = "train --config " + tiny() + " --data " + (tmp / "data") +
                             " --batch-size 2 --seq-len 16 --threads 1 --out " + (tmp / "run");
    for (const std::string flag : {"--lr inf", "--min-lr nan", "--grad-clip nan", "--eps inf",
                                   "--weight-decay nan", "--beta2 -inf", "--lr 1e999"}) {
        auto r = test::run_tmx(base + " --max-steps 3 " + flag);
        EXPECT_EQ(r.exit_code, 2) << flag << ": " << r.err;
        EXPECT_NE(
            r.err.find("tmx: " + flag.substr(0, flag.find(' ')) + ": must be a finite number"),
            std::string::npos)
            << r.err;
    }
    EXPECT_FALSE(fs::exists(tmp / "run"));

    // 1e30 is finite; the weights it makes give NaN. Evaluating and checkpointing every step
    // gives the NaN every chance to reach best/ and step_*/.
    auto r = test::run_tmx(base + " --max-steps 5 --lr 1e30 --min-lr 1e30 --warmup-steps 0" +
                           " --eval-every 1 --checkpoint-every 1 --log-every 1");
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find("tmx: error: step 1: the validation loss is NaN"), std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find("no checkpoint was written"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(tmp / "run/best"));
    EXPECT_FALSE(fs::exists(tmp / "run/step_00000001"));
    // The NaN is logged as JSON tmx plot reads; it marks the step.
    r = test::run_tmx("plot " + (tmp / "run"));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(read_file(tmp / "run/metrics.svg").find("non-finite (1)"), std::string::npos);
}

TEST(TrainCli, ASecondTrainOfARunningRunIsRefusedNamingTheHolder) {
    test::TempDir tmp;
    write_dataset(tmp / "data");
    const std::string run = tmp / "run";
    ASSERT_EQ(test::run_tmx("train --config " + tiny() + " --data " + (tmp / "data") +
                            " --batch-size 2 --seq-len 16 --max-steps 1 --threads 1 --out " + run)
                  .exit_code,
              0);
    // The holder resumes with a long budget; once it says so, a second resume is refused.
    auto r = test::run_tmx("train --resume " + run + " --max-steps 100000000 --threads 1 2>" +
                           (tmp / "log") + " & pid=$!; for i in $(seq 200); do grep -q resuming " +
                           (tmp / "log") + " && break; sleep 0.05; done; " + TMX_BINARY +
                           " train --resume " + run + " 2>" + (tmp / "err") +
                           "; echo \"$? $pid $(hostname)\" >" + (tmp / "said") +
                           "; kill -INT $pid; wait $pid");
    EXPECT_EQ(r.exit_code, 130) << read_file(tmp / "log");
    std::istringstream said(read_file(tmp / "said"));
    int second_exit = 0;
    std::string pid, host;
    said >> second_exit >> pid >> host;
    const std::string err = read_file(tmp / "err");
    EXPECT_EQ(second_exit, 1) << err;
    EXPECT_NE(err.find("tmx: error: " + run + ": the run is in use by another tmx train (pid " +
                       pid + " on host " + host + ")"),
              std::string::npos)
        << err;
}

TEST(TrainCli, FileSystemAndFileContentErrorsNameThePathAndField) {
    test::TempDir tmp;
    write_dataset(tmp / "data");
    const std::string base = "train --config " + tiny() + " --data " + (tmp / "data") +
                             " --batch-size 2 --seq-len 16 --max-steps 1 --threads 1";
    // --out below a file: the file system refuses (as it would a directory without permission).
    test::write_text(tmp / "file", "");
    auto r = test::run_tmx(base + " --out " + (tmp / "file/run"));
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("tmx: error: --out " + (tmp / "file/run") +
                         ": cannot create the run directory: Not a directory"),
              std::string::npos)
        << r.err;

    ASSERT_EQ(test::run_tmx(base + " --out " + (tmp / "run")).exit_code, 0);
    const std::string state = tmp / "run/step_00000001/trainer_state.json";
    nlohmann::json j = nlohmann::json::parse(read_file(state));
    j.erase("step");
    test::write_text(state, j.dump());
    r = test::run_tmx("train --resume " + (tmp / "run"));
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("tmx: error: " + state + ": field 'step': missing"), std::string::npos)
        << r.err;

    test::write_text(tmp / "run/metrics.jsonl",
                     "{\"step\": 1, \"loss\": 2.5}\n{\"step\": 2, \"loss\": [1]}\n");
    r = test::run_tmx("plot " + (tmp / "run"));
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("tmx: error: " + (tmp / "run/metrics.jsonl") +
                         ":2: field 'loss': expected a number"),
              std::string::npos)
        << r.err;
}

TEST(EvalCli, TextFileReportsBitsPerByteAndDataScoresASplit) {
    const std::string shared = test::shared_dir();
    if (shared.empty()) GTEST_SKIP() << "needs ../shared/data (the development data)";
    test::TempDir tmp;
    // A tiny model with the 32k tokenizer is too big; train a 512-piece tokenizer instead.
    const std::string text = shared + "/data/tinystories/valid.txt";
    auto r = test::run_tmx("tokenizer train --input " + text + " --vocab-size 512 --out " +
                           (tmp / "tok.model"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    test::write_text(tmp / "cfg.json",
                     R"({"vocab_size": 512, "d_model": 32, "n_layers": 1, "n_heads": 2,
        "n_kv_heads": 1, "head_dim": 16, "d_ff": 32, "n_experts": 2, "top_k": 1, "max_seq_len": 64,
        "sliding_window": 16})");
    ASSERT_EQ(test::run_tmx("init --config " + (tmp / "cfg.json") + " --out " + (tmp / "m") +
                            " --tokenizer " + (tmp / "tok.model"))
                  .exit_code,
              0);
    r = test::run_tmx("eval --model " + (tmp / "m") + " --text-file " + text + " --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["bytes"].get<int64_t>() > 70000, true);
    // An untrained model is near uniform over 512 pieces: bits/byte = loss / ln 2 * tokens / bytes.
    EXPECT_NEAR(j["loss"].get<double>(), std::log(512.0), 0.2);
    EXPECT_NEAR(j["bits_per_byte"].get<double>(),
                j["loss"].get<double>() / std::log(2.0) * j["tokens"].get<double>() /
                    j["bytes"].get<double>(),
                1e-9);

    ASSERT_EQ(test::run_tmx("prepare --input " + text + " --tokenizer " + (tmp / "tok.model") +
                            " --out " + (tmp / "data") + " --val-fraction 0.1 --quiet")
                  .exit_code,
              0);
    r = test::run_tmx("eval --model " + (tmp / "m") + " --data " + (tmp / "data") + " --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_GT(nlohmann::json::parse(r.out)["tokens"].get<int64_t>(), 100);

    // A model without a tokenizer cannot score text.
    ASSERT_EQ(
        test::run_tmx("init --config " + (tmp / "cfg.json") + " --out " + (tmp / "bare")).exit_code,
        0);
    r = test::run_tmx("eval --model " + (tmp / "bare") + " --text-file " + text);
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("tokenizer"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace tmx

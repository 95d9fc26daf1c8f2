// tmx train: train a model on a token dataset, resumable.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>
#include <thread>

#include "apps/commands.h"
#include "apps/option_flags.h"
#include "dist/open_communicator.h"
#include "engine/core/errors.h"
#include "engine/core/format.h"
#include "engine/core/threads.h"
#include "engine/dist/communicator.h"
#include "engine/train/trainer.h"

namespace tmx::cli {
namespace {

std::atomic<bool> g_stop{false};
std::atomic<int> g_signal{0};

// Writes a constant message from a signal handler (write(2) is async-signal-safe; stdio is not).
template <size_t N>
void write_from_handler(const char (&message)[N]) {
    (void)!::write(STDERR_FILENO, message, N - 1);
}

// Monotonic seconds; clock_gettime is async-signal-safe.
double monotonic_seconds() {
    timespec t{};
    ::clock_gettime(CLOCK_MONOTONIC, &t);
    return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// A repeat within this long of the first signal is the same request delivered twice: wrappers
// such as `timeout` signal the command and then its process group, and losing the checkpoint
// to that would lose the run.
constexpr double kRepeatedSignalSeconds = 0.5;
std::atomic<double> g_first_signal_at{0.0};
static_assert(std::atomic<double>::is_always_lock_free, "read and written by a signal handler");

// The first SIGINT/SIGTERM asks the trainer to stop (it checks before every micro-batch) and
// write its checkpoint; a second one, half a second or more later, exits at once, writing
// nothing: a checkpoint write it cuts short leaves a temporary directory that the next run
// removes.
// (Both signals are blocked while it runs, so two handlers never interleave.)
extern "C" void on_stop_signal(int sig) {
    const double now = monotonic_seconds();
    if (g_stop.load()) {
        if (now - g_first_signal_at.load() < kRepeatedSignalSeconds) return;
        write_from_handler("tmx: second signal: exiting without a checkpoint\n");
        ::_exit(128 + sig);
    }
    g_first_signal_at.store(now);
    g_signal.store(sig);
    g_stop.store(true);
    write_from_handler(
        "tmx: stopping after this micro-batch to write a checkpoint (signal again to exit at "
        "once)\n");
}

std::string format_duration(double s) {
    char buf[32];
    const long t = static_cast<long>(s + 0.5);
    if (t >= 3600)
        std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else if (t >= 60)
        std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
    else
        std::snprintf(buf, sizeof buf, "%lds", t);
    return buf;
}

void print_report(const TrainReport& r) {
    std::fprintf(
        stderr,
        "step %lld/%lld | loss %.4f | aux %.3f | %s | lr %.2e | gnorm %.3f | %.0f tok/s%s | ETA "
        "%s\n",
        static_cast<long long>(r.step), static_cast<long long>(r.max_steps), r.loss, r.aux,
        r.val_loss ? ("val " + std::to_string(*r.val_loss).substr(0, 6)).c_str() : "val -", r.lr,
        r.grad_norm, r.tokens_per_s,
        r.comm_share ? (" (comm " + std::to_string(std::lround(100 * *r.comm_share)) + "%)").c_str()
                     : "",
        format_duration(r.eta_s).c_str());
    if (r.skipped > 0)
        std::fprintf(stderr,
                     "  skipped %lld non-finite step(s) since the last line (--skip-nonfinite)\n",
                     static_cast<long long>(r.skipped));
    if (!r.expert_load.empty()) {
        std::string line = "  expert load %:";
        for (size_t l = 0; l < r.expert_load.size(); ++l) {
            line += " L" + std::to_string(l) + "[";
            for (size_t e = 0; e < r.expert_load[l].size(); ++e) {
                char buf[8];
                std::snprintf(buf, sizeof buf, "%s%.0f", e ? " " : "", 100.0 * r.expert_load[l][e]);
                line += buf;
            }
            line += "]";
        }
        std::fprintf(stderr, "%s\n", line.c_str());
    }
    if (!r.checkpoint.empty()) std::fprintf(stderr, "  checkpoint %s\n", r.checkpoint.c_str());
}

struct Options {
    std::string config, resume, out;
    uint64_t init_seed = 0;
    TrainOptions train;
    BackendChoice backend;
    bool backend_given = false, device_given = false;  // --backend, --device on the command line
    bool shard_optimizer = false;
    double grad_bucket_mib = 16.0;
    double collective_timeout = 600.0;
};

// Name -> flag, for the options --resume may override.
struct Flag {
    const char* key;
    CLI::Option* opt;
};

// How the gradients are summed over the ranks, for the data-parallel line.
std::string gradient_sums(const Options& o, int ranks) {
    if (o.shard_optimizer && ranks > 1) return "gradients reduce-scattered after the backward pass";
    if (o.grad_bucket_mib <= 0) return "gradients summed after the backward pass";
    char text[96];
    std::snprintf(text, sizeof text, "gradients summed during the backward pass in %g MiB buckets",
                  o.grad_bucket_mib);
    return text;
}

// The backend as a run records it, for a resume to open again: --backend resolved, with --device
// when given ("vulkan:1"; a data-parallel rank's default device is its launch's, not the run's).
std::string run_backend_name(const BackendChoice& choice, const Backend& opened) {
    if (choice.backend.find(':') != std::string::npos) return choice.backend;  // "vulkan:1"
    return with_device(opened.name(), choice.device);
}

// A resumed run trains on the backend it trained on (recorded in its checkpoints) unless
// --backend or --device says otherwise: opens it, and sets `why` to where it came from for the
// backend line ("" when the flags name the run's own).
OpenedBackend open_resume_backend(Options& o, std::string& why) {
    const std::string recorded = recorded_backend(o.resume).value_or("");
    if (o.backend_given || o.device_given) {
        auto backend = o.backend.open(/*announce=*/false);
        const std::string name = run_backend_name(o.backend, *backend);
        if (!recorded.empty() && name != recorded) why = "overriding the run's " + recorded;
        return backend;
    }
    if (recorded.empty()) {
        why = "auto: the run has not recorded its backend";
        return o.backend.open(/*announce=*/false);
    }
    why = "from run";
    o.backend.backend = recorded;
    try {
        return o.backend.open(/*announce=*/false);
    } catch (const Error& e) {
        const std::string said = e.message(cli::flag_of) + " (the run trained on " + recorded +
                                 "; --backend resumes it on another)";
        if (dynamic_cast<const UsageError*>(&e)) throw UsageError(said);
        throw Error(said);
    }
}

// Trains on this process's share of the job: `comm` (a rank of a data-parallel job, or one
// process) becomes the backend's device communicator once the backend is open.
void run_training(Options& o, const std::vector<Flag>& flags, std::unique_ptr<Communicator>& comm) {
    if (!o.resume.empty() &&
        (!o.out.empty() || !o.train.data_dir.empty() || !o.train.val_dir.empty()))
        throw UsageError(
            "--resume continues a run where it was: drop --out, --data and --val-data");
    // Announced once the trainer has set the precision (a resumed run keeps its own).
    std::string backend_why;
    auto backend =
        o.resume.empty() ? o.backend.open(/*announce=*/false) : open_resume_backend(o, backend_why);
    comm = open_device_communicator(*backend, std::move(comm),
                                    {.collective_timeout_s = o.collective_timeout});
    const DataParallel dp = {
        .comm = comm.get(),
        .shard_optimizer = o.shard_optimizer,
        // Rounded up: any bucket size above 0 overlaps, as the start line says.
        .bucket_bytes = static_cast<int64_t>(std::ceil(o.grad_bucket_mib * (1 << 20)))};
    const bool root = comm->rank() == 0;
    std::unique_ptr<Trainer> trainer;
    if (!o.resume.empty()) {
        nlohmann::json overrides = nlohmann::json::object();
        const nlohmann::json given = train_options_to_json(o.train);
        for (const Flag& f : flags)
            if (f.opt->count() > 0) overrides[f.key] = given[f.key];
        // --grad-accum is per rank; the run keeps the micro-batches of all ranks.
        if (overrides.contains("grad_accum"))
            overrides["grad_accum"] = o.train.grad_accum * comm->size();
        // The run keeps the precision it started with unless --precision says otherwise
        // (which Trainer::resume refuses: it would change the run's math).
        if (o.backend.precision_given())
            overrides["precision"] = to_string(backend->matmul_precision());
        // Its checkpoints from now on record the backend it goes on with.
        overrides["backend"] = run_backend_name(o.backend, *backend);
        trainer = Trainer::resume(o.resume, *backend, overrides, dp);
        if (root) {
            o.backend.announce(*backend, backend_why);
            std::fprintf(stderr, "resuming %s at step %lld of %lld (%s matmuls)\n",
                         trainer->run_dir().c_str(), static_cast<long long>(trainer->step()),
                         static_cast<long long>(trainer->max_steps()),
                         to_string(backend->matmul_precision()));
        }
    } else {
        if (o.config.empty()) throw UsageError("give --config CFG for a new run, or --resume RUN");
        if (o.out.empty()) throw UsageError("--out: the run directory is required");
        o.train.precision = backend->matmul_precision();  // --precision, resolved
        o.train.backend = run_backend_name(o.backend, *backend);
        o.train.grad_accum *= comm->size();  // the run's global batch
        trainer = Trainer::start(load_config(o.config), o.train, o.out, o.init_seed, *backend, dp);
        if (root) {
            o.backend.announce(*backend);
            std::fprintf(stderr, "training %lld parameters for %lld steps into %s (%s matmuls)\n",
                         static_cast<long long>(trainer->model().num_params()),
                         static_cast<long long>(trainer->max_steps()), o.out.c_str(),
                         to_string(backend->matmul_precision()));
        }
    }
    const TrainOptions& run = trainer->options();
    // Said whenever a communicator runs (TMX_FORCE_NCCL runs one on a single rank).
    if (root && dynamic_cast<const SoloCommunicator*>(comm.get()) == nullptr)
        std::fprintf(stderr,
                     "data parallel: %s; global batch %lld sequences (--batch-size %lld x "
                     "--grad-accum %lld x %d rank%s); AdamW moments %s per rank%s; %s\n",
                     comm->description().c_str(),
                     static_cast<long long>(run.batch_size * run.grad_accum),
                     static_cast<long long>(run.batch_size),
                     static_cast<long long>(run.grad_accum / comm->size()), comm->size(),
                     comm->size() == 1 ? "" : "s",
                     fmt_bytes(static_cast<double>(trainer->optimizer_bytes())).c_str(),
                     o.shard_optimizer && comm->size() > 1 ? " (sharded)" : "",
                     gradient_sums(o, comm->size()).c_str());
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESTART;  // the file writes in flight finish rather than fail with EINTR
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGINT);
    sigaddset(&sa.sa_mask, SIGTERM);
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    TrainReport last = trainer->run(print_report, &g_stop);
    // The run ends early only when stopped: by a signal here or, under mpirun, to another rank.
    if (trainer->step() < trainer->max_steps()) {
        const int sig = g_signal.load() ? g_signal.load() : SIGTERM;
        const char* by = !g_signal.load()      ? "a signal to another rank"
                         : g_signal == SIGTERM ? "SIGTERM"
                                               : "SIGINT";
        if (!root) throw Interrupted{128 + sig};
        if (trainer->last_checkpoint().empty())
            std::fprintf(stderr,
                         "stopped by %s before the first step; no checkpoint to resume from\n", by);
        else
            std::fprintf(stderr,
                         "stopped by %s at step %lld; checkpoint %s\n"
                         "resume with: tmx train --resume %s\n",
                         by, static_cast<long long>(last.step), trainer->last_checkpoint().c_str(),
                         trainer->run_dir().c_str());
        throw Interrupted{128 + sig};
    }
    if (!root) return;
    std::fprintf(stderr,
                 "done: %lld steps; checkpoints in %s (best/ has the lowest validation loss)\n",
                 static_cast<long long>(last.step), trainer->run_dir().c_str());
}

}  // namespace

void add_train_command(CLI::App& app, CommonOptions& common) {
    auto o = std::make_shared<Options>();
    TrainOptions& t = o->train;
    CLI::App* sub = app.add_subcommand(
        "train", "Train a model on a token dataset (tmx prepare); Ctrl-C checkpoints and stops");
    auto* config = sub->add_option("--config", o->config, "Model config (native JSON) of a new run")
                       ->check(CLI::ExistingFile);
    auto* resume = sub->add_option("--resume", o->resume,
                                   "Continue a run: its directory (latest checkpoint) or one of "
                                   "its step_* checkpoints");
    config->excludes(resume);
    sub->add_option("--out", o->out, "Run directory of a new run (checkpoints, metrics.jsonl)");
    sub->add_option("--data", t.data_dir, "Token dataset directory (its train split trains)");
    sub->add_option("--val-data", t.val_dir, "Dataset whose val split evaluates (default: --data)");
    std::vector<Flag> flags = {
        {"batch_size", sub->add_option("--batch-size", t.batch_size, "Sequences per micro-batch")
                           ->check(in_range<int64_t>(1))
                           ->capture_default_str()},
        {"seq_len", sub->add_option("--seq-len", t.seq_len,
                                    "Tokens per sequence (0: the config's max_seq_len)")
                        ->check(in_range<int64_t>(0))
                        ->capture_default_str()},
        {"grad_accum",
         sub->add_option("--grad-accum", t.grad_accum,
                         "Micro-batches per optimizer step, per rank (mpirun -np N: the global "
                         "batch is --batch-size x --grad-accum x N sequences)")
             ->check(in_range<int64_t>(1))
             ->capture_default_str()},
        {"max_steps", sub->add_option("--max-steps", t.max_steps, "Budget in optimizer steps")
                          ->check(in_range<int64_t>(1))},
        {"max_tokens", sub->add_option("--max-tokens", t.max_tokens, "Budget in training tokens")
                           ->check(in_range<int64_t>(1))},
        {"lr", sub->add_option("--lr", t.lr, "Peak learning rate")->capture_default_str()},
        {"min_lr",
         sub->add_option("--min-lr", t.min_lr, "Cosine decay floor")->capture_default_str()},
        {"warmup_steps", sub->add_option("--warmup-steps", t.warmup_steps, "Linear warmup steps")
                             ->check(in_range<int64_t>(0))
                             ->capture_default_str()},
        {"beta1", sub->add_option("--beta1", t.beta1, "AdamW beta1")->capture_default_str()},
        {"beta2", sub->add_option("--beta2", t.beta2, "AdamW beta2")->capture_default_str()},
        {"eps", sub->add_option("--eps", t.eps, "AdamW epsilon")->capture_default_str()},
        {"weight_decay",
         sub->add_option("--weight-decay", t.weight_decay,
                         "AdamW decoupled weight decay (2-D weights except the embedding)")
             ->capture_default_str()},
        {"grad_clip",
         sub->add_option("--grad-clip", t.grad_clip, "Global gradient-norm clip (0: off)")
             ->capture_default_str()},
        {"eval_every", sub->add_option("--eval-every", t.eval_every,
                                       "Steps between validations (0: only at the end)")
                           ->check(in_range<int64_t>(0))
                           ->capture_default_str()},
        {"eval_batches", sub->add_option("--eval-batches", t.eval_batches,
                                         "Batches of validation windows per evaluation")
                             ->check(in_range<int64_t>(1))
                             ->capture_default_str()},
        {"checkpoint_every", sub->add_option("--checkpoint-every", t.checkpoint_every,
                                             "Steps between checkpoints (0: only at the end)")
                                 ->check(in_range<int64_t>(0))
                                 ->capture_default_str()},
        {"keep_last", sub->add_option("--keep-last", t.keep_last,
                                      "Step checkpoints kept (best/ is kept besides)")
                          ->check(in_range<int64_t>(1))
                          ->capture_default_str()},
        {"log_every", sub->add_option("--log-every", t.log_every, "Steps between progress lines")
                          ->check(in_range<int64_t>(1))
                          ->capture_default_str()},
        {"seed", sub->add_option("--seed", t.seed, "Data-order seed")
                     ->check(in_range<uint64_t>(0))
                     ->capture_default_str()},
        {"skip_nonfinite", sub->add_option("--skip-nonfinite", t.skip_nonfinite,
                                           "Non-finite steps (loss or gradient norm) skipped, not "
                                           "applied, before the run stops")
                               ->check(in_range<int64_t>(0))
                               ->capture_default_str()},
    };
    sub->add_option("--init-seed", o->init_seed, "Weight initialisation seed of a new run")
        ->check(in_range<uint64_t>(0))
        ->capture_default_str();
    sub->add_flag("--shard-optimizer", o->shard_optimizer,
                  "Under mpirun: each rank keeps its share of the AdamW moments only (ZeRO-1), "
                  "the optimizer memory per rank divided by the rank count, the same steps");
    sub->add_option("--grad-bucket-mb", o->grad_bucket_mib,
                    "Under mpirun: the gradients are summed over the ranks in buckets of this "
                    "many MiB, each started as soon as the backward pass has finished it, so the "
                    "sums overlap the rest of the pass (0: one sum after the pass; the same "
                    "results either way; --shard-optimizer reduce-scatters after the pass)")
        ->check(CLI::Range(0.0, 1e6))
        ->capture_default_str();
    sub->add_option("--collective-timeout", o->collective_timeout,
                    "Under mpirun: seconds a rank waits in a collective before it ends the job "
                    "(another rank hung or died; 0: wait forever)")
        ->check(CLI::Range(0.0, 1e6))
        ->capture_default_str();
    add_backend_options(*sub, o->backend, /*training=*/true);
    add_common_options(*sub, common);
    sub->callback([o, flags, sub, &common]() {
        o->backend_given = sub->get_option("--backend")->count() > 0;
        o->device_given = sub->get_option("--device")->count() > 0;
        // Under mpirun, before the backend: the rank picks its GPU and its share of the cores.
        const LaunchEnv launch = detect_launch_env();
        std::unique_ptr<Communicator> comm =
            open_host_communicator({.collective_timeout_s = o->collective_timeout});
        if (comm->size() > 1) {
            o->backend.default_device = launch.local_rank;
            if (common.threads == 0)
                set_num_threads(std::max(
                    1, static_cast<int>(std::thread::hardware_concurrency()) / launch.local_size));
        }
        try {
            run_training(*o, flags, comm);
        } catch (const Interrupted&) {
            comm.reset();  // every rank stopped at the same step: finalize, not unwinding
            throw;
        } catch (const std::exception& e) {
            if (comm->size() == 1) throw;
            // A rank that cannot go on ends every rank, which would otherwise wait in their
            // next collective. Where every rank fails alike (a non-finite step), rank 0's
            // message is the one to read first.
            if (comm->rank() != 0) std::this_thread::sleep_for(std::chrono::seconds(1));
            const bool usage = dynamic_cast<const UsageError*>(&e) != nullptr;
            const auto* error = dynamic_cast<const Error*>(&e);
            comm->abort(std::string(usage ? "" : "error: ") +
                            (error ? error->message(cli::flag_of) : std::string(e.what())),
                        usage ? 2 : 1);
        }
    });
}

}  // namespace tmx::cli

// The step loop: a run's steps, evaluations, reports and checkpoints on their schedule. The
// files are run_store.cpp's, the gradient sums and AdamW data_parallel.cpp's.
#include "engine/train/trainer.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "engine/core/errors.h"
#include "engine/core/file_io.h"
#include "engine/core/format.h"
#include "engine/dist/communicator.h"
#include "engine/model/checkpoint.h"
#include "engine/train/metrics_plot.h"

namespace tmx {
namespace fs = std::filesystem;
using nlohmann::json;

Trainer::Trainer(std::unique_ptr<Model> model, TrainOptions options, std::string run_dir,
                 Backend& backend, DataParallel dp)
    : model_(std::move(model)),
      options_(std::move(options)),
      run_dir_(std::move(run_dir)),
      backend_(backend) {
    if (!dp.comm) solo_ = std::make_unique<SoloCommunicator>();
    comm_ = dp.comm ? dp.comm : solo_.get();
    check_ranks_share_the_batch(options_.grad_accum, options_.batch_size, comm_->size());
    if (!backend_.supports_training())
        throw Error("the " + backend_.name() +
                    " backend runs inference only (it has no "
                    "backward ops)");
    mode_.emplace(backend_, Backend::Mode{.precision = options_.precision, .training = true});
    const ModelConfig& c = model_->config();
    seq_len_ = options_.seq_len > 0 ? options_.seq_len : c.max_seq_len;
    const int64_t per_step = options_.tokens_per_step(seq_len_);
    // Rounded up without adding first, which could overflow for a budget near the int64 limit.
    max_steps_ = options_.max_steps > 0
                     ? options_.max_steps
                     : options_.max_tokens / per_step + (options_.max_tokens % per_step != 0);
    optimizer_ =
        std::make_unique<DataParallelOptimizer>(*model_, backend_, *comm_, dp, comm_clock_);
    // The run records the backend it trains on (its name with the device as opened, when that
    // is this backend's), so that a resume can keep it.
    const std::string recorded = options_.backend.substr(0, options_.backend.find(':'));
    if (recorded != backend_.name()) options_.backend = backend_.name();
}

Trainer::~Trainer() = default;

std::unique_ptr<Trainer> Trainer::start(const ModelConfig& config, const TrainOptions& options,
                                        const std::string& run_dir, uint64_t init_seed,
                                        Backend& backend, DataParallel dp) {
    validate_train_options(options, config);
    check_train_memory(config, options, backend);
    const bool root = !dp.comm || dp.comm->rank() == 0;
    return filesystem_errors_as_errors([&] {
        if (root) refuse_existing_run(run_dir);
        // Every rank makes the same weights from the seed: nothing to broadcast.
        auto model = std::make_unique<Model>(config, backend);
        model->init_random(init_seed);
        std::unique_ptr<Trainer> t(new Trainer(std::move(model), options, run_dir, backend, dp));
        t->data_.emplace(t->options_, config.vocab_size, t->seq_len_);
        if (root) t->lock_ = create_run_dir(run_dir);  // rank 0 alone writes the run directory
        return t;
    });
}

std::unique_ptr<Trainer> Trainer::resume(const std::string& path, Backend& backend,
                                         const json& overrides, DataParallel dp) {
    const bool root = !dp.comm || dp.comm->rank() == 0;
    return filesystem_errors_as_errors([&] {
        // The other ranks read the checkpoint rank 0 chose, once it holds the lock.
        std::unique_ptr<RunDirLock> lock;
        std::string ckpt;
        if (root) lock = lock_run(path, ckpt);
        if (dp.comm) dp.comm->broadcast(ckpt, 0);
        const std::string run_dir = parent_or_dot(ckpt).string();
        const std::string state_path = (fs::path(ckpt) / kStateFile).string();
        const json state = read_json_file(state_path);
        const TrainOptions options = resumed_options(state, state_path, overrides);
        const ModelConfig config = check_resumable(ckpt, options, backend);
        validate_train_options(options, config);
        check_train_memory(config, options, backend);
        auto model = std::make_unique<Model>(config, backend);
        load_checkpoint_weights(*model, ckpt);
        std::unique_ptr<Trainer> t(new Trainer(std::move(model), options, run_dir, backend, dp));
        t->lock_ = std::move(lock);
        t->data_.emplace(t->options_, config.vocab_size, t->seq_len_);
        t->restore(read_run_state(state, state_path, options.tokens_per_step(t->seq_len_)));
        t->last_checkpoint_ = ckpt;
        std::vector<float> m, v;
        read_optimizer_moments(ckpt, t->model_->num_params(), m, v);
        t->optimizer_->moments_from_host(m, v);
        if (root) trim_metrics(run_dir, t->step_);
        return t;
    });
}

bool Trainer::stop_requested(const StopPredicate& should_stop) {
    const bool mine = should_stop && should_stop();
    if (ranks() == 1) return mine;
    std::vector<double> any = {mine ? 1.0 : 0.0};
    comm_clock_.time([&] { comm_->all_reduce_sum(any); });
    return any[0] > 0.0;
}

Trainer::StepOutcome Trainer::train_step(const StopPredicate& should_stop) {
    Model& m = *model_;
    m.zero_grads();
    std::vector<int32_t> inputs, targets;
    // Per layer and expert (MoE): sized alike on every rank, for the sum over them.
    const ModelConfig& c = m.config();
    std::vector<std::vector<int64_t>> slots(
        c.is_moe() ? static_cast<size_t>(c.n_layers) : 0,
        std::vector<int64_t>(static_cast<size_t>(std::max<int64_t>(c.n_experts, 0)), 0));
    // This rank's share of the step: loss, aux, and how many micro-batches had a non-finite
    // loss or aux loss (after which this rank computes no more of the step).
    double loss = 0.0, aux = 0.0, bad_loss = 0.0, bad_aux = 0.0;
    const float micro_scale = 1.0f / static_cast<float>(options_.grad_accum);
    const int64_t local_micros = options_.grad_accum / ranks();
    // The last micro-batch's backward pass waits for the step's figures: it may start gradient
    // sums, which every rank must start alike, so only once every rank knows the step is finite.
    for (int64_t micro = 0; micro < local_micros; ++micro) {
        // Nothing of the step is applied yet: dropping it here loses nothing a resume redoes.
        if (stop_requested(should_stop)) return StepOutcome::Interrupted;
        if (bad_loss + bad_aux > 0) continue;  // still polled with the others above
        data_->sample_batch(step_, rank() * local_micros + micro, inputs, targets);
        ForwardResult r = m.forward(inputs, options_.batch_size, seq_len_, &targets, true);
        loss += r.loss * micro_scale;
        aux += r.aux * micro_scale;
        if (!std::isfinite(r.loss) || !std::isfinite(r.aux)) {
            (std::isfinite(r.loss) ? bad_aux : bad_loss) += 1.0;
            continue;
        }
        add_expert_slots(slots, r.expert_slots);
        if (micro + 1 < local_micros) m.backward(micro_scale);
    }
    // The step's figures over all ranks: every rank decides alike whether to apply it.
    std::vector<double> figures = {loss, aux, bad_loss, bad_aux};
    const size_t experts = c.is_moe() ? static_cast<size_t>(c.n_experts) : 1;
    for (const auto& layer : slots)
        for (int64_t count : layer) figures.push_back(static_cast<double>(count));
    comm_clock_.time([&] { comm_->all_reduce_sum(figures); });
    loss = figures[0];
    aux = figures[1];
    if (figures[2] > 0 || figures[3] > 0)
        return reject_nonfinite(figures[2] > 0 ? "loss" : "aux loss", loss, aux, std::nullopt);
    for (size_t i = 4; i < figures.size(); ++i)  // counts, exact in a double
        slots[(i - 4) / experts][(i - 4) % experts] = static_cast<int64_t>(figures[i]);
    // Every rank's last micro-batch was finite, so every rank has its backward pass due.
    const bool overlap = optimizer_->overlaps_backward();
    m.backward(micro_scale, overlap ? optimizer_->start_gradient_sums() : Model::GradsFinal{});
    const double grad_norm = optimizer_->reduce_gradients(overlap);
    if (!std::isfinite(grad_norm)) return reject_nonfinite("gradient norm", loss, aux, grad_norm);
    optimizer_->step(adamw_params(options_, step_, max_steps_, grad_norm));
    m.params_changed();
    ++step_;
    unsaved_ = true;
    window_.add_applied(loss, aux, grad_norm, slots);
    return StepOutcome::Applied;
}

Trainer::StepOutcome Trainer::reject_nonfinite(const std::string& what, double loss, double aux,
                                               std::optional<double> grad_norm) {
    const int64_t step = step_ + 1;
    const bool skip = nonfinite_skipped_ < options_.skip_nonfinite;
    // A loss rejected before its backward pass leaves the forward's activations: free them
    // before a validation pass or the next step runs beside them.
    model_->discard_activations();
    json line = {{"step", step},
                 {"tokens", step * options_.tokens_per_step(seq_len_)},
                 {"lr", learning_rate(options_, step_, max_steps_)},
                 {"loss", metrics_value(loss)},
                 {"aux", metrics_value(aux)},
                 {"nonfinite", what},
                 {"skipped", skip}};
    if (grad_norm) line["grad_norm"] = metrics_value(*grad_norm);
    const double value = what == "loss" ? loss : what == "aux loss" ? aux : *grad_norm;
    if (skip) {
        append_metrics(line);
        // The step is consumed (its batch is never used) without touching weights or moments.
        ++nonfinite_skipped_;
        ++window_.skipped;
        ++step_;
        unsaved_ = true;
        return StepOutcome::Skipped;
    }
    const OptionText advice = options_.skip_nonfinite > 0
                                  ? "the run has had " + std::to_string(nonfinite_skipped_ + 1) +
                                        " non-finite steps, more than " + opt("skip_nonfinite") +
                                        " " + std::to_string(options_.skip_nonfinite) + " allows"
                                  : "lower " + opt("lr") + " or " + opt("grad_clip") +
                                        ", or resume with " + opt("skip_nonfinite") +
                                        " N to skip up to N such steps";
    const std::string unlogged = log_before_error(line);
    throw Error("step " + std::to_string(step) + ": the " + what + " is " + format_real(value) +
                "; the step was not applied and no checkpoint was written (" +
                last_checkpoint_phrase() + "); " + advice + unlogged);
}

std::string Trainer::last_checkpoint_phrase() const {
    return last_checkpoint_.empty() ? "the run has no checkpoint yet"
                                    : "the last checkpoint is " + last_checkpoint_;
}

double Trainer::evaluate() {
    return *evaluate_until(StopPredicate());
}

std::optional<double> Trainer::evaluate_until(const StopPredicate& should_stop) {
    // The ranks take turns over the validation batches (rank r: batches r, r + N, ...), in
    // rounds, so that they agree on a stop between batches; the sums are then added over the
    // ranks.
    const int64_t B = options_.batch_size, N = ranks();
    const int64_t windows = data_->validation_windows();
    const int64_t batches = (windows + B - 1) / B;
    double total = 0.0, count = 0.0;
    std::vector<int32_t> inputs, targets;
    for (int64_t round = 0; round * N < batches; ++round) {
        if (stop_requested(should_stop)) return std::nullopt;
        const int64_t w0 = (round * N + rank()) * B;
        if (w0 >= windows) continue;
        const int64_t rows = std::min(B, windows - w0);
        data_->validation_batch(w0, rows, inputs, targets);
        ForwardResult res = model_->forward_loss(inputs, rows, seq_len_, targets);
        total += res.loss * static_cast<double>(res.n_targets);
        count += static_cast<double>(res.n_targets);
    }
    std::vector<double> sums = {total, count};
    comm_->all_reduce_sum(sums);
    return sums[0] / sums[1];
}

RunState Trainer::run_state() const {
    return {.step = step_,
            .max_steps = max_steps_,
            .tokens = step_ * options_.tokens_per_step(seq_len_),
            .best_val_loss = best_val_loss_,
            .nonfinite_skipped = nonfinite_skipped_,
            .finish_pending = finish_pending_,
            .since_report = window_};
}

void Trainer::restore(const RunState& state) {
    step_ = state.step;
    best_val_loss_ = state.best_val_loss;
    nonfinite_skipped_ = state.nonfinite_skipped;
    finish_pending_ = state.finish_pending;
    window_ = state.since_report;
}

std::string Trainer::save(bool best) {
    const std::string dir =
        (fs::path(run_dir_) / (best ? std::string(kBestDir) : step_dir_name(step_))).string();
    std::vector<float> m, v;
    optimizer_->moments_to_host(m, v);  // a collective when sharded: before rank 0 goes its own way
    if (is_root())                      // rank 0 alone writes, what every rank holds alike
        write_run_checkpoint(*model_, dir,
                             {.state = run_state(),
                              .options = options_,
                              .m = m,
                              .v = v,
                              .tokenizer_path = data_->tokenizer_path()},
                             last_checkpoint_phrase());
    if (!best) {
        last_checkpoint_ = dir;
        unsaved_ = false;
    }
    return dir;
}

std::string Trainer::save_step_checkpoint() {
    const std::string dir = save(false);
    if (is_root()) prune_step_checkpoints(run_dir_, options_.keep_last);
    return dir;
}

void Trainer::append_metrics(const json& line) {
    if (is_root()) tmx::append_metrics(run_dir_, line);
}

std::string Trainer::log_before_error(const json& line) {
    return is_root() ? append_metrics_before_error(run_dir_, line) : "";
}

Trainer::DueWork Trainer::due_after(int64_t step) const {
    DueWork due;
    const bool last_step = step == max_steps_;
    due.evaluation = last_step || (options_.eval_every > 0 && step % options_.eval_every == 0);
    due.checkpoint =
        last_step || (options_.checkpoint_every > 0 && step % options_.checkpoint_every == 0);
    due.report = due.evaluation || due.checkpoint || step % options_.log_every == 0;
    return due;
}

bool Trainer::finish_step(const StopPredicate& should_stop,
                          const std::function<void(const TrainReport&)>& on_report,
                          TrainReport& report) {
    // Until the end of this function the step's work is pending: a checkpoint written meanwhile
    // (best/, or the one a stop writes) makes a resume do it again.
    finish_pending_ = true;
    const DueWork due = due_after(step_);
    report = TrainReport{};
    if (due.evaluation && !evaluate_and_keep_best(should_stop, report)) return false;
    if (due.report) report_progress(report);
    finish_pending_ = false;
    unsaved_ = true;
    if (due.checkpoint) report.checkpoint = save_step_checkpoint();
    if (due.report && is_root()) on_report(report);
    return true;
}

bool Trainer::evaluate_and_keep_best(const StopPredicate& should_stop, TrainReport& report) {
    const std::optional<double> val = evaluate_until(should_stop);
    if (!val) return false;
    if (!std::isfinite(*val)) {
        const std::string unlogged = log_before_error({{"step", step_},
                                                       {"val_loss", metrics_value(*val)},
                                                       {"nonfinite", "validation loss"},
                                                       {"skipped", false}});
        throw Error("step " + std::to_string(step_) + ": the validation loss is " +
                    format_real(*val) +
                    ": the weights are no longer usable; no checkpoint was written (" +
                    last_checkpoint_phrase() + "); lower " + opt("lr") + unlogged);
    }
    report.val_loss = *val;
    if (!best_val_loss_ || *val < *best_val_loss_) {
        best_val_loss_ = *val;
        save(/*best=*/true);
    }
    return true;
}

void Trainer::report_progress(TrainReport& report) {
    using clock = std::chrono::steady_clock;
    const auto now = clock::now();
    const double dt = std::chrono::duration<double>(now - last_report_time_).count();
    const double elapsed = std::chrono::duration<double>(now - run_start_).count();
    const int64_t timed_steps = step_ - last_report_step_, run_steps = step_ - run_start_step_;
    last_report_time_ = now;
    last_report_step_ = step_;
    const int64_t per_step = options_.tokens_per_step(seq_len_);
    summarize_window(window_, report);
    report.step = step_;
    report.max_steps = max_steps_;
    report.tokens = step_ * per_step;
    report.lr = learning_rate(options_, step_ - 1, max_steps_);
    report.tokens_per_s = static_cast<double>(timed_steps * per_step) / std::max(dt, 1e-9);
    const double comm_seconds = comm_clock_.take();
    if (ranks() > 1) report.comm_share = std::min(comm_seconds / std::max(dt, 1e-9), 1.0);
    report.elapsed_s = elapsed;
    report.eta_s = run_steps > 0 ? elapsed / static_cast<double>(run_steps) *
                                       static_cast<double>(std::max<int64_t>(max_steps_ - step_, 0))
                                 : 0.0;
    append_metrics(metrics_line(report));
    window_ = ReportWindow{};
}

void Trainer::stop_after_metrics_failure(const Error& failure) {
    std::string outcome;
    if (ranks() > 1) {
        // Rank 0 alone saw it, while the others went on to the next collective: no checkpoint
        // can be agreed on; the job ends at the last one.
        outcome = "(" + last_checkpoint_phrase() + ")";
    } else if (!unsaved_) {
        outcome = "its checkpoint " + last_checkpoint_ + " is current";
    } else {
        try {
            outcome = "after writing the checkpoint " + save_step_checkpoint();
        } catch (const std::exception& e) {
            outcome =
                "and its checkpoint could not be written either (" + std::string(e.what()) + ")";
        }
    }
    throw Error(failure.text() + "; the run stopped at step " + std::to_string(step_) + " " +
                outcome + "; resume with " + opt("resume") + " " + run_dir_ +
                " once it can be written");
}

TrainReport Trainer::run(const std::function<void(const TrainReport&)>& on_report,
                         const std::atomic<bool>* stop) {
    if (!stop) return run(on_report, StopPredicate());
    return run(on_report, [stop] { return stop->load(); });
}

TrainReport Trainer::run(const std::function<void(const TrainReport&)>& on_report,
                         const StopPredicate& should_stop) {
    return filesystem_errors_as_errors([&] {
        run_start_ = last_report_time_ = std::chrono::steady_clock::now();
        run_start_step_ = last_report_step_ = step_;
        TrainReport report;
        try {
            // A checkpoint written while step_'s evaluation was running finishes that first.
            bool interrupted = finish_pending_ && !finish_step(should_stop, on_report, report);
            while (!interrupted && step_ < max_steps_)
                interrupted = train_step(should_stop) == StepOutcome::Interrupted ||
                              !finish_step(should_stop, on_report, report);
        } catch (const MetricsWriteError& e) {
            stop_after_metrics_failure(e);
        }
        if (unsaved_) report.checkpoint = save_step_checkpoint();
        report.step = step_;
        report.max_steps = max_steps_;
        return report;
    });
}

}  // namespace tmx

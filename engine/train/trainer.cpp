#include "engine/train/trainer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "engine/core/checked_math.h"
#include "engine/core/errors.h"
#include "engine/core/file_io.h"
#include "engine/core/format.h"
#include "engine/core/json_fields.h"
#include "engine/core/rng.h"
#include "engine/dist/communicator.h"
#include "engine/model/checkpoint.h"
#include "engine/model/safetensors.h"
#include "engine/train/metrics_plot.h"

namespace tmx {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// A metrics.jsonl write that failed: the run stops after a last checkpoint attempt.
class MetricsWriteError : public Error {
  public:
    using Error::Error;
};

void check_run_memory(const ModelConfig& c, const TrainOptions& o, const Backend& backend) {
    check_training_memory(
        c, o.batch_size, o.seq_len > 0 ? o.seq_len : c.max_seq_len, o.precision, backend,
        {"--batch-size", "--seq-len", " (--grad-accum keeps the tokens per step)"});
}

void add_slots(std::vector<std::vector<int64_t>>& total,
               const std::vector<std::vector<int64_t>>& add) {
    if (total.size() < add.size()) total.resize(add.size());
    for (size_t l = 0; l < add.size(); ++l) {
        if (total[l].size() < add[l].size()) total[l].resize(add[l].size(), 0);
        for (size_t e = 0; e < add[l].size(); ++e) total[l][e] += add[l][e];
    }
}

// The first tensor of `layout` with a value that is not finite in the flat `values`, or "".
std::string first_nonfinite_tensor(const ParamLayout& layout, const std::vector<float>& values) {
    for (const auto& s : layout.specs)
        for (int64_t i = s.offset; i < s.offset + s.numel(); ++i)
            if (!std::isfinite(values[static_cast<size_t>(i)])) return s.name;
    return "";
}

}  // namespace

double Trainer::learning_rate(const TrainOptions& o, int64_t step, int64_t max_steps) {
    if (o.warmup_steps > 0 && step < o.warmup_steps)
        return o.lr * static_cast<double>(step + 1) / static_cast<double>(o.warmup_steps);
    const int64_t decay_steps = max_steps - o.warmup_steps;
    if (decay_steps <= 0) return o.lr;
    const double progress = std::clamp(
        static_cast<double>(step - o.warmup_steps) / static_cast<double>(decay_steps), 0.0, 1.0);
    return o.min_lr + 0.5 * (o.lr - o.min_lr) * (1.0 + std::cos(M_PI * progress));
}

Trainer::Trainer(std::unique_ptr<Model> model, TrainOptions options, std::string run_dir,
                 Backend& backend, DataParallel dp)
    : model_(std::move(model)),
      options_(std::move(options)),
      run_dir_(std::move(run_dir)),
      backend_(backend) {
    if (!dp.comm) solo_ = std::make_unique<SoloCommunicator>();
    comm_ = dp.comm ? dp.comm : solo_.get();
    const int64_t N = comm_->size();
    if (options_.grad_accum % N != 0)
        throw UsageError("the run's global batch is " + std::to_string(options_.grad_accum) +
                         " micro-batches of " + std::to_string(options_.batch_size) +
                         " sequences per step, which " + std::to_string(N) +
                         " ranks cannot share evenly: run it on a number of ranks that divides " +
                         std::to_string(options_.grad_accum));
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
    const int64_t P = model_->num_params();
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

Trainer::~Trainer() = default;

void Trainer::open_data() {
    const ModelConfig& c = model_->config();
    train_data_ = open_dataset(options_.data_dir, Split::Train);
    val_data_ =
        open_dataset(options_.val_dir.empty() ? options_.data_dir : options_.val_dir, Split::Val);
    for (const TokenDataset* d : {&*train_data_, &*val_data_}) {
        if (static_cast<int64_t>(d->vocab_size()) != c.vocab_size)
            throw Error(d->dir() + ": its tokens use a vocabulary of " +
                        std::to_string(d->vocab_size()) + " but the model's vocab_size is " +
                        std::to_string(c.vocab_size) +
                        " (prepare the data with the model's tokenizer)");
        if (static_cast<int64_t>(d->size()) <= seq_len_)
            throw Error(d->dir() + ": the " + to_string(d->split()) + " split has " +
                        std::to_string(d->size()) + " tokens, fewer than one sequence of " +
                        std::to_string(seq_len_ + 1));
    }
    const std::string& tok_file = train_data_->meta().tokenizer_file;
    const fs::path tok = fs::path(options_.data_dir) / tok_file;
    tokenizer_path_ = !tok_file.empty() && fs::is_regular_file(tok) ? tok.string() : std::string();
}

std::unique_ptr<Trainer> Trainer::start(const ModelConfig& config, const TrainOptions& options,
                                        const std::string& run_dir, uint64_t init_seed,
                                        Backend& backend, DataParallel dp) {
    validate_train_options(options, config);
    check_run_memory(config, options, backend);
    const bool root = !dp.comm || dp.comm->rank() == 0;
    return filesystem_errors_as_errors([&] {
        const std::string refusal = run_dir +
                                    ": exists and is not empty (continue a run with --resume " +
                                    run_dir + ", or choose another --out)";
        // A lock file alone is what a start that failed after creating the directory leaves.
        const auto holds_more_than_a_lock = [&] {
            for (const auto& entry : fs::directory_iterator(run_dir))
                if (entry.path().filename() != kLockFile) return true;
            return false;
        };
        if (root && fs::exists(run_dir) && !fs::is_directory(run_dir))
            throw Error("--out " + run_dir + ": exists and is not a directory");
        if (root && fs::exists(run_dir) && holds_more_than_a_lock()) throw Error(refusal);
        // Every rank makes the same weights from the seed: nothing to broadcast.
        auto model = std::make_unique<Model>(config, backend);
        model->init_random(init_seed);
        std::unique_ptr<Trainer> t(new Trainer(std::move(model), options, run_dir, backend, dp));
        t->open_data();
        if (!root) return t;  // rank 0 alone writes the run directory
        std::error_code ec;
        fs::create_directories(run_dir, ec);
        if (ec)
            throw Error("--out " + run_dir + ": cannot create the run directory: " + ec.message());
        t->lock_ = std::make_unique<RunDirLock>(run_dir);
        if (holds_more_than_a_lock()) throw Error(refusal);  // taken since the check above
        write_file_atomic((fs::path(run_dir) / kMetricsFile).string(), "");
        return t;
    });
}

std::unique_ptr<Trainer> Trainer::resume(const std::string& path, Backend& backend,
                                         const json& overrides, DataParallel dp) {
    const bool root = !dp.comm || dp.comm->rank() == 0;
    return filesystem_errors_as_errors([&] {
        // Lock before reading: the run's holder may be writing the checkpoint. Resolve again
        // under the lock, since a holder that just ended may have written a newer one. The
        // other ranks read the checkpoint rank 0 chose, once it holds the lock.
        std::unique_ptr<RunDirLock> lock;
        std::string ckpt;
        if (root) {
            const std::string dir = parent_or_dot(resolve_run_checkpoint(path)).string();
            lock = std::make_unique<RunDirLock>(dir);
            remove_leftovers(dir);
            ckpt = resolve_run_checkpoint(path);
        }
        if (dp.comm) dp.comm->broadcast(ckpt, 0);
        const std::string run_dir = parent_or_dot(ckpt).string();
        const std::string state_path = (fs::path(ckpt) / kStateFile).string();
        const json state = read_json_file(state_path);
        json options_json =
            json_fields::Fields(state, state_path).at("options", "an object of training options");
        if (!options_json.is_object())
            json_fields::fail(state_path, "options",
                              "expected an object of training options, got " +
                                  json_fields::describe(options_json));
        for (const auto& [key, value] : overrides.items()) {
            // The run's own value is no change (a run from before "precision" existed is fp32).
            const json current = key == "precision" ? options_json.value(key, json("fp32"))
                                                    : options_json.value(key, json());
            if (value == current) continue;
            if (!resume_may_override(key))
                throw UsageError(option_flag(key) +
                                 " cannot change when resuming (it would change the run's math); "
                                 "the run uses " +
                                 current.dump());
            options_json[key] = value;
        }
        if (overrides.contains("max_steps")) options_json["max_tokens"] = 0;
        if (overrides.contains("max_tokens")) options_json["max_steps"] = 0;
        TrainOptions options = train_options_from_json(options_json, state_path + ": options");
        // A run keeps its precision (above): where this backend lacks it, --precision fp32 is
        // no way out, so say where the run can go on.
        if (!backend.supports_precision(options.precision))
            throw UsageError(state_path + ": the run trains in " + to_string(options.precision) +
                             " matmuls, which the " + backend.name() +
                             " backend has not (CUDA: bf16 needs compute capability 8.0 or "
                             "newer); a run keeps its precision: resume it with --backend cpu "
                             "or on a GPU that has them");
        const ModelConfig config = load_checkpoint_config(ckpt);
        // 8-bit weights lost what training needs; 16-bit ones widen to f32 exactly.
        if (checkpoint_weight_format(ckpt) == DType::Q8_0)
            throw UsageError(ckpt +
                             ": holds q8_0 weights, which cannot be trained: resume from a "
                             "full-precision (f32) checkpoint of the run");
        validate_train_options(options, config);
        check_run_memory(config, options, backend);
        auto model = std::make_unique<Model>(config, backend);
        load_checkpoint_weights(*model, ckpt);
        std::unique_ptr<Trainer> t(new Trainer(std::move(model), options, run_dir, backend, dp));
        t->lock_ = std::move(lock);
        t->open_data();
        t->restore_state(state, state_path);
        t->last_checkpoint_ = ckpt;

        SafetensorsFile opt((fs::path(ckpt) / kOptimizerFile).string());
        const int64_t P = t->model_->num_params();
        std::vector<float> moments[2];
        for (int i = 0; i < 2; ++i) {
            const char* name = i == 0 ? "exp_avg" : "exp_avg_sq";
            auto it = opt.entries().find(name);
            if (it == opt.entries().end() || it->second.shape != Shape{P})
                throw Error(opt.path() + ": missing or mis-shaped optimizer tensor '" + name + "'");
            moments[i].resize(static_cast<size_t>(P));
            opt.read_f32(name, moments[i].data());
            // NaN moments would turn the first step's update, and every weight, into NaN.
            check_finite_tensor(opt.path(), name, {P}, moments[i].data(), "optimizer moments");
        }
        t->moments_from_host(moments[0], moments[1]);
        if (root) t->trim_metrics();
        return t;
    });
}

void Trainer::restore_state(const json& state, const std::string& source) {
    const json_fields::Fields f(state, source);
    step_ = f.integer("step", 0);
    checked_mul(step_, options_.tokens_per_step(seq_len_), source + ": \"step\" x tokens per step");
    has_best_ = state.contains("best_val_loss") && !state["best_val_loss"].is_null();
    if (has_best_) best_val_loss_ = f.number("best_val_loss");
    // The fields below are absent from checkpoints of versions before them: nothing skipped,
    // nothing pending, and reports average the steps after the resume.
    if (f.has("nonfinite_skipped")) nonfinite_skipped_ = f.integer("nonfinite_skipped", 0);
    if (f.has("finish_pending")) finish_pending_ = f.boolean("finish_pending");
    if (f.has("since_report")) {
        const json_fields::Fields w(state["since_report"], source + ": since_report");
        window_.applied = w.integer("applied", 0);
        window_.skipped = w.integer("skipped", 0);
        window_.loss_sum = w.number("loss_sum");
        window_.aux_sum = w.number("aux_sum");
        window_.grad_norm_sum = w.number("grad_norm_sum");
        const char* expected = "an array (per layer) of arrays of integers >= 0";
        const json& slots = w.at("expert_slots", expected);
        auto wrong = [&] {
            json_fields::fail(
                w.source(), "expert_slots",
                std::string("expected ") + expected + ", got " + json_fields::describe(slots));
        };
        if (!slots.is_array()) wrong();
        for (const json& layer : slots) {
            if (!layer.is_array()) wrong();
            window_.expert_slots.emplace_back();
            for (const json& count : layer) {
                if (!count.is_number_unsigned() ||
                    count.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
                    wrong();
                window_.expert_slots.back().push_back(count.get<int64_t>());
            }
        }
    }
}

void Trainer::trim_metrics() {
    const std::string path = (fs::path(run_dir_) / kMetricsFile).string();
    if (!fs::exists(path)) return;  // appending creates it
    const std::string text = read_file(path);
    std::string kept;
    bool dropped = false;
    for (size_t pos = 0; pos < text.size();) {
        const size_t newline = text.find('\n', pos);
        const bool complete = newline != std::string::npos;
        const std::string line = text.substr(pos, complete ? newline - pos : std::string::npos);
        pos = complete ? newline + 1 : text.size();
        const json j = json::parse(line, nullptr, false);
        const bool has_step =
            !j.is_discarded() && j.is_object() && j.contains("step") && j["step"].is_number();
        if (has_step ? j["step"].get<double>() > static_cast<double>(step_) : !complete) {
            dropped = true;  // logged after the checkpoint, or torn by a kill mid-line
            continue;
        }
        kept += line + "\n";  // anything else stays, for tmx plot to report
    }
    if (dropped) write_file_atomic(path, kept);
}

void Trainer::sample_batch(int64_t step, int64_t micro, std::vector<int32_t>& inputs,
                           std::vector<int32_t>& targets) const {
    const int64_t B = options_.batch_size, T = seq_len_;
    inputs.resize(static_cast<size_t>(B * T));
    targets.resize(static_cast<size_t>(B * T));
    std::vector<int32_t> window(static_cast<size_t>(T + 1));
    const uint64_t span = train_data_->size() - static_cast<uint64_t>(T);
    for (int64_t b = 0; b < B; ++b) {
        Rng rng(stream_seed(options_.seed, "batch/" + std::to_string(step) + "/" +
                                               std::to_string(micro) + "/" + std::to_string(b)));
        train_data_->copy_range(rng.below(span), window.size(), window.data());
        std::copy(window.begin(), window.end() - 1, inputs.begin() + b * T);
        std::copy(window.begin() + 1, window.end(), targets.begin() + b * T);
    }
}

int Trainer::rank() const {
    return comm_->rank();
}

int Trainer::ranks() const {
    return comm_->size();
}

template <class F>
void Trainer::timed(F&& collective) {
    const auto start = std::chrono::steady_clock::now();
    collective();
    comm_seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

bool Trainer::stop_requested(const StopPredicate& should_stop) {
    const bool mine = should_stop && should_stop();
    if (ranks() == 1) return mine;
    std::vector<double> any = {mine ? 1.0 : 0.0};
    timed([&] { comm_->all_reduce_sum(any); });
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
        sample_batch(step_, rank() * local_micros + micro, inputs, targets);
        ForwardResult r = m.forward(inputs, options_.batch_size, seq_len_, &targets, true);
        loss += r.loss * micro_scale;
        aux += r.aux * micro_scale;
        if (!std::isfinite(r.loss) || !std::isfinite(r.aux)) {
            (std::isfinite(r.loss) ? bad_aux : bad_loss) += 1.0;
            continue;
        }
        add_slots(slots, r.expert_slots);
        if (micro + 1 < local_micros) m.backward(micro_scale);
    }
    // The step's figures over all ranks: every rank decides alike whether to apply it.
    std::vector<double> figures = {loss, aux, bad_loss, bad_aux};
    const size_t experts = c.is_moe() ? static_cast<size_t>(c.n_experts) : 1;
    for (const auto& layer : slots)
        for (int64_t count : layer) figures.push_back(static_cast<double>(count));
    timed([&] { comm_->all_reduce_sum(figures); });
    loss = figures[0];
    aux = figures[1];
    if (figures[2] > 0 || figures[3] > 0)
        return reject_nonfinite(figures[2] > 0 ? "loss" : "aux loss", loss, aux, std::nullopt);
    for (size_t i = 4; i < figures.size(); ++i)  // counts, exact in a double
        slots[(i - 4) / experts][(i - 4) % experts] = static_cast<int64_t>(figures[i]);
    // Every rank's last micro-batch was finite, so every rank has its backward pass due.
    const bool overlap = bucket_elements_ > 0;
    m.backward(micro_scale, overlap ? start_gradient_sums() : Model::GradsFinal{});
    const double grad_norm = reduce_gradients(overlap);
    if (!std::isfinite(grad_norm)) return reject_nonfinite("gradient norm", loss, aux, grad_norm);
    // Clipping: AdamW reads the gradient scaled by the clip factor (no pass of its own).
    const bool clip = options_.grad_clip > 0 && grad_norm > options_.grad_clip;
    const double lr = learning_rate(options_, step_, max_steps_);
    optimizer_step(
        {.lr = static_cast<float>(lr),
         .beta1 = static_cast<float>(options_.beta1),
         .beta2 = static_cast<float>(options_.beta2),
         .eps = static_cast<float>(options_.eps),
         .weight_decay = static_cast<float>(options_.weight_decay),
         .step = step_ + 1,
         .grad_scale = clip ? static_cast<float>(options_.grad_clip / (grad_norm + 1e-6)) : 1.0f});
    m.params_changed();
    ++step_;
    unsaved_ = true;
    ++window_.applied;
    window_.loss_sum += loss;
    window_.aux_sum += aux;
    window_.grad_norm_sum += grad_norm;
    add_slots(window_.expert_slots, slots);
    return StepOutcome::Applied;
}

Model::GradsFinal Trainer::start_gradient_sums() {
    // [from, unsent) is final and not yet started; the pass reports lower offsets as it goes.
    return [this, unsent = model_->num_params()](int64_t from) mutable {
        const Tensor& grads = model_->grads();
        timed([&] {
            if (unsent - from >= bucket_elements_ || (from == 0 && unsent > 0)) {
                comm_->start_all_reduce_sum(backend_, grads.slice(from, {unsent - from}));
                unsent = from;
            }
            comm_->progress_sums();
        });
    };
}

double Trainer::reduce_gradients(bool started) {
    const Tensor& grads = model_->grads();
    const int64_t N = ranks(), P = model_->num_params();
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
            timed([&] { comm_->finish_sums(); });
        else
            timed([&] { comm_->all_reduce_sum(backend_, grads); });
        for (int64_t r = 0; r < N && part > 0; ++r)
            backend_.sum_squares(grads.slice(r * part, {part}), sq.slice(r, {1}));
        if (tail > 0) backend_.sum_squares(grads.slice(N * part, {tail}), sq.slice(N, {1}));
        download_parts();
    } else {
        const Tensor own = grads.slice(rank() * shard_, {shard_});
        timed([&] { comm_->reduce_scatter_sum(backend_, grads.slice(0, {N * shard_}), own); });
        backend_.sum_squares(own, sq.slice(rank(), {1}));
        if (tail_ > 0) {
            const Tensor tail_grads = grads.slice(N * shard_, {tail_});
            timed([&] { comm_->all_reduce_sum(backend_, tail_grads); });
            // Every rank has the tail: counted once.
            if (is_root()) backend_.sum_squares(tail_grads, sq.slice(N, {1}));
        }
        download_parts();
        // Each part has one contributor and zeros elsewhere: the sum over ranks is exact.
        timed([&] { comm_->all_reduce_sum(parts); });
    }
    double total = 0.0;
    for (double p : parts) total += p;
    return std::sqrt(total);
}

void Trainer::optimizer_step(const Backend::AdamWParams& hp) {
    if (!sharded_) {
        adamw_step(*model_, adam_m_, adam_v_, hp);
        return;
    }
    const int64_t N = ranks();
    adamw_step(*model_, adam_m_.slice(0, {shard_}), adam_v_.slice(0, {shard_}), hp,
               rank() * shard_);
    if (tail_ > 0)
        adamw_step(*model_, adam_m_.slice(shard_, {tail_}), adam_v_.slice(shard_, {tail_}), hp,
                   N * shard_);
    const Tensor& params = model_->params();
    timed([&] {
        comm_->all_gather(backend_, params.slice(rank() * shard_, {shard_}),
                          params.slice(0, {N * shard_}));
    });
}

void Trainer::moments_to_host(std::vector<float>& m, std::vector<float>& v) {
    const int64_t P = model_->num_params();
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
        comm_->all_gather(backend_, moment->slice(0, {shard_}), full);
        if (!is_root()) continue;
        host->resize(static_cast<size_t>(P));
        backend_.download(full, host->data());
        if (tail_ > 0) backend_.download(moment->slice(shard_, {tail_}), host->data() + N * shard_);
    }
}

void Trainer::moments_from_host(const std::vector<float>& m, const std::vector<float>& v) {
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
        if (is_root()) append_metrics(line);
        // The step is consumed (its batch is never used) without touching weights or moments.
        ++nonfinite_skipped_;
        ++window_.skipped;
        ++step_;
        unsaved_ = true;
        return StepOutcome::Skipped;
    }
    const std::string advice =
        options_.skip_nonfinite > 0
            ? "the run has had " + std::to_string(nonfinite_skipped_ + 1) +
                  " non-finite steps, more than --skip-nonfinite " +
                  std::to_string(options_.skip_nonfinite) + " allows"
            : "lower --lr or --grad-clip, or resume with --skip-nonfinite N to skip up to N "
              "such steps";
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
    // Consecutive windows from the start of the validation stream: the same every time. The
    // ranks take turns over its batches (rank r: batches r, r + N, ...), in rounds, so that they
    // agree on a stop between batches; the sums are then added over the ranks.
    const int64_t B = options_.batch_size, T = seq_len_, N = ranks();
    const int64_t available =
        static_cast<int64_t>((val_data_->size() - 1) / static_cast<uint64_t>(T));
    const int64_t windows = std::min(options_.eval_batches * B, available);
    const int64_t batches = (windows + B - 1) / B;
    double total = 0.0, count = 0.0;
    std::vector<int32_t> window(static_cast<size_t>(T + 1)), inputs, targets;
    for (int64_t round = 0; round * N < batches; ++round) {
        if (stop_requested(should_stop)) return std::nullopt;
        const int64_t w0 = (round * N + rank()) * B;
        if (w0 >= windows) continue;
        const int64_t rows = std::min(B, windows - w0);
        inputs.resize(static_cast<size_t>(rows * T));
        targets.resize(static_cast<size_t>(rows * T));
        for (int64_t r = 0; r < rows; ++r) {
            val_data_->copy_range(static_cast<uint64_t>((w0 + r) * T), window.size(),
                                  window.data());
            std::copy(window.begin(), window.end() - 1, inputs.begin() + r * T);
            std::copy(window.begin() + 1, window.end(), targets.begin() + r * T);
        }
        ForwardResult res = model_->forward_loss(inputs, rows, T, targets);
        total += res.loss * static_cast<double>(res.n_targets);
        count += static_cast<double>(res.n_targets);
    }
    std::vector<double> sums = {total, count};
    comm_->all_reduce_sum(sums);
    return sums[0] / sums[1];
}

std::string Trainer::save(bool best) {
    const std::string dir =
        (fs::path(run_dir_) / (best ? std::string(kBestDir) : step_dir_name(step_))).string();
    const int64_t P = model_->num_params();
    std::vector<float> m, v;
    moments_to_host(m, v);  // a collective when sharded: before rank 0 goes its own way
    if (!is_root()) {       // rank 0 alone writes, what every rank holds alike
        if (!best) {
            last_checkpoint_ = dir;
            unsaved_ = false;
        }
        return dir;
    }
    // A checkpoint must be a state worth resuming. A finite loss and gradient do not prove finite
    // weights (an update can overflow), so they are checked here, once per checkpoint.
    const auto refuse_nonfinite = [&](const std::vector<float>& values, const char* what) {
        const std::string tensor = first_nonfinite_tensor(model_->layout(), values);
        if (!tensor.empty())
            throw Error("step " + std::to_string(step_) + ": the " + what + " of " + tensor +
                        " are no longer finite; not writing " + dir + " (" +
                        last_checkpoint_phrase() + "); lower --lr");
    };
    refuse_nonfinite(model_->params_to_host(), "weights");  // a copy freed before the write's own
    refuse_nonfinite(m, "optimizer moments (exp_avg)");
    refuse_nonfinite(v, "optimizer moments (exp_avg_sq)");
    json state = {{"step", step_},
                  {"max_steps", max_steps_},
                  {"tokens", step_ * options_.tokens_per_step(seq_len_)},
                  {"best_val_loss", has_best_ ? json(best_val_loss_) : json(nullptr)},
                  {"nonfinite_skipped", nonfinite_skipped_},
                  {"finish_pending", finish_pending_},
                  {"since_report",
                   {{"applied", window_.applied},
                    {"skipped", window_.skipped},
                    {"loss_sum", window_.loss_sum},
                    {"aux_sum", window_.aux_sum},
                    {"grad_norm_sum", window_.grad_norm_sum},
                    {"expert_slots", window_.expert_slots}}},
                  {"options", train_options_to_json(options_)}};
    CheckpointWriteOptions w;
    w.dtype = StorageType::F32;  // exact resume needs the full-precision weights
    w.tokenizer_path = tokenizer_path_;
    w.overwrite = true;
    w.extra_files[kOptimizerFile] = encode_safetensors(
        {{"exp_avg", {P}, m.data()}, {"exp_avg_sq", {P}, v.data()}}, StorageType::F32);
    w.extra_files[kStateFile] = state.dump(2) + "\n";
    save_checkpoint(*model_, dir, w);
    if (!best) {
        last_checkpoint_ = dir;
        unsaved_ = false;
    }
    return dir;
}

void Trainer::prune_checkpoints() {
    std::vector<std::pair<int64_t, fs::path>> steps;
    for (const auto& entry : fs::directory_iterator(run_dir_))
        if (entry.is_directory() && is_step_dir(entry.path()))
            steps.emplace_back(*step_of_dir_name(entry.path().filename().string()), entry.path());
    std::sort(steps.begin(), steps.end());
    const int64_t excess = static_cast<int64_t>(steps.size()) - options_.keep_last;
    for (int64_t i = 0; i < excess; ++i) fs::remove_all(steps[static_cast<size_t>(i)].second);
}

void Trainer::append_metrics(const json& line) {
    // Written with write(2), not a buffered stream, so that a failure (a full disk) is seen
    // here; a line written in part is cut off again, so the file never holds a torn line.
    const std::string path = (fs::path(run_dir_) / kMetricsFile).string();
    const std::string text = line.dump() + "\n";
    const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        throw MetricsWriteError(path + ": cannot open for appending: " + std::strerror(errno));
    struct stat before {};
    const bool sized = ::fstat(fd, &before) == 0 && S_ISREG(before.st_mode);
    int err = 0;
    for (size_t done = 0; done < text.size() && !err;) {
        const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
        if (n >= 0)
            done += static_cast<size_t>(n);
        else if (errno != EINTR)
            err = errno;
    }
    if (err && sized) (void)!::ftruncate(fd, before.st_size);
    if (::close(fd) != 0 && !err) err = errno;
    if (err) throw MetricsWriteError(path + ": cannot append a line: " + std::strerror(err));
}

std::string Trainer::log_before_error(const json& line) {
    // The error that follows is what the user must see (and no checkpoint may follow it, as a
    // metrics failure would have), so a failure to log only adds to its message.
    if (!is_root()) return "";
    try {
        append_metrics(line);
        return "";
    } catch (const MetricsWriteError& e) {
        return " (and it could not be logged: " + std::string(e.what()) + ")";
    }
}

bool Trainer::finish_step(const StopPredicate& should_stop,
                          const std::function<void(const TrainReport&)>& on_report,
                          TrainReport& report) {
    // Until the end of this function the step's work is pending: a checkpoint written meanwhile
    // (best/, or the one a stop writes) makes a resume do it again.
    finish_pending_ = true;
    const bool last_step = step_ == max_steps_;
    const bool eval_now =
        last_step || (options_.eval_every > 0 && step_ % options_.eval_every == 0);
    const bool ckpt_now =
        last_step || (options_.checkpoint_every > 0 && step_ % options_.checkpoint_every == 0);
    const bool report_now = eval_now || ckpt_now || step_ % options_.log_every == 0;
    report = TrainReport{};
    if (eval_now) {
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
                        last_checkpoint_phrase() + "); lower --lr" + unlogged);
        }
        report.val_loss = *val;
        if (!has_best_ || *val < best_val_loss_) {
            best_val_loss_ = *val;
            has_best_ = true;
            save(/*best=*/true);
        }
    }
    if (report_now) {
        using clock = std::chrono::steady_clock;
        const auto now = clock::now();
        const double dt = std::chrono::duration<double>(now - last_report_time_).count();
        const double elapsed = std::chrono::duration<double>(now - run_start_).count();
        const int64_t timed_steps = step_ - last_report_step_, run_steps = step_ - run_start_step_;
        last_report_time_ = now;
        last_report_step_ = step_;
        const int64_t per_step = options_.tokens_per_step(seq_len_);
        // With every step since the last report skipped, there is no average: NaN, logged as such.
        const double applied = window_.applied ? static_cast<double>(window_.applied) : NAN;
        report.step = step_;
        report.max_steps = max_steps_;
        report.tokens = step_ * per_step;
        report.loss = window_.loss_sum / applied;
        report.aux = window_.aux_sum / applied;
        report.grad_norm = window_.grad_norm_sum / applied;
        report.skipped = window_.skipped;
        report.lr = learning_rate(options_, step_ - 1, max_steps_);
        report.tokens_per_s = static_cast<double>(timed_steps * per_step) / std::max(dt, 1e-9);
        if (ranks() > 1) report.comm_share = std::min(comm_seconds_ / std::max(dt, 1e-9), 1.0);
        comm_seconds_ = 0.0;
        report.elapsed_s = elapsed;
        report.eta_s = run_steps > 0
                           ? elapsed / static_cast<double>(run_steps) *
                                 static_cast<double>(std::max<int64_t>(max_steps_ - step_, 0))
                           : 0.0;
        for (const auto& layer : window_.expert_slots) {
            int64_t total = 0;
            for (int64_t c : layer) total += c;
            std::vector<double> share;
            for (int64_t c : layer) share.push_back(total ? static_cast<double>(c) / total : 0.0);
            report.expert_load.push_back(std::move(share));
        }
        json line = {{"step", report.step},
                     {"tokens", report.tokens},
                     {"loss", metrics_value(report.loss)},
                     {"aux", metrics_value(report.aux)},
                     {"lr", report.lr},
                     {"grad_norm", metrics_value(report.grad_norm)},
                     {"tokens_per_s", report.tokens_per_s},
                     {"elapsed_s", report.elapsed_s},
                     {"expert_load", report.expert_load}};
        if (report.val_loss) line["val_loss"] = *report.val_loss;
        if (report.skipped) line["skipped_steps"] = report.skipped;
        if (report.comm_share) line["comm_share"] = *report.comm_share;
        if (is_root()) append_metrics(line);
        window_ = ReportWindow{};
    }
    finish_pending_ = false;
    unsaved_ = true;
    if (ckpt_now) {
        report.checkpoint = save(false);
        if (is_root()) prune_checkpoints();
    }
    if (report_now && is_root()) on_report(report);
    return true;
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
            outcome = "after writing the checkpoint " + save(false);
            prune_checkpoints();
        } catch (const std::exception& e) {
            outcome =
                "and its checkpoint could not be written either (" + std::string(e.what()) + ")";
        }
    }
    throw Error(std::string(failure.what()) + "; the run stopped at step " + std::to_string(step_) +
                " " + outcome + "; resume with --resume " + run_dir_ + " once it can be written");
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
        if (unsaved_) {
            report.checkpoint = save(false);
            if (is_root()) prune_checkpoints();
        }
        report.step = step_;
        report.max_steps = max_steps_;
        return report;
    });
}

}  // namespace tmx

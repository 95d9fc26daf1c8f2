#include "engine/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "engine/checkpoint.h"
#include "engine/errors.h"
#include "engine/file_io.h"
#include "engine/rng.h"
#include "engine/safetensors.h"

namespace tmx {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kStateFile = "trainer_state.json";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
constexpr const char* kMetricsFile = "metrics.jsonl";
constexpr const char* kBestDir = "best";

// Options that change the run's cadence or budget but not its math: --resume may override them.
const char* const kResumeOverridable[] = {"max_steps",  "max_tokens",       "eval_every",
                                          "eval_batches", "checkpoint_every", "keep_last",
                                          "log_every"};

std::string step_dir_name(int64_t step) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
    return buf;
}

bool is_step_dir(const fs::path& p) {
    const std::string n = p.filename().string();
    return n.rfind("step_", 0) == 0 && fs::exists(p / kStateFile);
}

void check_positive(int64_t v, const char* flag) {
    if (v <= 0) throw UsageError(std::string(flag) + ": must be positive, got " + std::to_string(v));
}

void validate_options(const TrainOptions& o, const ModelConfig& c) {
    if (o.data_dir.empty()) throw UsageError("--data: a token dataset directory is required");
    check_positive(o.batch_size, "--batch-size");
    check_positive(o.grad_accum, "--grad-accum");
    if (o.seq_len < 0 || o.seq_len > c.max_seq_len)
        throw UsageError("--seq-len: must be between 1 and the model's max_seq_len (" +
                         std::to_string(c.max_seq_len) + "), got " + std::to_string(o.seq_len));
    if ((o.max_steps > 0) == (o.max_tokens > 0))
        throw UsageError("give exactly one budget: --max-steps N or --max-tokens N");
    if (!(o.lr > 0)) throw UsageError("--lr: must be positive");
    if (o.min_lr < 0 || o.min_lr > o.lr) throw UsageError("--min-lr: must be between 0 and --lr");
    if (o.warmup_steps < 0) throw UsageError("--warmup-steps: must not be negative");
    if (!(o.beta1 >= 0 && o.beta1 < 1)) throw UsageError("--beta1: must be in [0, 1)");
    if (!(o.beta2 >= 0 && o.beta2 < 1)) throw UsageError("--beta2: must be in [0, 1)");
    if (!(o.eps > 0)) throw UsageError("--eps: must be positive");
    if (o.weight_decay < 0) throw UsageError("--weight-decay: must not be negative");
    if (o.grad_clip < 0) throw UsageError("--grad-clip: must not be negative (0 = off)");
    if (o.eval_every < 0) throw UsageError("--eval-every: must not be negative");
    check_positive(o.eval_batches, "--eval-batches");
    if (o.checkpoint_every < 0) throw UsageError("--checkpoint-every: must not be negative");
    check_positive(o.keep_last, "--keep-last");
    check_positive(o.log_every, "--log-every");
}

}  // namespace

json train_options_to_json(const TrainOptions& o) {
    return {{"data_dir", o.data_dir},       {"val_dir", o.val_dir},
            {"batch_size", o.batch_size},   {"seq_len", o.seq_len},
            {"grad_accum", o.grad_accum},   {"max_steps", o.max_steps},
            {"max_tokens", o.max_tokens},   {"lr", o.lr},
            {"min_lr", o.min_lr},           {"warmup_steps", o.warmup_steps},
            {"beta1", o.beta1},             {"beta2", o.beta2},
            {"eps", o.eps},                 {"weight_decay", o.weight_decay},
            {"grad_clip", o.grad_clip},     {"eval_every", o.eval_every},
            {"eval_batches", o.eval_batches}, {"checkpoint_every", o.checkpoint_every},
            {"keep_last", o.keep_last},     {"log_every", o.log_every},
            {"seed", o.seed}};
}

TrainOptions train_options_from_json(const json& j, const std::string& source) {
    TrainOptions o;
    try {
        o.data_dir = j.at("data_dir").get<std::string>();
        o.val_dir = j.at("val_dir").get<std::string>();
        o.batch_size = j.at("batch_size").get<int64_t>();
        o.seq_len = j.at("seq_len").get<int64_t>();
        o.grad_accum = j.at("grad_accum").get<int64_t>();
        o.max_steps = j.at("max_steps").get<int64_t>();
        o.max_tokens = j.at("max_tokens").get<int64_t>();
        o.lr = j.at("lr").get<double>();
        o.min_lr = j.at("min_lr").get<double>();
        o.warmup_steps = j.at("warmup_steps").get<int64_t>();
        o.beta1 = j.at("beta1").get<double>();
        o.beta2 = j.at("beta2").get<double>();
        o.eps = j.at("eps").get<double>();
        o.weight_decay = j.at("weight_decay").get<double>();
        o.grad_clip = j.at("grad_clip").get<double>();
        o.eval_every = j.at("eval_every").get<int64_t>();
        o.eval_batches = j.at("eval_batches").get<int64_t>();
        o.checkpoint_every = j.at("checkpoint_every").get<int64_t>();
        o.keep_last = j.at("keep_last").get<int64_t>();
        o.log_every = j.at("log_every").get<int64_t>();
        o.seed = j.at("seed").get<uint64_t>();
    } catch (const json::exception& e) {
        throw Error(source + ": bad training options (" + e.what() + ")");
    }
    return o;
}

std::string resolve_run_checkpoint(const std::string& path) {
    const fs::path p(path);
    if (fs::exists(p / kStateFile)) return p.string();
    if (!fs::is_directory(p)) throw Error(path + ": no such run directory or checkpoint");
    fs::path latest;
    for (const auto& entry : fs::directory_iterator(p))
        if (entry.is_directory() && is_step_dir(entry.path()) &&
            (latest.empty() || entry.path().filename() > latest.filename()))
            latest = entry.path();
    if (latest.empty())
        throw Error(path + ": not a training run (no step_* checkpoint with " + kStateFile + ")");
    return latest.string();
}

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
                 Backend& backend)
    : model_(std::move(model)), options_(std::move(options)), run_dir_(std::move(run_dir)),
      backend_(backend) {
    if (!backend_.supports_training())
        throw Error("the " + backend_.name() + " backend runs inference only; backends that train: " +
                    training_backend_list());
    const ModelConfig& c = model_->config();
    seq_len_ = options_.seq_len > 0 ? options_.seq_len : c.max_seq_len;
    const int64_t per_step = options_.tokens_per_step(seq_len_);
    max_steps_ = options_.max_steps > 0 ? options_.max_steps
                                        : (options_.max_tokens + per_step - 1) / per_step;
    const int64_t P = model_->num_params();
    adam_m_ = backend_.alloc({P});
    adam_v_ = backend_.alloc({P});
    backend_.fill(adam_m_, 0.0f);
    backend_.fill(adam_v_, 0.0f);
    std::vector<float> mask(static_cast<size_t>(P), 0.0f);
    for (const auto& s : model_->layout().specs)
        if (s.decay) std::fill(mask.begin() + s.offset, mask.begin() + s.offset + s.numel(), 1.0f);
    decay_mask_ = backend_.alloc({P});
    backend_.upload(decay_mask_, mask.data());
}

void Trainer::open_data() {
    const ModelConfig& c = model_->config();
    train_data_ = open_dataset(options_.data_dir, Split::Train);
    val_data_ = open_dataset(options_.val_dir.empty() ? options_.data_dir : options_.val_dir,
                             Split::Val);
    for (const TokenDataset* d : {&*train_data_, &*val_data_}) {
        if (static_cast<int64_t>(d->vocab_size()) != c.vocab_size)
            throw Error(d->dir() + ": its tokens use a vocabulary of " +
                        std::to_string(d->vocab_size()) + " but the model's vocab_size is " +
                        std::to_string(c.vocab_size) + " (prepare the data with the model's tokenizer)");
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
                                        Backend& backend) {
    validate_options(options, config);
    if (fs::exists(run_dir) && !fs::is_empty(run_dir))
        throw Error(run_dir + ": exists and is not empty (continue a run with --resume " + run_dir +
                    ", or choose another --out)");
    auto model = std::make_unique<Model>(config, backend);
    model->init_random(init_seed);
    std::unique_ptr<Trainer> t(new Trainer(std::move(model), options, run_dir, backend));
    t->open_data();
    fs::create_directories(run_dir);
    write_file_atomic((fs::path(run_dir) / kMetricsFile).string(), "");
    return t;
}

std::unique_ptr<Trainer> Trainer::resume(const std::string& path, Backend& backend,
                                         const json& overrides) {
    const std::string ckpt = resolve_run_checkpoint(path);
    const std::string state_path = (fs::path(ckpt) / kStateFile).string();
    const json state = read_json_file(state_path);
    json options_json = state.at("options");
    for (const auto& [key, value] : overrides.items()) {
        if (std::find(std::begin(kResumeOverridable), std::end(kResumeOverridable), key) ==
            std::end(kResumeOverridable))
            throw UsageError("--" + key + " cannot change when resuming (it would change the run's "
                             "math); the run uses " + options_json.value(key, json()).dump());
        options_json[key] = value;
    }
    if (overrides.contains("max_steps")) options_json["max_tokens"] = 0;
    if (overrides.contains("max_tokens")) options_json["max_steps"] = 0;
    TrainOptions options = train_options_from_json(options_json, state_path);
    auto model = load_model(ckpt, backend);
    validate_options(options, model->config());
    const std::string run_dir = fs::path(ckpt).parent_path().string();
    std::unique_ptr<Trainer> t(new Trainer(std::move(model), options, run_dir, backend));
    t->open_data();
    t->step_ = state.at("step").get<int64_t>();
    t->has_best_ = state.contains("best_val_loss") && !state["best_val_loss"].is_null();
    if (t->has_best_) t->best_val_loss_ = state["best_val_loss"].get<double>();

    SafetensorsFile opt((fs::path(ckpt) / kOptimizerFile).string());
    const int64_t P = t->model_->num_params();
    for (const auto& [name, tensor] : {std::pair{"exp_avg", &t->adam_m_}, {"exp_avg_sq", &t->adam_v_}}) {
        auto it = opt.entries().find(name);
        if (it == opt.entries().end() || it->second.shape != Shape{P})
            throw Error(opt.path() + ": missing or mis-shaped optimizer tensor '" + name + "'");
        std::vector<float> host(static_cast<size_t>(P));
        opt.read_f32(name, host.data());
        backend.upload(*tensor, host.data());
    }
    // Drop metrics the interrupted run logged after this checkpoint: they are recomputed.
    const fs::path metrics = fs::path(run_dir) / kMetricsFile;
    if (fs::exists(metrics)) {
        std::istringstream in(read_file(metrics.string()));
        std::string line, kept;
        while (std::getline(in, line)) {
            if (line.empty()) continue;
            json j = json::parse(line, nullptr, false);
            if (!j.is_discarded() && j.value("step", int64_t{0}) <= t->step_) kept += line + "\n";
        }
        write_file_atomic(metrics.string(), kept);
    }
    return t;
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

void Trainer::train_step(double& loss, double& aux, double& grad_norm,
                         std::vector<std::vector<int64_t>>& expert_slots) {
    Model& m = *model_;
    m.zero_grads();
    std::vector<int32_t> inputs, targets;
    loss = aux = 0.0;
    const float micro_scale = 1.0f / static_cast<float>(options_.grad_accum);
    for (int64_t micro = 0; micro < options_.grad_accum; ++micro) {
        sample_batch(step_, micro, inputs, targets);
        ForwardResult r = m.forward(inputs, options_.batch_size, seq_len_, &targets, true);
        m.backward(micro_scale);
        loss += r.loss * micro_scale;
        aux += r.aux * micro_scale;
        if (expert_slots.empty()) expert_slots.assign(r.expert_slots.size(), {});
        for (size_t l = 0; l < r.expert_slots.size(); ++l) {
            expert_slots[l].resize(r.expert_slots[l].size(), 0);
            for (size_t e = 0; e < r.expert_slots[l].size(); ++e)
                expert_slots[l][e] += r.expert_slots[l][e];
        }
    }
    Tensor sq = backend_.alloc({1});
    backend_.sum_squares(m.grads(), sq);
    float sumsq = 0.0f;
    backend_.download(sq, &sumsq);
    grad_norm = std::sqrt(static_cast<double>(sumsq));
    if (options_.grad_clip > 0 && grad_norm > options_.grad_clip)
        backend_.scale(m.grads(), static_cast<float>(options_.grad_clip / (grad_norm + 1e-6)));
    const double lr = learning_rate(options_, step_, max_steps_);
    backend_.adamw(m.params(), m.grads(), adam_m_, adam_v_, decay_mask_,
                   {.lr = static_cast<float>(lr),
                    .beta1 = static_cast<float>(options_.beta1),
                    .beta2 = static_cast<float>(options_.beta2),
                    .eps = static_cast<float>(options_.eps),
                    .weight_decay = static_cast<float>(options_.weight_decay),
                    .step = step_ + 1});
    ++step_;
}

double Trainer::evaluate() {
    // Consecutive windows from the start of the validation stream: the same every time.
    const int64_t B = options_.batch_size, T = seq_len_;
    const int64_t available = static_cast<int64_t>((val_data_->size() - 1) / static_cast<uint64_t>(T));
    const int64_t windows = std::min(options_.eval_batches * B, available);
    double total = 0.0;
    int64_t count = 0;
    std::vector<int32_t> window(static_cast<size_t>(T + 1)), inputs, targets;
    for (int64_t w0 = 0; w0 < windows; w0 += B) {
        const int64_t rows = std::min(B, windows - w0);
        inputs.resize(static_cast<size_t>(rows * T));
        targets.resize(static_cast<size_t>(rows * T));
        for (int64_t r = 0; r < rows; ++r) {
            val_data_->copy_range(static_cast<uint64_t>((w0 + r) * T), window.size(), window.data());
            std::copy(window.begin(), window.end() - 1, inputs.begin() + r * T);
            std::copy(window.begin() + 1, window.end(), targets.begin() + r * T);
        }
        ForwardResult res = model_->forward(inputs, rows, T, &targets);
        total += res.loss * static_cast<double>(res.n_targets);
        count += res.n_targets;
    }
    return total / static_cast<double>(count);
}

std::string Trainer::save(bool best) {
    const int64_t P = model_->num_params();
    std::vector<float> m(static_cast<size_t>(P)), v(static_cast<size_t>(P));
    backend_.download(adam_m_, m.data());
    backend_.download(adam_v_, v.data());
    json state = {{"step", step_},
                  {"max_steps", max_steps_},
                  {"tokens", step_ * options_.tokens_per_step(seq_len_)},
                  {"best_val_loss", has_best_ ? json(best_val_loss_) : json(nullptr)},
                  {"options", train_options_to_json(options_)}};
    CheckpointWriteOptions w;
    w.dtype = StorageType::F32;  // exact resume needs the full-precision weights
    w.tokenizer_path = tokenizer_path_;
    w.overwrite = true;
    w.extra_files[kOptimizerFile] =
        encode_safetensors({{"exp_avg", {P}, m.data()}, {"exp_avg_sq", {P}, v.data()}},
                           StorageType::F32);
    w.extra_files[kStateFile] = state.dump(2) + "\n";
    const std::string dir =
        (fs::path(run_dir_) / (best ? std::string(kBestDir) : step_dir_name(step_))).string();
    save_checkpoint(*model_, dir, w);
    return dir;
}

void Trainer::prune_checkpoints() {
    std::vector<fs::path> steps;
    for (const auto& entry : fs::directory_iterator(run_dir_))
        if (entry.is_directory() && is_step_dir(entry.path())) steps.push_back(entry.path());
    std::sort(steps.begin(), steps.end());
    const int64_t excess = static_cast<int64_t>(steps.size()) - options_.keep_last;
    for (int64_t i = 0; i < excess; ++i) fs::remove_all(steps[static_cast<size_t>(i)]);
}

void Trainer::append_metrics(const json& line) {
    std::ofstream out(fs::path(run_dir_) / kMetricsFile, std::ios::app);
    out << line.dump() << "\n";
    if (!out) throw Error(run_dir_ + "/" + kMetricsFile + ": write failed");
}

TrainReport Trainer::run(const std::function<void(const TrainReport&)>& on_report,
                         const std::atomic<bool>* stop) {
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    auto last = start;
    double loss_sum = 0, aux_sum = 0, norm_sum = 0;
    int64_t steps_since = 0;
    std::vector<std::vector<int64_t>> slots;
    TrainReport report;
    bool saved_at_step = false;
    const int64_t start_step = step_;
    while (step_ < max_steps_ && !(stop && stop->load())) {
        const double lr = learning_rate(options_, step_, max_steps_);
        double loss, aux, norm;
        train_step(loss, aux, norm, slots);
        loss_sum += loss;
        aux_sum += aux;
        norm_sum += norm;
        ++steps_since;
        saved_at_step = false;

        const bool last_step = step_ == max_steps_;
        const bool eval_now =
            last_step || (options_.eval_every > 0 && step_ % options_.eval_every == 0);
        const bool ckpt_now =
            last_step || (options_.checkpoint_every > 0 && step_ % options_.checkpoint_every == 0);
        const bool report_now = eval_now || ckpt_now || step_ % options_.log_every == 0;
        report = TrainReport{};
        if (eval_now) {
            report.val_loss = evaluate();
            if (!has_best_ || *report.val_loss < best_val_loss_) {
                best_val_loss_ = *report.val_loss;
                has_best_ = true;
                save(/*best=*/true);
            }
        }
        if (ckpt_now) {
            report.checkpoint = save(false);
            prune_checkpoints();
            saved_at_step = true;
        }
        if (!report_now) continue;
        const auto now = clock::now();
        const double dt = std::chrono::duration<double>(now - last).count();
        const double elapsed = std::chrono::duration<double>(now - start).count();
        last = now;
        report.step = step_;
        report.max_steps = max_steps_;
        report.tokens = step_ * options_.tokens_per_step(seq_len_);
        report.loss = loss_sum / static_cast<double>(steps_since);
        report.aux = aux_sum / static_cast<double>(steps_since);
        report.grad_norm = norm_sum / static_cast<double>(steps_since);
        report.lr = lr;
        report.tokens_per_s =
            static_cast<double>(steps_since * options_.tokens_per_step(seq_len_)) / std::max(dt, 1e-9);
        report.elapsed_s = elapsed;
        report.eta_s = elapsed / static_cast<double>(step_ - start_step) *
                       static_cast<double>(max_steps_ - step_);
        for (const auto& layer : slots) {
            int64_t total = 0;
            for (int64_t c : layer) total += c;
            std::vector<double> share;
            for (int64_t c : layer) share.push_back(total ? static_cast<double>(c) / total : 0.0);
            report.expert_load.push_back(std::move(share));
        }
        json line = {{"step", report.step},           {"tokens", report.tokens},
                     {"loss", report.loss},           {"aux", report.aux},
                     {"lr", report.lr},               {"grad_norm", report.grad_norm},
                     {"tokens_per_s", report.tokens_per_s}, {"elapsed_s", report.elapsed_s},
                     {"expert_load", report.expert_load}};
        if (report.val_loss) line["val_loss"] = *report.val_loss;
        append_metrics(line);
        on_report(report);
        loss_sum = aux_sum = norm_sum = 0;
        steps_since = 0;
        slots.clear();
    }
    if (!saved_at_step && step_ > start_step) {
        report.checkpoint = save(false);
        prune_checkpoints();
    }
    report.step = step_;
    report.max_steps = max_steps_;
    return report;
}

}  // namespace tmx

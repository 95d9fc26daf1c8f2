#include "engine/train/run_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "engine/core/checked_math.h"
#include "engine/core/file_io.h"
#include "engine/core/json_fields.h"
#include "engine/model/checkpoint.h"
#include "engine/model/safetensors.h"

namespace tmx {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// A lock file alone is what a start that failed after creating the directory leaves.
bool holds_more_than_a_lock(const std::string& run_dir) {
    for (const auto& entry : fs::directory_iterator(run_dir))
        if (entry.path().filename() != kLockFile) return true;
    return false;
}

OptionText existing_run_refusal(const std::string& run_dir) {
    return run_dir + ": exists and is not empty (continue a run with " + opt("resume") + " " +
           run_dir + ", or choose another " + opt("out") + ")";
}

// The first tensor of `layout` with a value that is not finite in the flat `values`, or "".
std::string first_nonfinite_tensor(const ParamLayout& layout, const std::vector<float>& values) {
    for (const auto& s : layout.specs)
        for (int64_t i = s.offset; i < s.offset + s.numel(); ++i)
            if (!std::isfinite(values[static_cast<size_t>(i)])) return s.name;
    return "";
}

}  // namespace

void refuse_existing_run(const std::string& run_dir) {
    if (!fs::exists(run_dir)) return;
    if (!fs::is_directory(run_dir))
        throw Error(opt("out") + " " + run_dir + ": exists and is not a directory");
    if (holds_more_than_a_lock(run_dir)) throw Error(existing_run_refusal(run_dir));
}

std::unique_ptr<RunDirLock> create_run_dir(const std::string& run_dir) {
    std::error_code ec;
    fs::create_directories(run_dir, ec);
    if (ec)
        throw Error(opt("out") + " " + run_dir +
                    ": cannot create the run directory: " + ec.message());
    auto lock = std::make_unique<RunDirLock>(run_dir);
    // Taken since refuse_existing_run looked.
    if (holds_more_than_a_lock(run_dir)) throw Error(existing_run_refusal(run_dir));
    write_file_atomic((fs::path(run_dir) / kMetricsFile).string(), "");
    return lock;
}

std::unique_ptr<RunDirLock> lock_run(const std::string& path, std::string& checkpoint) {
    // Lock before reading: the run's holder may be writing the checkpoint.
    const std::string dir = parent_or_dot(resolve_run_checkpoint(path)).string();
    auto lock = std::make_unique<RunDirLock>(dir);
    remove_leftovers(dir);
    checkpoint = resolve_run_checkpoint(path);
    return lock;
}

TrainOptions resumed_options(const json& state, const std::string& state_path,
                             const json& overrides) {
    json options_json =
        json_fields::Fields(state, state_path).at("options", "an object of training options");
    if (!options_json.is_object())
        json_fields::fail(
            state_path, "options",
            "expected an object of training options, got " + json_fields::describe(options_json));
    for (const auto& [key, value] : overrides.items()) {
        // The run's own value is no change (a run from before "precision" existed is fp32).
        const json current = key == "precision" ? options_json.value(key, json("fp32"))
                                                : options_json.value(key, json());
        if (value == current) continue;
        if (!resume_may_override(key))
            throw UsageError(opt(key) +
                             " cannot change when resuming (it would change the run's math); "
                             "the run uses " +
                             current.dump());
        options_json[key] = value;
    }
    if (overrides.contains("max_steps")) options_json["max_tokens"] = 0;
    if (overrides.contains("max_tokens")) options_json["max_steps"] = 0;
    return train_options_from_json(options_json, state_path + ": options");
}

ModelConfig check_resumable(const std::string& checkpoint, const TrainOptions& options,
                            const Backend& backend) {
    // A run keeps its precision: where this backend lacks it, --precision fp32 is no way out,
    // so say where the run can go on.
    if (!backend.supports_precision(options.precision))
        throw UsageError((fs::path(checkpoint) / kStateFile).string() + ": the run trains in " +
                         to_string(options.precision) + " matmuls, which the " + backend.name() +
                         " backend has not (CUDA: bf16 needs compute capability 8.0 or "
                         "newer); a run keeps its precision: resume it with " +
                         opt("backend") + " cpu or on a GPU that has them");
    ModelConfig config = load_checkpoint_config(checkpoint);
    // 8-bit weights lost what training needs; 16-bit ones widen to f32 exactly.
    if (checkpoint_weight_format(checkpoint) == DType::Q8_0)
        throw UsageError(checkpoint +
                         ": holds q8_0 weights, which cannot be trained: resume from a "
                         "full-precision (f32) checkpoint of the run");
    return config;
}

void read_optimizer_moments(const std::string& checkpoint, int64_t num_params,
                            std::vector<float>& m, std::vector<float>& v) {
    SafetensorsFile opt((fs::path(checkpoint) / kOptimizerFile).string());
    const int64_t P = num_params;
    for (auto [name, moment] : {std::pair{"exp_avg", &m}, {"exp_avg_sq", &v}}) {
        auto it = opt.entries().find(name);
        if (it == opt.entries().end() || it->second.shape != Shape{P})
            throw Error(opt.path() + ": missing or mis-shaped optimizer tensor '" + name + "'");
        moment->resize(static_cast<size_t>(P));
        opt.read_f32(name, moment->data());
        // NaN moments would turn the first step's update, and every weight, into NaN.
        check_finite_tensor(opt.path(), name, {P}, moment->data(), "optimizer moments");
    }
}

std::optional<std::string> recorded_backend(const std::string& path) {
    return filesystem_errors_as_errors([&]() -> std::optional<std::string> {
        const json state =
            read_json_file((fs::path(resolve_run_checkpoint(path)) / kStateFile).string());
        if (!state.is_object() || !state.contains("options") || !state["options"].is_object())
            return std::nullopt;
        const json& options = state["options"];
        if (!options.contains("backend") || !options["backend"].is_string()) return std::nullopt;
        return options["backend"].get<std::string>();
    });
}

RunState read_run_state(const json& state, const std::string& source, int64_t tokens_per_step) {
    const json_fields::Fields f(state, source);
    RunState r;
    r.step = f.integer("step", 0);
    r.tokens = checked_mul(r.step, tokens_per_step, source + ": \"step\" x tokens per step");
    if (state.contains("best_val_loss") && !state["best_val_loss"].is_null())
        r.best_val_loss = f.number("best_val_loss");
    // The fields below are absent from checkpoints of versions before them: nothing skipped,
    // nothing pending, and reports average the steps after the resume.
    if (f.has("nonfinite_skipped")) r.nonfinite_skipped = f.integer("nonfinite_skipped", 0);
    if (f.has("finish_pending")) r.finish_pending = f.boolean("finish_pending");
    if (f.has("since_report")) {
        ReportWindow& window = r.since_report;
        const json_fields::Fields w(state["since_report"], source + ": since_report");
        window.applied = w.integer("applied", 0);
        window.skipped = w.integer("skipped", 0);
        window.loss_sum = w.number("loss_sum");
        window.aux_sum = w.number("aux_sum");
        window.grad_norm_sum = w.number("grad_norm_sum");
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
            window.expert_slots.emplace_back();
            for (const json& count : layer) {
                if (!count.is_number_unsigned() ||
                    count.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
                    wrong();
                window.expert_slots.back().push_back(count.get<int64_t>());
            }
        }
    }
    return r;
}

void trim_metrics(const std::string& run_dir, int64_t step) {
    const std::string path = (fs::path(run_dir) / kMetricsFile).string();
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
        if (has_step ? j["step"].get<double>() > static_cast<double>(step) : !complete) {
            dropped = true;  // logged after the checkpoint, or torn by a kill mid-line
            continue;
        }
        kept += line + "\n";  // anything else stays, for tmx plot to report
    }
    if (dropped) write_file_atomic(path, kept);
}

void write_run_checkpoint(const Model& model, const std::string& dir, const RunCheckpoint& c,
                          const std::string& last_checkpoint_phrase) {
    const int64_t P = model.num_params();
    const RunState& st = c.state;
    const ReportWindow& window = st.since_report;
    // A checkpoint must be a state worth resuming. A finite loss and gradient do not prove finite
    // weights (an update can overflow), so they are checked here, once per checkpoint.
    const auto refuse_nonfinite = [&](const std::vector<float>& values, const char* what) {
        const std::string tensor = first_nonfinite_tensor(model.layout(), values);
        if (!tensor.empty())
            throw Error("step " + std::to_string(st.step) + ": the " + what + " of " + tensor +
                        " are no longer finite; not writing " + dir + " (" +
                        last_checkpoint_phrase + "); lower " + opt("lr"));
    };
    refuse_nonfinite(model.params_to_host(), "weights");  // a copy freed before the write's own
    refuse_nonfinite(c.m, "optimizer moments (exp_avg)");
    refuse_nonfinite(c.v, "optimizer moments (exp_avg_sq)");
    json state = {{"step", st.step},
                  {"max_steps", st.max_steps},
                  {"tokens", st.tokens},
                  {"best_val_loss", st.best_val_loss ? json(*st.best_val_loss) : json(nullptr)},
                  {"nonfinite_skipped", st.nonfinite_skipped},
                  {"finish_pending", st.finish_pending},
                  {"since_report",
                   {{"applied", window.applied},
                    {"skipped", window.skipped},
                    {"loss_sum", window.loss_sum},
                    {"aux_sum", window.aux_sum},
                    {"grad_norm_sum", window.grad_norm_sum},
                    {"expert_slots", window.expert_slots}}},
                  {"options", train_options_to_json(c.options)}};
    CheckpointWriteOptions w;
    w.dtype = StorageType::F32;  // exact resume needs the full-precision weights
    w.tokenizer_path = c.tokenizer_path;
    w.overwrite = true;
    w.extra_files[kOptimizerFile] = encode_safetensors(
        {{"exp_avg", {P}, c.m.data()}, {"exp_avg_sq", {P}, c.v.data()}}, StorageType::F32);
    w.extra_files[kStateFile] = state.dump(2) + "\n";
    save_checkpoint(model, dir, w);
}

void prune_step_checkpoints(const std::string& run_dir, int64_t keep_last) {
    std::vector<std::pair<int64_t, fs::path>> steps;
    for (const auto& entry : fs::directory_iterator(run_dir))
        if (entry.is_directory() && is_step_dir(entry.path()))
            steps.emplace_back(*step_of_dir_name(entry.path().filename().string()), entry.path());
    std::sort(steps.begin(), steps.end());
    const int64_t excess = static_cast<int64_t>(steps.size()) - keep_last;
    for (int64_t i = 0; i < excess; ++i) fs::remove_all(steps[static_cast<size_t>(i)].second);
}

void append_metrics(const std::string& run_dir, const json& line) {
    // Written with write(2), not a buffered stream, so that a failure (a full disk) is seen
    // here; a line written in part is cut off again, so the file never holds a torn line.
    const std::string path = (fs::path(run_dir) / kMetricsFile).string();
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

std::string append_metrics_before_error(const std::string& run_dir, const json& line) {
    // The error that follows is what the user must see (and no checkpoint may follow it, as a
    // metrics failure would have), so a failure to log only adds to its message.
    try {
        append_metrics(run_dir, line);
        return "";
    } catch (const MetricsWriteError& e) {
        return " (and it could not be logged: " + std::string(e.what()) + ")";
    }
}

}  // namespace tmx

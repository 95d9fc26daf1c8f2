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
#include "engine/train/trainer.h"

namespace tmx {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The first tensor of `layout` with a value that is not finite in the flat `values`, or "".
std::string first_nonfinite_tensor(const ParamLayout& layout, const std::vector<float>& values) {
    for (const auto& s : layout.specs)
        for (int64_t i = s.offset; i < s.offset + s.numel(); ++i)
            if (!std::isfinite(values[static_cast<size_t>(i)])) return s.name;
    return "";
}

}  // namespace

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

}  // namespace tmx

// A progress report: what it says (TrainReport, also the metrics.jsonl line it logs) and the
// steps since the last one that it sums up (ReportWindow, which checkpoints carry).
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

namespace tmx {

// One progress report (every log_every steps, after evaluations and at the end).
struct TrainReport {
    int64_t step = 0, max_steps = 0;
    int64_t tokens = 0;              // training tokens consumed so far
    double loss = 0.0, aux = 0.0;    // mean over the steps since the last report
    std::optional<double> val_loss;  // when this step evaluated
    double lr = 0.0, grad_norm = 0.0;
    double tokens_per_s = 0.0, eta_s = 0.0, elapsed_s = 0.0;  // tokens of all ranks
    // Under data parallelism: the share of the time since the last report this rank spent in
    // collectives, as the host sees it (waiting for slower ranks included; MPI's collectives
    // block, NCCL's are only enqueued and show up in the next read from the device).
    std::optional<double> comm_share;
    // Per layer, the share of routed (token, choice) slots each expert received since the last
    // report (MoE models).
    std::vector<std::vector<double>> expert_load;
    int64_t skipped = 0;     // non-finite steps skipped since the last report
    std::string checkpoint;  // a checkpoint written at this step, if any
};

// The steps since the last progress report: what its averages are made of. Saved in
// checkpoints, so that the first report after a resume averages the same steps as in the
// uninterrupted run.
struct ReportWindow {
    int64_t applied = 0, skipped = 0;
    double loss_sum = 0.0, aux_sum = 0.0, grad_norm_sum = 0.0;
    std::vector<std::vector<int64_t>> expert_slots;

    // An applied step: its loss, aux loss and gradient norm, and its slots per layer and expert.
    void add_applied(double loss, double aux, double grad_norm,
                     const std::vector<std::vector<int64_t>>& slots);
};

// Adds slot counts per layer and expert to `total`, which grows to fit.
void add_expert_slots(std::vector<std::vector<int64_t>>& total,
                      const std::vector<std::vector<int64_t>>& add);
// The report's figures of the steps in `window`: the means over the applied ones (NaN when every
// step was skipped: there is no mean, and it is logged as such), the skipped ones, and each
// layer's expert load.
void summarize_window(const ReportWindow& window, TrainReport& report);
// The report's metrics.jsonl line (a non-finite figure as metrics_plot.h writes it).
nlohmann::json metrics_line(const TrainReport& report);

}  // namespace tmx

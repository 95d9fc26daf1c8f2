#pragma once

#include <cstdint>
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
};

}  // namespace tmx

#include "engine/train/train_report.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "engine/train/metrics_plot.h"

namespace tmx {

void add_expert_slots(std::vector<std::vector<int64_t>>& total,
                      const std::vector<std::vector<int64_t>>& add) {
    if (total.size() < add.size()) total.resize(add.size());
    for (size_t l = 0; l < add.size(); ++l) {
        if (total[l].size() < add[l].size()) total[l].resize(add[l].size(), 0);
        for (size_t e = 0; e < add[l].size(); ++e) total[l][e] += add[l][e];
    }
}

void ReportWindow::add_applied(double loss, double aux, double grad_norm,
                               const std::vector<std::vector<int64_t>>& slots) {
    ++applied;
    loss_sum += loss;
    aux_sum += aux;
    grad_norm_sum += grad_norm;
    add_expert_slots(expert_slots, slots);
}

void summarize_window(const ReportWindow& window, TrainReport& report) {
    // With every step since the last report skipped, there is no average: NaN, logged as such.
    const double applied = window.applied ? static_cast<double>(window.applied) : NAN;
    report.loss = window.loss_sum / applied;
    report.aux = window.aux_sum / applied;
    report.grad_norm = window.grad_norm_sum / applied;
    report.skipped = window.skipped;
    report.expert_load.clear();
    for (const auto& layer : window.expert_slots) {
        int64_t total = 0;
        for (int64_t c : layer) total += c;
        std::vector<double> share;
        for (int64_t c : layer) share.push_back(total ? static_cast<double>(c) / total : 0.0);
        report.expert_load.push_back(std::move(share));
    }
}

nlohmann::json metrics_line(const TrainReport& report) {
    nlohmann::json line = {{"step", report.step},
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
    return line;
}

}  // namespace tmx

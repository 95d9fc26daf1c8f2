// Renders a training run's metrics.jsonl as an SVG a browser opens: the training and
// validation loss, the learning rate, and the expert load per layer (last logged step).
// Also the one rule of the file's format that JSON does not give: how non-finite numbers are
// written.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>

namespace tmx {

// A metric as metrics.jsonl stores it: a JSON number, or for a non-finite value (a diverged
// step's loss) the string "NaN", "Infinity" or "-Infinity", since JSON has no such numbers.
nlohmann::json metrics_value(double v);

// The value of such a field: the number, or nullopt for a non-finite value or null. Throws
// tmx::Error naming `where` and the field for anything else.
std::optional<double> read_metrics_value(const nlohmann::json& v, const std::string& where,
                                         const std::string& field);

// `metrics_jsonl` is the file's text; `title` heads the figure. Steps with a non-finite loss
// are marked on the loss chart. Throws tmx::Error naming `source`, the line and the field when
// a line is not a JSON object or a field has the wrong type, and when there is no line.
std::string render_metrics_svg(const std::string& metrics_jsonl, const std::string& title,
                               const std::string& source);

}  // namespace tmx

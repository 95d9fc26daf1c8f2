// Renders a training run's metrics.jsonl as an SVG a browser opens: the training and
// validation loss, the learning rate, and the expert load per layer (last logged step).
#pragma once

#include <string>

namespace tmx {

// `metrics_jsonl` is the file's text; `title` heads the figure. Throws tmx::Error naming
// `source` when a line is not JSON or no line has a loss.
std::string render_metrics_svg(const std::string& metrics_jsonl, const std::string& title,
                               const std::string& source);

}  // namespace tmx

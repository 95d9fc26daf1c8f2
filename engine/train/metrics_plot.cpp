#include "engine/train/metrics_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <vector>

#include "engine/core/errors.h"

namespace tmx {
namespace {

struct Series {
    std::string name, color;
    std::vector<std::pair<double, double>> points;  // (step, value)
};

std::string fmt(const char* f, double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, f, v);
    return buf;
}

std::string escape(const std::string& s) {
    std::string out;
    for (char c : s) {
        if (c == '<')
            out += "&lt;";
        else if (c == '>')
            out += "&gt;";
        else if (c == '&')
            out += "&amp;";
        else
            out += c;
    }
    return out;
}

// A line chart in the box (x, y, w, h) with axes, 5 ticks each way and a legend; `nonfinite`
// marks the steps whose values were not finite with dashed lines.
void line_chart(std::ostringstream& svg, double x, double y, double w, double h,
                const std::string& title, const std::vector<Series>& series, bool log_y = false,
                const std::vector<double>& nonfinite = {}) {
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
    for (const auto& s : series)
        for (auto [px, py] : s.points) {
            if (log_y && py <= 0) continue;
            const double v = log_y ? std::log10(py) : py;
            x0 = std::min(x0, px), x1 = std::max(x1, px), y0 = std::min(y0, v),
            y1 = std::max(y1, v);
        }
    for (double step : nonfinite) x0 = std::min(x0, step), x1 = std::max(x1, step);
    if (!(y0 <= y1)) y0 = 0, y1 = 1;  // only non-finite values: an empty scale
    svg << "<text x='" << x << "' y='" << y - 8 << "' font-size='14' font-weight='bold'>"
        << escape(title) << "</text>\n";
    svg << "<rect x='" << x << "' y='" << y << "' width='" << w << "' height='" << h
        << "' fill='none' stroke='#888'/>\n";
    if (!(x0 <= x1)) return;
    if (x1 == x0) x1 = x0 + 1;
    if (y1 == y0) y1 = y0 + 1e-9 + std::abs(y0) * 0.05, y0 -= std::abs(y0) * 0.05;
    const double pad = (y1 - y0) * 0.05;
    y0 -= pad, y1 += pad;
    auto X = [&](double v) { return x + (v - x0) / (x1 - x0) * w; };
    auto Y = [&](double v) { return y + h - ((log_y ? std::log10(v) : v) - y0) / (y1 - y0) * h; };
    for (int i = 0; i <= 4; ++i) {
        const double xv = x0 + (x1 - x0) * i / 4, yv = y0 + (y1 - y0) * i / 4;
        const double yr = log_y ? std::pow(10.0, yv) : yv;
        svg << "<text x='" << X(xv) << "' y='" << y + h + 14
            << "' font-size='10' text-anchor='middle'>" << fmt("%.0f", xv) << "</text>\n";
        svg << "<line x1='" << x << "' x2='" << x + w << "' y1='" << Y(yr) << "' y2='" << Y(yr)
            << "' stroke='#eee'/>\n";
        svg << "<text x='" << x - 4 << "' y='" << Y(yr) + 3 << "' font-size='10' text-anchor='end'>"
            << fmt(log_y ? "%.1e" : "%.3g", yr) << "</text>\n";
    }
    svg << "<text x='" << x + w / 2 << "' y='" << y + h + 28
        << "' font-size='11' text-anchor='middle'>step</text>\n";
    double ly = y + 14;
    for (double step : nonfinite)
        svg << "<line x1='" << X(step) << "' x2='" << X(step) << "' y1='" << y << "' y2='" << y + h
            << "' stroke='#ff7f0e' stroke-dasharray='4,3'/>\n";
    if (!nonfinite.empty()) {
        svg << "<text x='" << x + w - 6 << "' y='" << ly << "' font-size='11' text-anchor='end' "
            << "fill='#ff7f0e'>non-finite (" << nonfinite.size() << ")</text>\n";
        ly += 14;
    }
    for (const auto& s : series) {
        svg << "<polyline fill='none' stroke='" << s.color << "' stroke-width='1.5' points='";
        for (auto [px, py] : s.points)
            if (!log_y || py > 0) svg << X(px) << "," << Y(py) << " ";
        svg << "'/>\n";
        if (s.points.size() < 30)
            for (auto [px, py] : s.points)
                svg << "<circle cx='" << X(px) << "' cy='" << Y(py) << "' r='2.5' fill='" << s.color
                    << "'/>\n";
        svg << "<text x='" << x + w - 6 << "' y='" << ly
            << "' font-size='11' text-anchor='end' fill='" << s.color << "'>" << escape(s.name)
            << "</text>\n";
        ly += 14;
    }
}

// A metrics.jsonl line's "expert_load": per layer, each expert's share; rows of one length.
nlohmann::json read_expert_load(const nlohmann::json& v, const std::string& where) {
    const auto wrong = [&] {
        throw Error(where +
                    ": field 'expert_load': expected an array (per layer) of arrays of "
                    "numbers, one per expert, as long as each other");
    };
    if (!v.is_array()) wrong();
    for (const auto& layer : v) {
        if (!layer.is_array() || layer.size() != v[0].size()) wrong();
        for (const auto& share : layer)
            if (!share.is_number() || !std::isfinite(share.get<double>())) wrong();
    }
    return v;
}

constexpr const char* kNaN = "NaN";
constexpr const char* kInfinity = "Infinity";
constexpr const char* kMinusInfinity = "-Infinity";

}  // namespace

nlohmann::json metrics_value(double v) {
    if (std::isnan(v)) return kNaN;
    if (std::isinf(v)) return v > 0 ? kInfinity : kMinusInfinity;
    return v;
}

std::optional<double> read_metrics_value(const nlohmann::json& v, const std::string& where,
                                         const std::string& field) {
    if (v.is_number()) return v.get<double>();
    if (v.is_null()) return std::nullopt;
    if (v.is_string()) {
        const std::string& s = v.get_ref<const std::string&>();
        if (s == kNaN || s == kInfinity || s == kMinusInfinity) return std::nullopt;
    }
    std::string shown = v.dump();
    if (shown.size() > 40) shown = shown.substr(0, 37) + "...";
    throw Error(where + ": field '" + field + "': expected a number (or \"NaN\", \"Infinity\", " +
                "\"-Infinity\" or null), got " + shown);
}

std::string render_metrics_svg(const std::string& metrics_jsonl, const std::string& title,
                               const std::string& source) {
    Series train{"train loss", "#1f77b4", {}}, val{"validation loss", "#d62728", {}};
    Series lr{"learning rate", "#2ca02c", {}};
    nlohmann::json last_load;
    int64_t last_load_step = 0;
    std::vector<double> nonfinite_steps;  // a loss that was not finite
    int lines = 0;
    std::istringstream in(metrics_jsonl);
    std::string line;
    int lineno = 0;
    while (std::getline(in, line)) {
        ++lineno;
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        const std::string where = source + ":" + std::to_string(lineno);
        nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
        if (j.is_discarded() || !j.is_object()) throw Error(where + ": not a JSON object");
        if (!j.contains("step") || !j["step"].is_number_integer() || j["step"].get<int64_t>() < 0)
            throw Error(where + ": field 'step': expected an integer >= 0" +
                        (j.contains("step") ? ", got " + j["step"].dump() : std::string()));
        const int64_t step = j["step"].get<int64_t>();
        ++lines;
        // Non-finite values (a diverged step) cannot be drawn as points: their steps are marked.
        bool finite = true;
        for (auto [field, series] : {std::pair{"loss", &train}, {"val_loss", &val}, {"lr", &lr}}) {
            if (!j.contains(field)) continue;
            const std::optional<double> v = read_metrics_value(j[field], where, field);
            if (v && std::isfinite(*v))
                series->points.emplace_back(static_cast<double>(step), *v);
            else if (!j[field].is_null())
                finite = false;
        }
        if (!finite && (nonfinite_steps.empty() || nonfinite_steps.back() != step))
            nonfinite_steps.push_back(static_cast<double>(step));
        if (j.contains("expert_load") && !read_expert_load(j["expert_load"], where).empty()) {
            last_load = j["expert_load"];
            last_load_step = step;
        }
    }
    if (lines == 0) throw Error(source + ": no metrics logged yet");

    const double W = 960, chart_h = 260;
    const int layers = static_cast<int>(last_load.size());
    const int experts = layers ? static_cast<int>(last_load[0].size()) : 0;
    const double cell = 36, heat_h = layers ? 60 + layers * cell : 0;
    const double H = 60 + chart_h + 70 + heat_h + 20;
    std::ostringstream svg;
    svg << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H
        << "' font-family='sans-serif'>\n<rect width='100%' height='100%' fill='white'/>\n";
    svg << "<text x='20' y='28' font-size='18' font-weight='bold'>" << escape(title) << "</text>\n";
    line_chart(svg, 70, 70, 400, chart_h, "loss (nats/token)", {train, val}, false,
               nonfinite_steps);
    line_chart(svg, 550, 70, 380, chart_h, "learning rate", {lr}, true);
    if (layers) {
        const double top = 70 + chart_h + 70;
        svg << "<text x='70' y='" << top - 8
            << "' font-size='14' font-weight='bold'>expert load at step " << last_load_step
            << " (share of routed slots; even = " << fmt("%.0f", 100.0 / experts) << "%)</text>\n";
        for (int l = 0; l < layers; ++l) {
            svg << "<text x='64' y='" << top + l * cell + cell / 2 + 4
                << "' font-size='11' text-anchor='end'>layer " << l << "</text>\n";
            for (int e = 0; e < experts; ++e) {
                const double share = last_load[l][e].get<double>();
                // White at an even share, deeper red above it, deeper blue below.
                const double dev = std::clamp((share * experts - 1.0), -1.0, 1.0);
                const int r = dev < 0 ? static_cast<int>(255 * (1 + dev)) : 255;
                const int b = dev > 0 ? static_cast<int>(255 * (1 - dev)) : 255;
                const int g = static_cast<int>(255 * (1 - std::abs(dev)));
                const double cx = 70 + e * cell * 1.6, cy = top + l * cell;
                svg << "<rect x='" << cx << "' y='" << cy << "' width='" << cell * 1.6 - 2
                    << "' height='" << cell - 2 << "' fill='rgb(" << r << "," << g << "," << b
                    << ")' stroke='#ccc'/>\n<text x='" << cx + cell * 0.8 << "' y='"
                    << cy + cell / 2 + 4 << "' font-size='11' text-anchor='middle'>"
                    << fmt("%.1f%%", 100 * share) << "</text>\n";
            }
        }
        for (int e = 0; e < experts; ++e)
            svg << "<text x='" << 70 + e * cell * 1.6 + cell * 0.8 << "' y='"
                << top + layers * cell + 14 << "' font-size='11' text-anchor='middle'>expert " << e
                << "</text>\n";
    }
    svg << "</svg>\n";
    return svg.str();
}

}  // namespace tmx

// The parameter report as text (format_param_report, `tmx params`) and as JSON
// (param_report_json, `tmx params --json`).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "engine/core/format.h"
#include "engine/model/training_memory.h"
#include "engine/report/param_report.h"
#include "engine/report/report_util.h"

namespace tmx {

using namespace report_detail;

namespace {

using nlohmann::json;

// ------------------------------------------------------------------------------------------
// What the text and the JSON share

std::string attention_text(int64_t heads, int64_t kv_heads, int64_t head_dim) {
    std::string s = fmt(heads) + " query heads";
    if (kv_heads != heads) s += ", " + fmt(kv_heads) + " KV heads (GQA)";
    return s + ", head_dim " + fmt(head_dim);
}

// Per-layer cell of the table: the value when every layer has it, "N (k of L layers)" when
// only some layers do, "varies" otherwise.
struct PerLayer {
    std::optional<int64_t> uniform;  // same value in every layer
    std::optional<int64_t> present;  // same non-zero value wherever non-zero
    int64_t layers_present = 0;
};

PerLayer per_layer(const ModelCount& m, ParamGroup g) {
    PerLayer p;
    std::set<int64_t> all, nonzero;
    for (const auto& b : m.blocks) {
        int64_t v = b.params[idx(g)];
        all.insert(v);
        if (v != 0) {
            nonzero.insert(v);
            ++p.layers_present;
        }
    }
    if (all.size() == 1) p.uniform = *all.begin();
    if (nonzero.size() == 1) p.present = *nonzero.begin();
    return p;
}

bool is_global(ParamGroup g) {
    return g == ParamGroup::Embedding || g == ParamGroup::LmHead || g == ParamGroup::Positional;
}

// "0-3", "1,3,5" style list of indices.
std::string index_list(const std::vector<int64_t>& v) {
    std::string out;
    for (size_t i = 0; i < v.size();) {
        size_t k = i;
        while (k + 1 < v.size() && v[k + 1] == v[k] + 1) ++k;
        if (!out.empty()) out.push_back(',');
        out.append(std::to_string(v[i]));
        if (k > i) {
            out.push_back(k > i + 1 ? '-' : ',');  // a run of three or more, or a pair
            out.append(std::to_string(v[k]));
        }
        i = k + 1;
    }
    return out;
}

struct LayerGroup {
    std::string stack, kind;
    std::vector<int64_t> layers;
};

std::vector<LayerGroup> layer_groups(const ModelCount& m) {
    std::vector<LayerGroup> groups;
    std::map<std::string, int64_t> index_in_stack;
    for (const auto& b : m.blocks) {
        int64_t i = index_in_stack[b.stack]++;
        auto it = std::find_if(groups.begin(), groups.end(), [&](const LayerGroup& g) {
            return g.stack == b.stack && g.kind == b.kind;
        });
        if (it == groups.end()) {
            groups.push_back({b.stack, b.kind, {}});
            it = groups.end() - 1;
        }
        it->layers.push_back(i);
    }
    return groups;
}

std::string fmt_pct(double part, double whole) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f%%", whole > 0 ? 100.0 * part / whole : 0.0);
    return buf;
}

// Thousands separators, and two decimals when not whole.
std::string fmt_num(double v) {
    const int64_t cents = std::llround(v * 100);
    std::string s = with_thousands(cents / 100);
    if (cents % 100 == 0) return s;
    char buf[8];
    std::snprintf(buf, sizeof buf, ".%02d", static_cast<int>(cents % 100));
    return s + buf;
}

int64_t round_i64(double v) {
    return static_cast<int64_t>(std::llround(v));
}

// ------------------------------------------------------------------------------------------
// Text

std::string pad_left(const std::string& s, size_t w) {
    return s.size() >= w ? s : std::string(w - s.size(), ' ') + s;
}
std::string pad_right(const std::string& s, size_t w) {
    return s.size() >= w ? s : s + std::string(w - s.size(), ' ');
}

// The per-layer cell: the value when every layer has the same, per stack for an
// encoder-decoder whose stacks differ, "N (k of L layers)" when only some layers have it.
std::string per_layer_cell(const ModelCount& m, ParamGroup g) {
    if (g == ParamGroup::Embedding || g == ParamGroup::LmHead) return "-";
    PerLayer p = per_layer(m, g);
    if (g == ParamGroup::Positional && p.layers_present == 0) return "-";
    if (p.uniform) return with_thousands(*p.uniform);
    if (m.encoder_decoder()) {
        std::string cell;
        for (const auto& s : m.stacks) {
            std::set<int64_t> values;
            for (const auto& b : m.blocks)
                if (b.stack == s.name) values.insert(b.params[idx(g)]);
            if (values.size() != 1) {
                cell.clear();
                break;
            }
            cell += (cell.empty() ? "" : " / ") + s.name.substr(0, 3) + " " +
                    with_thousands(*values.begin());
        }
        if (!cell.empty()) return cell;
    }
    if (p.present)
        return with_thousands(*p.present) + " (" + std::to_string(p.layers_present) + " of " +
               std::to_string(m.blocks.size()) + " layers)";
    return "varies";
}

}  // namespace

namespace report_detail {

void print_table(std::ostream& out, const std::vector<std::vector<std::string>>& rows,
                 const std::string& align) {
    const std::string indent = "  ";
    std::vector<size_t> w;
    for (const auto& row : rows) {
        if (w.size() < row.size()) w.resize(row.size(), 0);
        for (size_t c = 0; c < row.size(); ++c) w[c] = std::max(w[c], row[c].size());
    }
    size_t width = 0;
    for (size_t c : w) width += c + 2;
    for (const auto& row : rows) {
        if (row.empty()) {
            out << indent << std::string(width - 2, '-') << "\n";
            continue;
        }
        std::string line;
        for (size_t c = 0; c < row.size(); ++c) {
            const bool left = c < align.size() ? align[c] == 'l' : c == 0;
            line += (c ? "  " : "") + (left ? pad_right(row[c], w[c]) : pad_left(row[c], w[c]));
        }
        while (!line.empty() && line.back() == ' ') line.pop_back();
        out << indent << line << "\n";
    }
}

}  // namespace report_detail

std::string format_param_report(const ParamReport& r) {
    const ModelCount& m = r.model;
    std::ostringstream out;
    const std::string what = m.format == "native"     ? "native tiny-mixtral config"
                             : m.format == "nanochat" ? "nanochat GPTConfig"
                                                      : "Hugging Face " + m.model_type + " config";
    out << r.source << " (" << what << ")\n";

    // Architecture.
    for (const auto& s : r.stacks) {
        const BlockCount* first = nullptr;
        for (const auto& b : m.blocks)
            if (b.stack == s.name && !first) first = &b;
        out << "  " << s.layers << " " << s.name << " layers, d_model "
            << with_thousands(m.d_model);
        if (first && !first->attention.empty()) {
            const AttentionOp& a = first->attention.front();
            out << ", " << attention_text(a.heads, a.kv_heads, a.head_dim);
        }
        out << ", vocab " << with_thousands(m.vocab_size) << "\n";
    }
    for (const auto& d : m.details) out << "  " << d << "\n";
    std::string groups;
    for (const auto& g : layer_groups(m))
        groups += (groups.empty() ? "" : "; ") + (m.encoder_decoder() ? g.stack + " " : "") +
                  g.kind + " " + index_list(g.layers);
    out << "  layers: " << groups << "\n\n";

    // Parameters.
    const double total = static_cast<double>(r.total_params);
    std::vector<std::vector<std::string>> rows = {
        {"component", "per layer", "all layers", "share"}};
    for (int g = 0; g < kNumParamGroups; ++g) {
        auto pg = static_cast<ParamGroup>(g);
        std::string label = group_label(pg);
        std::string per = per_layer_cell(m, pg);
        if (pg == ParamGroup::Norms) label += " (+ final)";
        if (pg == ParamGroup::LmHead && m.lm_head_tied) per = "tied to embedding";
        rows.push_back({label, per, with_thousands(r.group_totals[g]),
                        fmt_pct(static_cast<double>(r.group_totals[g]), total)});
    }
    rows.push_back({});
    rows.push_back({"total", "", with_thousands(r.total_params), "100.00%"});
    rows.push_back({"active per token", "", with_thousands(r.active_params),
                    fmt_pct(static_cast<double>(r.active_params), total)});
    print_table(out, rows);
    out << "  active: " << r.active_definition << ".\n";
    if (m.encoder_decoder())
        for (const auto& s : r.stacks)
            out << "  " << s.name << " stack (blocks + final norm): " << with_thousands(s.params)
                << " parameters, " << with_thousands(s.active) << " active per token\n";

    // Memory.
    out << "\nweight memory (1 GiB = 2^30 B):\n";
    print_table(out,
                {{"fp32", "4 B/param", fmt_bytes(r.weight_bytes[0])},
                 {"bf16 or f16", "2 B/param", fmt_bytes(r.weight_bytes[1])},
                 {"q8_0 (tmx)", "34 B/32 params; norms, router fp32", fmt_bytes(r.weight_bytes[2])},
                 {"int8", "1 B/param", fmt_bytes(r.weight_bytes[3])},
                 {"int4", "0.5 B/param", fmt_bytes(r.weight_bytes[4])}});
    out << "training memory with AdamW, 16 B/param either way:\n";
    rows = {{"fp32: weights 4 + grads 4 + Adam m 4 + Adam v 4", fmt_bytes(r.train_fp32_bytes)},
            {"bf16 mixed: bf16 weights 2 + bf16 grads 2 + fp32 master 4 + m 4 + v 4",
             fmt_bytes(r.train_mixed_bytes)}};
    if (r.has_activations)
        rows.push_back({"+ activations, batch " + with_thousands(r.act_batch) + " x seq " +
                            with_thousands(r.act_seq) + " (estimate, see below)",
                        fmt_bytes(r.activation_bytes)});
    print_table(out, rows);
    if (r.has_activations)
        out << "  activations assume bf16 tensors kept for backward, flash attention (no T x T "
               "scores), no recomputation, no dropout masks, fp32 logits"
            << (m.encoder_decoder() ? ", seq tokens in the encoder and in the decoder" : "")
            << "\n";
    if (r.engine_training) {
        const auto& [f32, b16] = *r.engine_training;
        out << "tmx train allocates, batch " << with_thousands(r.act_batch) << " x seq "
            << with_thousands(r.act_seq)
            << " (checked against the device before a run; a backend's scratch inside an op "
               "comes on top):\n";
        auto row = [](const std::string& label, double a, double b) {
            return std::vector<std::string>{label, fmt_bytes(a), fmt_bytes(b)};
        };
        print_table(out, {{"", "fp32", "bf16"},
                          row("weights 4 + grads 4 + Adam m, v 8 B/param",
                              f32.weights + f32.gradients + f32.optimizer,
                              b16.weights + b16.gradients + b16.optimizer),
                          row("bf16 weight copy, 2 B/param", f32.bf16_weights, b16.bf16_weights),
                          row("activations kept for backward", f32.activations, b16.activations),
                          row("step scratch (classifier, backward, validation)", f32.step_scratch,
                              b16.step_scratch),
                          row("total", f32.total(), b16.total())});
    }

    // KV cache.
    const double kv = static_cast<double>(r.kv_values_per_token);
    out << "\nKV cache = 2 (K, V) x layers x kv_heads x head_dim values per token"
        << (m.encoder_decoder() ? " (decoder self-attention)" : "") << ":\n";
    rows = {{"", "bf16", "fp32"}, {"per token", fmt_bytes(2 * kv), fmt_bytes(4 * kv)}};
    auto kv_row = [&](const std::string& label, int64_t tokens) {
        const double t = static_cast<double>(tokens);
        rows.push_back({label + ": " + with_thousands(tokens) + " tokens", fmt_bytes(2 * kv * t),
                        fmt_bytes(4 * kv * t)});
    };
    kv_row(m.sliding_window > 0 && m.sliding_window < m.context ? "full context, window-capped"
                                                                : "full context",
           r.kv_cached_tokens);
    if (r.kv_seq_tokens > 0 && r.options.seq != m.context)
        kv_row(("at " + opt("seq")).spelled(r.options.spelling), r.kv_seq_tokens);
    print_table(out, rows);
    out << "  context " << with_thousands(m.context) << " (" << m.context_origin << ")";
    if (m.sliding_window > 0)
        out << ", sliding window " << with_thousands(m.sliding_window)
            << " (the cache holds at most that many tokens)";
    else
        out << ", no sliding window";
    out << "\n";
    if (m.encoder_decoder())
        out << "  cross-attention keeps another " << fmt_bytes(2.0 * r.kv_cross_values_per_token)
            << " (bf16) per encoder token\n";

    // FLOPs.
    out << "\nFLOPs per token (2 per multiply-add), T = " << with_thousands(r.flops_context)
        << (r.options.seq > 0 ? (" (" + opt("seq") + ")").spelled(r.options.spelling)
                              : " (the config's context)");
    if (m.sliding_window > 0) out << ", window " << with_thousands(m.sliding_window);
    out << ":\n";
    const std::string enc = m.encoder_decoder() ? "; encoder and cross attention see all T" : "";
    print_table(out,
                {{"matmul", fmt_si(r.matmul_flops, "FLOP"),
                  "2 x " + with_thousands(r.matmul_params) +
                      " active weight-matrix params (LM head in, embedding lookup out)"},
                 {"attention", fmt_si(r.attention_flops_mean, "FLOP"),
                  "4 x heads x head_dim per key; " + fmt_num(r.keys_mean) +
                      " keys: the mean over a causal " + with_thousands(r.flops_context) +
                      "-token sequence" + enc},
                 {"forward", fmt_si(r.forward_flops, "FLOP"), "matmul + attention"},
                 {"training step", fmt_si(r.training_flops, "FLOP"), "3 x forward"},
                 {"decode", fmt_si(r.decode_flops, "FLOP"),
                  "forward of the last of " + with_thousands(r.flops_context) + " tokens (" +
                      fmt_num(r.keys_last) + " keys)"}},
                "lrl");

    if (!m.notes.empty()) {
        out << "\nnotes:\n";
        for (const auto& n : m.notes) out << "  - " << n << "\n";
    }
    return out.str();
}

json param_report_json(const ParamReport& r) {
    const ModelCount& m = r.model;
    json j;
    j["source"] = r.source;
    j["format"] = m.format;
    j["model_type"] = m.model_type;
    j["vocab_size"] = m.vocab_size;
    j["d_model"] = m.d_model;
    j["total_params"] = r.total_params;
    j["active_params"] = r.active_params;
    j["active_definition"] = r.active_definition;

    json comps = json::object();
    for (int g = 0; g < kNumParamGroups; ++g) {
        auto pg = static_cast<ParamGroup>(g);
        PerLayer p = per_layer(m, pg);
        json c;
        c["total"] = r.group_totals[g];
        // Parameters outside the blocks (embedding, LM head, learned positions) have no
        // per-layer value.
        const bool in_blocks = !is_global(pg) || p.layers_present > 0;
        c["per_layer"] = p.uniform && in_blocks ? json(*p.uniform) : json(nullptr);
        c["per_layer_where_present"] = p.present ? json(*p.present) : json(nullptr);
        c["layers_present"] = p.layers_present;
        if (pg == ParamGroup::LmHead) c["tied"] = m.lm_head_tied;
        comps[group_key(pg)] = c;
    }
    j["components"] = comps;

    json stacks = json::array();
    for (const auto& s : r.stacks)
        stacks.push_back({{"name", s.name},
                          {"layers", s.layers},
                          {"params", s.params},
                          {"active_params", s.active}});
    j["stacks"] = stacks;
    json groups = json::array();
    for (const auto& g : layer_groups(m))
        groups.push_back({{"stack", g.stack}, {"kind", g.kind}, {"layers", g.layers}});
    j["layer_groups"] = groups;

    json mem;
    mem["weights_bytes"] = {
        {"fp32", round_i64(r.weight_bytes[0])}, {"bf16", round_i64(r.weight_bytes[1])},
        {"f16", round_i64(r.weight_bytes[1])},  {"q8_0", round_i64(std::ceil(r.weight_bytes[2]))},
        {"int8", round_i64(r.weight_bytes[3])}, {"int4", round_i64(std::ceil(r.weight_bytes[4]))}};
    mem["training_bytes"] = {
        {"adamw_fp32", round_i64(r.train_fp32_bytes)},
        {"adamw_bf16_mixed", round_i64(r.train_mixed_bytes)},
        {"bytes_per_param", 16},
        {"adamw_fp32_breakdown", {{"weights", 4}, {"grads", 4}, {"adam_m", 4}, {"adam_v", 4}}},
        {"adamw_bf16_mixed_breakdown",
         {{"bf16_weights", 2},
          {"bf16_grads", 2},
          {"fp32_master", 4},
          {"adam_m", 4},
          {"adam_v", 4}}}};
    if (r.has_activations)
        mem["activations"] = {
            {"batch", r.act_batch},
            {"seq", r.act_seq},
            {"bytes", round_i64(r.activation_bytes)},
            {"assumes",
             "bf16 tensors kept for backward, flash attention (no T x T scores), no "
             "recomputation, no dropout masks, fp32 logits"}};
    else
        mem["activations"] = nullptr;
    if (r.engine_training) {
        auto bytes = [](const TrainingMemory& t) {
            return json{{"weights", round_i64(t.weights)},
                        {"gradients", round_i64(t.gradients)},
                        {"optimizer", round_i64(t.optimizer)},
                        {"bf16_weights", round_i64(t.bf16_weights)},
                        {"activations", round_i64(t.activations)},
                        {"step_scratch", round_i64(t.step_scratch)},
                        {"total", round_i64(t.total())}};
        };
        mem["engine_training"] = {{"batch", r.act_batch},
                                  {"seq", r.act_seq},
                                  {"fp32", bytes((*r.engine_training)[0])},
                                  {"bf16", bytes((*r.engine_training)[1])}};
    } else {
        mem["engine_training"] = nullptr;
    }
    j["memory"] = mem;

    json kv;
    kv["values_per_token"] = r.kv_values_per_token;
    kv["bytes_per_token"] = {{"bf16", 2 * r.kv_values_per_token},
                             {"fp32", 4 * r.kv_values_per_token}};
    kv["context"] = m.context;
    kv["context_origin"] = m.context_origin;
    kv["sliding_window"] = m.sliding_window;
    kv["cached_tokens"] = r.kv_cached_tokens;
    kv["bytes_at_context"] = {{"bf16", 2 * r.kv_values_per_token * r.kv_cached_tokens},
                              {"fp32", 4 * r.kv_values_per_token * r.kv_cached_tokens}};
    if (r.kv_seq_tokens > 0)
        kv["bytes_at_seq"] = {{"tokens", r.kv_seq_tokens},
                              {"bf16", 2 * r.kv_values_per_token * r.kv_seq_tokens},
                              {"fp32", 4 * r.kv_values_per_token * r.kv_seq_tokens}};
    if (m.encoder_decoder())
        kv["cross_attention_bytes_per_encoder_token"] = {{"bf16", 2 * r.kv_cross_values_per_token},
                                                         {"fp32", 4 * r.kv_cross_values_per_token}};
    kv["counts"] = m.encoder_decoder() ? "decoder self-attention" : "all layers";
    j["kv_cache"] = kv;

    json fl;
    fl["context"] = r.flops_context;
    fl["sliding_window"] = m.sliding_window;
    fl["keys_mean"] = r.keys_mean;
    fl["keys_last"] = r.keys_last;
    fl["matmul_params"] = r.matmul_params;
    fl["matmul_per_token"] = round_i64(r.matmul_flops);
    fl["attention_per_token_mean"] = round_i64(r.attention_flops_mean);
    fl["attention_per_token_last"] = round_i64(r.attention_flops_last);
    fl["forward_per_token"] = round_i64(r.forward_flops);
    fl["training_per_token"] = round_i64(r.training_flops);
    fl["decode_per_token"] = round_i64(r.decode_flops);
    fl["convention"] =
        "2 FLOPs per multiply-add; matmul term = 2 x active weight-matrix params (LM head "
        "included, embedding lookup not); attention = 4 x heads x head_dim per key; forward "
        "and training average the keys over a causal T-token sequence (window-capped), decode "
        "is the last token of T; training = 3 x forward";
    j["flops"] = fl;

    j["details"] = m.details;
    j["notes"] = m.notes;
    return j;
}

}  // namespace tmx

// Flag-value parsing shared by the subcommands.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "apps/commands.h"
#include "backends/registry.h"
#include "engine/core/errors.h"
#include "engine/model/checkpoint.h"
#include "engine/report/param_report.h"

namespace tmx::cli {

void add_corpus_options(CLI::App& sub, CorpusOptions& corpus) {
    sub.add_option("--input", corpus.inputs, "Corpus files (tinystories, paragraphs or jsonl)")
        ->required()
        ->expected(1, -1);
    sub.add_option("--format", corpus.format, "Input format: auto, tinystories, paragraphs, jsonl")
        ->check(CLI::IsMember({"auto", "tinystories", "paragraphs", "jsonl"}))
        ->capture_default_str();
}

void add_checkpoint_out_options(CLI::App& sub, CheckpointOutOptions& o) {
    sub.add_option("--out", o.out, "Checkpoint directory to write")->required();
    sub.add_option("--dtype", o.dtype,
                   "Weight storage: f32, bf16, f16 or q8_0 (8-bit blocks; norms, biases and the "
                   "router stay f32)")
        ->check(CLI::IsMember({"f32", "bf16", "f16", "q8_0"}))
        ->capture_default_str();
    sub.add_flag("--force", o.force, "Replace an existing checkpoint in --out");
}

void add_backend_options(CLI::App& sub, BackendChoice& choice, bool training) {
    sub.add_option("--backend", choice.backend,
                   "Backend: auto (the best present: CUDA, else a Vulkan GPU, else the CPU) "
                   "or one of " +
                       backend_list())
        ->capture_default_str();
    sub.add_option("--device", choice.device,
                   "GPU index of the chosen backend, as `tmx devices` lists them (default: "
                   "CUDA device 0; the first discrete Vulkan GPU)")
        ->check(in_range(0, INT32_MAX));
    sub.add_option("--precision", choice.precision,
                   training ? "Matmul and attention precision: auto (bf16 on CUDA GPUs of compute "
                              "capability 8.0 or newer, fp32 elsewhere; a resumed run keeps its "
                              "own), fp32, or bf16 (operands rounded to bf16, fp32 sums; "
                              "weights, gradients and the optimizer stay fp32)"
                            : "Matmul and attention precision: auto (bf16 on CUDA GPUs of compute "
                              "capability 8.0 or newer, fp32 elsewhere), fp32, or bf16 (bf16 "
                              "copies of the weights and matmul operands, fp32 sums)")
        ->check(CLI::IsMember({"auto", "fp32", "bf16"}))
        ->capture_default_str();
    choice.training = training;
}

Precision BackendChoice::resolve_precision(const Backend& be) const {
    if (precision != "auto") {
        const Precision p = parse_precision(precision, "--precision");
        if (!be.supports_precision(p))
            throw UsageError("--precision " + precision + ": the " + be.name() +
                             " backend has no " + to_string(p) + " matmuls; use fp32");
        return p;
    }
    return be.default_precision();
}

std::string with_device(const std::string& name, int device) {
    if (device < 0) return name;
    if (backend_takes_device(name)) return name + ":" + std::to_string(device);
    throw UsageError("--device " + std::to_string(device) + " selects a GPU; backend '" + name +
                     "' has none");
}

OpenedBackend BackendChoice::open(bool announce_it) const {
    const std::string name = resolve_backend(backend);
    const bool gpu = backend_takes_device(name);
    auto be = make_backend(with_device(name, device >= 0 || !gpu ? device : default_device));
    if (training && !be->supports_training())
        throw UsageError("--backend " + backend + ": the " + be->name() +
                         " backend runs inference only");
    const Backend::Mode mode{.precision = resolve_precision(*be), .training = training};
    OpenedBackend opened(std::move(be), mode);
    if (announce_it) announce(*opened);
    return opened;
}

void BackendChoice::announce(const Backend& be, const std::string& why) const {
    const std::string said = !why.empty() ? why : backend == "auto" ? "auto" : "";
    std::fprintf(stderr, "backend%s: %s\n", said.empty() ? "" : (" (" + said + ")").c_str(),
                 be.description().c_str());
}

void add_weights_option(CLI::App& sub, WeightsChoice& choice) {
    sub.add_option("--weights", choice.format,
                   "Format the weights are held in while the model runs: auto (the "
                   "checkpoint's own where the backend holds it, else f32), f32, bf16, f16 or "
                   "q8_0 (converted as they load; every backend holds every format)")
        ->capture_default_str();
}

std::unique_ptr<Model> WeightsChoice::load(const std::string& dir, Backend& backend) const {
    std::optional<DType> wanted;
    if (format != "auto") wanted = parse_weight_format(format, "--weights");
    auto model = load_model(dir, backend, wanted);
    const DType stored = checkpoint_weight_format(dir);
    const DType held = model->weight_format();
    std::string why = wanted ? "as --weights asks" : "as stored";
    if (!wanted && held != stored)
        why = "stored as " + std::string(to_string(stored)) + ", which the " + backend.name() +
              " backend does not hold";
    std::fprintf(stderr, "weights: %s (%s)\n", to_string(held), why.c_str());
    return model;
}

std::vector<int32_t> parse_id_list(const std::string& text, const char* flag, int64_t vocab_size) {
    std::vector<int32_t> out;
    size_t i = 0;
    while (i <= text.size()) {
        size_t j = text.find(',', i);
        if (j == std::string::npos) j = text.size();
        std::string item = text.substr(i, j - i);
        size_t a = item.find_first_not_of(" \t"), b = item.find_last_not_of(" \t");
        item = a == std::string::npos ? "" : item.substr(a, b - a + 1);
        const bool digits_only =
            !item.empty() && item.find_first_not_of("0123456789") == std::string::npos;
        if (!digits_only)
            throw UsageError(std::string(flag) + ": expected comma-separated token ids, got '" +
                             item + "'");
        // Digits only: strtoll saturates at its maximum (errno ERANGE), which is out of range
        // here too.
        const long long v = std::strtoll(item.c_str(), nullptr, 10);
        if (v >= vocab_size)
            throw UsageError(std::string(flag) + ": token id " + item +
                             " is out of range (the vocabulary has " + std::to_string(vocab_size) +
                             " ids: 0 to " + std::to_string(vocab_size - 1) + ")");
        out.push_back(static_cast<int32_t>(v));
        i = j + 1;
    }
    return out;
}

namespace {

// "2^31 - 1" for the maxima of integer types, grouped digits otherwise.
std::string bound_text(__int128 v) {
    for (int bits : {8, 15, 16, 31, 32, 63, 64})
        if (v == (static_cast<__int128>(1) << bits) - 1)
            return "2^" + std::to_string(bits) + " - 1";
    for (int bits : {7, 15, 31, 63})
        if (v == -(static_cast<__int128>(1) << bits)) return "-2^" + std::to_string(bits);
    return with_thousands(static_cast<int64_t>(v));
}

// A plain decimal integer (optional sign, digits only) into *value; false when `text` is not
// one. Magnitudes past 2^64 stop there: every caller's range ends before.
bool parse_decimal(const std::string& text, __int128& value) {
    size_t i = text.size() > 1 && (text[0] == '-' || text[0] == '+') ? 1 : 0;
    if (i == text.size()) return false;
    const __int128 cap = static_cast<__int128>(1) << 65;
    value = 0;
    for (; i < text.size(); ++i) {
        if (text[i] < '0' || text[i] > '9') return false;
        if (value < cap) value = value * 10 + (text[i] - '0');
    }
    if (text[0] == '-') value = -value;
    return true;
}

std::string int128_to_string(__int128 v) {
    if (v < 0) return "-" + int128_to_string(-v);
    std::string digits;
    do {
        digits.insert(digits.begin(), static_cast<char>('0' + static_cast<int>(v % 10)));
        v /= 10;
    } while (v > 0);
    return digits;
}

}  // namespace

CLI::Validator integer_range(int64_t min, uint64_t max) {
    const std::string range = "an integer from " + bound_text(min) + " to " + bound_text(max);
    return CLI::Validator(
        [min, max, range](std::string& input) -> std::string {
            __int128 v = 0;
            if (!parse_decimal(input, v) || v < min || v > static_cast<__int128>(max))
                return "expected " + range + ", got " + input;
            return "";
        },
        "[" + bound_text(min) + ", " + bound_text(max) + "]");
}

void check_integer_options(CLI::App& app) {
    // CLI11 reads integers in base 0 ("010" is 8, "0x10" 16): a decimal integer is rewritten
    // without leading zeros or '+'; anything else is left for the range checks to refuse.
    const CLI::Validator canonical_decimal(
        [](std::string& input) -> std::string {
            __int128 v = 0;
            const __int128 limit = static_cast<__int128>(1) << 64;
            if (parse_decimal(input, v) && v < limit && v > -limit) input = int128_to_string(v);
            return "";
        },
        "");
    for (CLI::Option* opt : app.get_options()) {
        // CLI11 names the type of every integer option INT or UINT, whatever its width, and
        // appends its validators' descriptions after a ':'.
        const std::string type = opt->get_type_name();
        const std::string base = type.substr(0, type.find(':'));
        if (base != "INT" && base != "UINT") continue;
        opt->transform(canonical_decimal);  // runs first
        // Runs after the option's own range, whose message is the more precise one.
        CLI::Validator fits_64_bits =
            base == "INT" ? in_range(INT64_MIN, INT64_MAX) : in_range(uint64_t{0}, UINT64_MAX);
        opt->check(fits_64_bits.description(""));  // no clutter in --help
    }
    for (CLI::App* sub : app.get_subcommands({})) check_integer_options(*sub);
}

}  // namespace tmx::cli

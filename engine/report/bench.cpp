#include "engine/report/bench.h"

#include <map>
#include <stdexcept>

#include "engine/compute/backend.h"
#include "engine/core/errors.h"
#include "engine/model/kv_cache.h"
#include "engine/model/model.h"
#include "engine/model/training_memory.h"
#include "engine/report/bench_util.h"
#include "engine/report/model_bench.h"
#include "engine/report/op_bench.h"

// run_bench: every backend's op timings (op_bench.cpp) and model timings (model_bench.cpp), each
// against the CPU's results in the same precision.
namespace tmx {

using namespace bench_detail;

std::vector<BackendBench> run_bench(const ModelConfig& config, std::vector<float> weights,
                                    const BenchOptions& o) {
    if (o.backends.empty()) throw UsageError(opt("backends") + ": no backend to run");
    if (!o.open_backend) throw std::logic_error("run_bench: BenchOptions::open_backend is not set");
    if (!(o.warm_seconds >= 0 && o.warm_seconds <= 600))
        throw UsageError("tmx bench: " + opt("warm_seconds") + " must be from 0 to 600");
    if (o.prompt_tokens < 1 || o.decode_tokens < 1 || o.batch < 1 || o.repeats < 1 || o.warmup < 0)
        throw UsageError("tmx bench: " + opt("prompt_tokens") + ", " + opt("decode_tokens") + ", " +
                         opt("batch") + " and " + opt("repeats") + " must be positive");
    if ((o.train_batch > 0) != (o.train_seq > 0) || o.train_batch < 0 || o.train_seq < 0)
        throw UsageError("tmx bench: " + opt("train_batch") + " and " + opt("train_seq") +
                         " go together, both positive");
    if (o.train_seq > config.max_seq_len)
        throw UsageError("tmx bench: " + opt("train_seq") + " " + std::to_string(o.train_seq) +
                         " exceeds the model's max_seq_len " + std::to_string(config.max_seq_len));
    const int64_t limit = kv_cache_max_positions(config);
    const int64_t P = limit < 0 ? o.prompt_tokens : std::min(o.prompt_tokens, limit - 1);

    // Every backend first, so that a bad name fails before any measuring.
    std::vector<std::unique_ptr<Backend>> others;
    for (const std::string& name : o.backends)
        others.push_back(name == "cpu" ? nullptr : o.open_backend(name));

    // The CPU results everything is checked against.
    auto cpu = o.open_backend("cpu");
    // Each backend measures in options.precision, else in its default; a backend without the
    // precision asked for is refused before anything is measured.
    auto precision_of = [&](const Backend& be) {
        return o.precision.value_or(be.default_precision());
    };
    for (const std::unique_ptr<Backend>& other : others) {
        const Backend& be = other ? *other : *cpu;
        if (!be.supports_precision(precision_of(be)))
            throw UsageError(opt("precision") + " " + to_string(precision_of(be)) + ": the " +
                             be.name() + " backend has none; leave " + opt("precision") +
                             " out to run each backend in its default");
    }
    for (const std::unique_ptr<Backend>& other : others) {
        const Backend& be = other ? *other : *cpu;
        if (!be.supports_weight_format(o.weight_format))
            throw UsageError(opt("weight_format") + " " + to_string(o.weight_format) + ": the " +
                             be.name() + " backend cannot hold such weights");
    }
    // A training batch that cannot fit (on a backend that trains, or on the CPU, which takes the
    // reference step) is refused before anything is measured.
    if (o.train_batch > 0) {
        const TrainingMemoryOptions options{opt("train_batch"), opt("train_seq"), ""};
        auto check = [&](const Backend& be, Precision p) {
            check_training_memory(config, o.train_batch, o.train_seq, p, be, options);
        };
        for (const std::unique_ptr<Backend>& other : others) {
            const Backend& be = other ? *other : *cpu;
            if (!be.supports_training()) continue;
            check(be, precision_of(be));
            if (o.train_check) check(*cpu, precision_of(be));  // the reference step
        }
    }
    Model cpu_model(config, *cpu, o.weight_format);
    if (weights.empty()) {
        cpu_model.init_random(o.seed);
        weights = cpu_model.params_to_host();
    } else {
        cpu_model.params_from_host(weights);
    }
    // The other backends' reference: the CPU on the weights' decoded values. For f32 and the
    // 16-bit formats that is the CPU model itself; in q8_0 the CPU also quantises the
    // activations for its int8 products, which the GPU backends do not, so they are checked
    // against an f32 model holding the q8_0 weights' values (made when first needed).
    std::unique_ptr<Model> decoded_model;
    auto reference_model = [&]() -> Model& {
        if (o.weight_format != DType::Q8_0) return cpu_model;
        if (!decoded_model) {
            decoded_model = std::make_unique<Model>(config, *cpu, DType::F32);
            decoded_model->params_from_host(cpu_model.params_to_host());
        }
        return *decoded_model;
    };
    const std::vector<OpCase> ops = op_cases(config, P, o.seed, o.gemm);
    // The CPU's results in each precision a backend measures in, made when first needed.
    struct Reference {
        std::vector<std::vector<float>> op_outputs;
        ModelRun run;
        bool model_run = false;
    };
    std::map<Precision, Reference> references;
    auto reference = [&](Precision p) -> Reference& {
        Reference& ref = references[p];
        if (ref.op_outputs.empty()) {
            Backend::ModeScope mode(*cpu, {.precision = p});
            for (const OpCase& op : ops) ref.op_outputs.push_back(run_op(op, *cpu));
        }
        return ref;
    };

    std::vector<BackendBench> results;
    for (const std::unique_ptr<Backend>& other : others) {
        Backend& be = other ? *other : *cpu;
        const Precision precision = precision_of(be);
        Reference& ref = reference(precision);
        if (other && o.warm_seconds > 0) {
            if (o.progress) o.progress(be.name() + ": warming the device up");
            warm_up(be, o.warm_seconds);
        }
        Backend::ModeScope mode(be, {.precision = precision});
        BackendBench r;
        r.backend = be.name();
        r.description = be.description();
        r.precision = precision;
        for (size_t i = 0; i < ops.size(); ++i) {
            if (o.progress) o.progress(r.backend + ": " + ops[i].name + " " + ops[i].shape);
            r.ops.push_back(measure_op(ops[i], be, ref.op_outputs[i], o, precision));
        }

        ModelRun run;
        if (&be == cpu.get()) {
            r.model = measure_model(cpu_model, o, P, run);
            if (&reference_model() == &cpu_model && !ref.model_run) {
                ref.run = run;
                ref.model_run = true;
            }
        } else {
            Model model(config, be, o.weight_format);
            model.params_from_host(weights);
            r.model = measure_model(model, o, P, run);
        }
        if (!ref.model_run) {  // the reference run: what is compared, once, untimed
            if (o.progress) o.progress("cpu: the reference prefill and batch-1 decode");
            Backend::ModeScope cpu_mode(*cpu, {.precision = precision});
            ref.run = reference_run(reference_model(), o, P);
            ref.model_run = true;
        }
        compare_with_cpu(r.model, run, ref.run);
        if (o.train_batch > 0 && be.supports_training()) {
            const Backend::Mode training{.precision = precision, .training = true};
            r.train = measure_training(config, weights, be, o, training);
            if (&be == cpu.get()) {
                r.train.cpu_loss = r.train.loss;
            } else if (o.train_check) {  // the CPU's loss on the same batch, one untimed step
                BenchOptions once = o;
                once.warmup = 0;
                once.repeats = 1;
                once.progress = {};
                r.train.cpu_loss = measure_training(config, weights, *cpu, once, training).loss;
            }
        }
        results.push_back(std::move(r));
    }
    return results;
}

}  // namespace tmx

#include "tests/model_scenarios.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>
#include <span>

#include "engine/core/rng.h"
#include "engine/data/prepare.h"
#include "engine/data/tokenizer.h"
#include "engine/infer/generator.h"
#include "engine/model/checkpoint.h"
#include "engine/model/kv_cache.h"
#include "tests/test_util.h"

namespace tmx::test {

ModelConfig test_config(const std::string& name) {
    return load_config(source_dir() + "/assets/configs/" + name + ".json");
}

std::unique_ptr<Model> spread_model(const ModelConfig& c, Backend& be, uint64_t seed) {
    auto model = std::make_unique<Model>(c, be);
    model->init_random(seed);
    std::vector<float> p = model->params_to_host();
    for (const ParamSpec& s : model->layout().specs)
        if (s.init == ParamInit::Normal)
            for (int64_t i = 0; i < s.numel(); ++i) p[s.offset + i] *= 10.0f;
    model->params_from_host(p);
    return model;
}

double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
    if (got.size() != want.size()) return INFINITY;
    double scale = 1.0, worst = 0.0;
    for (float w : want) scale = std::max(scale, std::abs(double(w)));
    for (size_t i = 0; i < want.size(); ++i) {
        const double d = std::abs(double(got[i]) - double(want[i]));
        if (!std::isfinite(d)) return INFINITY;
        worst = std::max(worst, d);
    }
    return worst / scale;
}

std::string cache_case_name(const ::testing::TestParamInfo<CacheCase>& info) {
    const CacheCase& c = info.param;
    std::string name = std::string(c.config) + "_" + std::to_string(c.windows_total) + "W_prompt" +
                       std::to_string(c.prompt) + "_chunk" + std::to_string(c.chunk);
    std::replace(name.begin(), name.end(), '-', '_');
    return name;
}

namespace {
std::vector<float> to_host(Backend& be, const Tensor& t) {
    std::vector<float> out(static_cast<size_t>(t.numel()));
    be.download(t, out.data());
    return out;
}
}  // namespace

void expect_cached_decoding_matches_recompute(Backend& be, const CacheCase& cc, uint64_t seed,
                                              double tolerance) {
    const ModelConfig c = test_config(cc.config);
    auto model = spread_model(c, be, seed);
    const int64_t W = kv_cache_slots(c);
    const int64_t total = cc.windows_total * W, chunk = cc.chunk ? cc.chunk : W;
    const int64_t V = c.vocab_size;
    Rng rng(seed);
    const std::vector<int32_t> tokens =
        random_ints(rng, static_cast<size_t>(total), 0, static_cast<int32_t>(V));

    KvCache cache(c, be, 1);
    Tensor logits;
    for (int64_t start = 0; start < cc.prompt; start += chunk) {
        const int64_t n = std::min(chunk, cc.prompt - start);
        const std::vector<int32_t> piece(tokens.begin() + start, tokens.begin() + start + n);
        logits = model->forward_cached(piece, 1, n, {static_cast<int32_t>(start)}, cache);
    }
    for (int64_t n = cc.prompt; n <= total; ++n) {
        if (n > cc.prompt)
            logits =
                model->forward_cached({tokens[n - 1]}, 1, 1, {static_cast<int32_t>(n - 1)}, cache);
        const std::vector<float> cached = to_host(be, logits);
        const std::vector<int32_t> prefix(tokens.begin(), tokens.begin() + n);
        const std::vector<float> all = to_host(be, model->forward(prefix, 1, n).logits);
        const std::vector<float> full(all.end() - V, all.end());
        ASSERT_LT(relative_error(cached, full), tolerance) << "after " << n << " tokens";
    }
}

void expect_greedy_demo_matches_cpu(
    Backend& cpu, Backend& other, const std::function<double(const std::vector<float>&)>& near_tie,
    std::optional<DType> other_weights) {
    const std::string demo = source_dir() + "/assets/demo";
    auto on_cpu = load_model(demo, cpu);
    auto on_other = load_model(demo, other, other_weights);
    const Tokenizer tok = Tokenizer::load(demo + "/tokenizer.model");
    std::vector<int32_t> prompt = {tok.bos_id()};
    for (int32_t id : tok.encode("Once upon a time, a little dog")) prompt.push_back(id);
    GenerationOptions o;
    o.max_new_tokens = 200;
    o.sampling.temperature = 0.0;  // greedy; no end ids: all 200 steps
    std::vector<std::vector<float>> cpu_logits;
    auto record = [&](size_t, int32_t, std::span<const float> l) {
        cpu_logits.emplace_back(l.begin(), l.end());
        return false;
    };
    const auto want = generate_tokens(*on_cpu, {prompt}, o, record)[0].ids;
    const auto got = generate_tokens(*on_other, {prompt}, o)[0].ids;
    ASSERT_EQ(want.size(), 200u);
    ASSERT_EQ(got.size(), 200u);
    for (size_t i = 0; i < want.size(); ++i) {
        if (got[i] == want[i]) continue;
        const double tie = near_tie(cpu_logits[i]);
        std::vector<float> l = cpu_logits[i];
        std::partial_sort(l.begin(), l.begin() + 2, l.end(), std::greater<float>());
        EXPECT_LE(l[0] - l[1], tie) << "step " << i << ": " << other.name() << " chose " << got[i]
                                    << ", the CPU " << want[i] << " without a near-tie";
        break;
    }
}

void write_counting_dataset(const std::string& dir, uint64_t seed, int32_t vocab) {
    Rng rng(seed);
    DatasetWriter w(dir, static_cast<uint64_t>(vocab));
    for (int doc = 0; doc < 120; ++doc) {
        std::vector<int32_t> tokens = {1};
        int32_t x = 3 + static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab - 3)));
        const int32_t stride = 1 + static_cast<int32_t>(rng.below(3));
        for (int i = 0; i < 40; ++i) {
            tokens.push_back(x);
            x = 3 + (x - 3 + stride) % (vocab - 3);
        }
        w.add_document(doc % 10 == 9 ? Split::Val : Split::Train, tokens.data(), tokens.size());
    }
    w.commit({{"bos_id", 1}, {"eos_id", 2}});
}

}  // namespace tmx::test

#include "engine/model/adamw.h"

#include <algorithm>
#include <stdexcept>

namespace tmx {

void adamw_step(Model& model, const Tensor& m, const Tensor& v, const Backend::AdamWParams& hp,
                int64_t begin) {
    Backend& be = model.backend();
    const std::vector<ParamSpec>& specs = model.layout().specs;
    const Tensor& params = model.params();
    const Tensor& grads = model.grads();
    const int64_t end = begin + m.numel();
    if (v.numel() != m.numel() || begin < 0 || end > params.numel())
        throw std::logic_error("adamw_step: moments outside the parameters");
    for (size_t i = 0; i < specs.size();) {
        const bool decay = specs[i].decay;
        const int64_t run_begin = specs[i].offset;
        int64_t run_end = run_begin;
        for (; i < specs.size() && specs[i].decay == decay; ++i) {
            if (specs[i].offset != run_end) throw std::logic_error("adamw_step: layout has a gap");
            run_end += specs[i].numel();
        }
        const int64_t lo = std::max(run_begin, begin), hi = std::min(run_end, end);
        if (lo >= hi) continue;
        Backend::AdamWParams run = hp;
        if (!decay) run.weight_decay = 0.0f;
        const Shape shape{hi - lo};
        be.adamw(params.slice(lo, shape), grads.slice(lo, shape), m.slice(lo - begin, shape),
                 v.slice(lo - begin, shape), run);
    }
}

}  // namespace tmx

#include "engine/model/adamw.h"

#include <stdexcept>

namespace tmx {

void adamw_step(Model& model, const Tensor& m, const Tensor& v, const Backend::AdamWParams& hp) {
    Backend& be = model.backend();
    const std::vector<ParamSpec>& specs = model.layout().specs;
    const Tensor& params = model.params();
    const Tensor& grads = model.grads();
    for (size_t i = 0; i < specs.size();) {
        const bool decay = specs[i].decay;
        const int64_t begin = specs[i].offset;
        int64_t end = begin;
        for (; i < specs.size() && specs[i].decay == decay; ++i) {
            if (specs[i].offset != end) throw std::logic_error("adamw_step: layout has a gap");
            end += specs[i].numel();
        }
        Backend::AdamWParams run = hp;
        if (!decay) run.weight_decay = 0.0f;
        const Shape shape{end - begin};
        be.adamw(params.slice(begin, shape), grads.slice(begin, shape), m.slice(begin, shape),
                 v.slice(begin, shape), run);
    }
}

}  // namespace tmx

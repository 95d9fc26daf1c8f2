// The optimizer step over a model's flat parameters, shared by the trainer and `tmx bench`.
#pragma once

#include "engine/compute/backend.h"
#include "engine/model/model.h"

namespace tmx {

// One AdamW step over the model's flat parameters with its gradients and the moments m, v (each
// [num_params]): weight decay on the tensors the layout marks (ParamSpec::decay) and none on the
// others. Each run of neighbouring tensors alike is one Backend::adamw call on views, so no
// per-parameter mask exists (it would cost 4 B/param of device memory).
//
// m and v cover the parameters [begin, begin + m.numel()): all of them by default, one rank's
// share of them under a sharded optimizer (ZeRO-1), which steps that share only.
void adamw_step(Model& model, const Tensor& m, const Tensor& v, const Backend::AdamWParams& hp,
                int64_t begin = 0);

}  // namespace tmx

// Checkpoint directories (docs/design.md#13-checkpoint-files): config.json (the native config
// plus format_version), model.safetensors (F32, or the weights in BF16, F16 or Q8_0: see
// write_checkpoint), optionally the tokenizer (tokenizer.model, or tokenizer.json and
// tokenizer_config.json), and for training state further files. A
// directory is written whole into a temporary sibling and then swapped into place, so a reader
// never sees a half-written checkpoint.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/model/model.h"
#include "engine/model/safetensors.h"

namespace tmx {

struct CheckpointWriteOptions {
    StorageType dtype = StorageType::F32;
    // A tokenizer copied in when not empty: a .model file (as tokenizer.model), a tokenizer.json
    // (with the tokenizer_config.json beside it), or a directory holding either.
    std::string tokenizer_path;
    std::string tokenizer_model;  // else these bytes as tokenizer.model, when not empty
    bool overwrite = false;       // replace an existing checkpoint directory
    // Extra files written beside the model (name -> contents), e.g. optimizer state.
    std::map<std::string, std::string> extra_files;
};

void save_checkpoint(const Model& model, const std::string& dir,
                     const CheckpointWriteOptions& options = {});

// Fills `out` (numel floats) with the named parameter's values.
using TensorSource = std::function<void(const ParamSpec& spec, float* out)>;

// Writes a checkpoint of `config` without a Model: `weights` is asked for each parameter in
// turn (the import path: memory stays near one tensor). save_checkpoint is this with the
// model's parameters.
void write_checkpoint(const ModelConfig& config, const std::string& dir,
                      const CheckpointWriteOptions& options, const TensorSource& weights);

// The config stored in a checkpoint directory.
ModelConfig load_checkpoint_config(const std::string& dir);

// Loads model.safetensors into `model`, checking that every tensor is present with the
// shape the config needs, finite, and that there are no others. Each is converted to the dtype
// the model stores it in.
void load_checkpoint_weights(Model& model, const std::string& dir);

// A tmx::Error naming the file and tensor when data (shape's elements) holds NaN or infinity:
// "PATH: tensor 'NAME' holds NaN at element I of [SHAPE] (WHAT must be finite)". One pass,
// cheap next to reading the data.
void check_finite_tensor(const std::string& path, const std::string& name, const Shape& shape,
                         const float* data, const char* what);

// The format the checkpoint's weights are stored in (engine/compute/weight_format.h): F32, BF16,
// F16 or Q8_0.
DType checkpoint_weight_format(const std::string& dir);

// Config + weights on `backend`, the weights in `weight_format` (converted as they load), or by
// default in the checkpoint's own format where the backend holds it, else in f32. A checkpoint
// with NaN or infinite weights is refused, naming the tensor.
std::unique_ptr<Model> load_model(const std::string& dir, Backend& backend,
                                  std::optional<DType> weight_format = std::nullopt);

// The path of the tokenizer in a directory (a checkpoint, a dataset, a Hugging Face model):
// DIR/tokenizer.model, else DIR/tokenizer.json; "" when it has neither.
std::string checkpoint_tokenizer(const std::string& dir);

// Whether a tokenizer file is a tokenizer.json (by its name, or a first '{' in `head`, its
// first bytes), not a SentencePiece .model.
bool is_tokenizer_json(const std::string& file, std::string_view head);

// The files that carry the tokenizer at `path` (a .model file, a tokenizer.json, or a directory
// with either) into a checkpoint or dataset, as (name there, source file): tokenizer.model or
// tokenizer.json, and the tokenizer_config.json beside it when there is one (a tokenizer.json's
// BOS/EOS tokens; either's chat template). A tmx::Error naming `path` when there is no
// tokenizer.
std::vector<std::pair<std::string, std::string>> tokenizer_files(const std::string& path);

}  // namespace tmx

// The weights of a Hugging Face model directory: model.safetensors, or the shards that
// model.safetensors.index.json lists. The index is untrusted input (a fuzz target reads it):
// every tensor it names must be in the shard it names, every tensor of a shard must be in the
// index under that shard, and shards are files beside the index, never paths elsewhere.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "engine/model/safetensors.h"

namespace tmx::interop {

class HfWeights {
  public:
    // Opens the directory's weights; a tmx::Error naming the file and field otherwise.
    explicit HfWeights(const std::string& dir);
    // Tensor name -> the shard holding it (each shard opened once).
    const std::map<std::string, std::shared_ptr<SafetensorsFile>>& tensors() const {
        return where_;
    }

  private:
    void read_index(const std::string& dir, const std::string& path);
    std::map<std::string, std::shared_ptr<SafetensorsFile>> where_;
};

}  // namespace tmx::interop

// The kinds of activation and norm an op computes. The model's config chooses them by name
// (engine/model/config.h parses and prints them); the backends compute them.
#pragma once

namespace tmx {

enum class Activation { Gelu, Silu, Relu, Relu2 };
enum class NormType { LayerNorm, RmsNorm };

}  // namespace tmx

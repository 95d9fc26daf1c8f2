// The SPIR-V modules compiled from shaders/*.comp at build time (cmake/EmbedSpirv.cmake
// generates the definition): the binary carries its shaders, nothing is read at run time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace tmx::vk {

struct EmbeddedShader {
    const char* name;  // the .comp file's name without extension
    const uint32_t* code;
    size_t words;
};

std::span<const EmbeddedShader> embedded_shaders();

}  // namespace tmx::vk

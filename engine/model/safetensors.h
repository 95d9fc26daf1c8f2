// Reading and writing safetensors files (8-byte little-endian header length, a JSON header
// mapping tensor names to dtype, shape and byte offsets, then the raw data).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/compute/tensor.h"

namespace tmx {

enum class StorageType { F32, BF16, F16, F64 };  // F16 and F64 are read, not written

struct SafetensorsEntry {
    StorageType dtype;
    Shape shape;
    uint64_t begin = 0, end = 0;  // byte offsets into the data section
};

// A parsed file: the header is validated at open (offsets inside the file, sizes that match
// shapes and dtypes); tensors are converted to fp32 on request.
class SafetensorsFile {
  public:
    explicit SafetensorsFile(const std::string& path);
    const std::string& path() const { return path_; }
    const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }
    // Converts the named tensor to fp32 into `out` (numel floats).
    void read_f32(const std::string& name, float* out) const;

  private:
    std::string path_;
    std::string bytes_;
    size_t data_start_ = 0;
    std::map<std::string, SafetensorsEntry> entries_;
};

struct HostTensorRef {
    std::string name;
    Shape shape;
    const float* data;  // numel fp32 values
};

// Serialises tensors (sorted by name) as F32 or BF16 (round to nearest even).
std::string encode_safetensors(const std::vector<HostTensorRef>& tensors, StorageType dtype);

const char* to_string(StorageType t);
StorageType parse_storage_type(const std::string& name);  // "f32"/"bf16" (flag values)

uint16_t f32_to_bf16(float f);
float bf16_to_f32(uint16_t b);
float f16_to_f32(uint16_t h);

}  // namespace tmx

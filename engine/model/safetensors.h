// Reading and writing safetensors files (8-byte little-endian header length, a JSON header
// mapping tensor names to dtype, shape and byte offsets, then the raw data).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/compute/tensor.h"
#include "engine/core/file_io.h"

namespace tmx {

enum class StorageType { F32, BF16, F16, F64 };  // F16 and F64 are read, not written

struct SafetensorsEntry {
    StorageType dtype;
    Shape shape;
    uint64_t begin = 0, end = 0;  // byte offsets into the data section
};

// A parsed file: the header is validated at open (offsets inside the file, sizes that match
// shapes and dtypes); tensors are read from the file and converted to fp32 on request, one at
// a time, so memory stays near the largest tensor, not the file.
class SafetensorsFile {
  public:
    explicit SafetensorsFile(const std::string& path);
    ~SafetensorsFile();
    SafetensorsFile(const SafetensorsFile&) = delete;
    SafetensorsFile& operator=(const SafetensorsFile&) = delete;

    const std::string& path() const { return path_; }
    const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }
    // The named entry; a tmx::Error naming the file and tensor when there is none.
    const SafetensorsEntry& entry(const std::string& name) const;
    // Converts the named tensor to fp32 into `out` (numel floats).
    void read_f32(const std::string& name, float* out) const;

  private:
    void open_checked();  // the header's checks, on the open file

    std::string path_;
    int fd_ = -1;
    uint64_t data_start_ = 0;
    std::map<std::string, SafetensorsEntry> entries_;
};

// One tensor of a file to write: its name, shape and the dtype it is stored in.
struct SafetensorsEntryPlan {
    std::string name;
    Shape shape;
    StorageType dtype = StorageType::F32;
};

// Writes a safetensors file tensor by tensor: the header (from the plan, data in plan order) at
// construction, then each tensor's fp32 values converted to its dtype; finish() puts the file
// in place atomically. Memory: a few MB besides the caller's values.
class SafetensorsWriter {
  public:
    SafetensorsWriter(const std::string& path, const std::vector<SafetensorsEntryPlan>& tensors);
    // The next tensor of the plan: numel fp32 values.
    void write_next(const float* data);
    void finish();

  private:
    AtomicFileWriter out_;
    std::vector<SafetensorsEntryPlan> plan_;
    size_t next_ = 0;
    std::string scratch_;
};

// n fp32 values as little-endian F32, BF16 or F16 bytes (round to nearest even) into `out`.
void encode_f32_as(StorageType dtype, const float* data, size_t n, std::string& out);

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
// Round to nearest even; beyond 65504 rounds to infinity; NaN stays NaN.
uint16_t f32_to_f16(float f);

}  // namespace tmx

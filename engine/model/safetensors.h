// Reading and writing safetensors files (8-byte little-endian header length, a JSON header
// mapping tensor names to dtype, shape and byte offsets, then the raw data).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/compute/tensor.h"
#include "engine/compute/weight_format.h"  // f16_to_f32, f32_to_f16
#include "engine/core/file_io.h"

namespace tmx {

// F64 is read, not written. Q8_0 (GGUF's blocks of 32 values: an f16 scale and 32 int8) has no
// safetensors dtype: this engine stores a Q8_0 tensor of shape [..., C] as dtype "U8" of shape
// [..., C / 32, 34], each row of 34 bytes one block as GGUF lays it out (little-endian f16 scale,
// then 32 int8), and reads such a U8 tensor back as Q8_0 (any other U8 shape is refused).
enum class StorageType { F32, BF16, F16, F64, Q8_0 };

// The tensor dtype of stored values (F64: F32).
DType storage_dtype(StorageType t);
StorageType storage_of(DType t);  // F32, BF16, F16, Q8_0

struct SafetensorsEntry {
    StorageType dtype;
    Shape shape;                  // the tensor's (for Q8_0 not the U8 blocks' shape in the header)
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
    // The named tensor's bytes as stored (dtype_bytes(storage_dtype(dtype), numel) of them).
    void read_raw(const std::string& name, void* out) const;

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

// n fp32 values as little-endian F32, BF16 or F16 bytes (round to nearest even), or Q8_0
// blocks (n a multiple of 32), into `out`.
void encode_f32_as(StorageType dtype, const float* data, size_t n, std::string& out);

struct HostTensorRef {
    std::string name;
    Shape shape;
    const float* data;  // numel fp32 values
};

// Serialises tensors (sorted by name) as F32 or BF16 (round to nearest even).
std::string encode_safetensors(const std::vector<HostTensorRef>& tensors, StorageType dtype);

const char* to_string(StorageType t);
// "f32", "bf16", "f16" or "q8_0" (flag values); anything else is a tmx::UsageError.
StorageType parse_storage_type(const std::string& name);

uint16_t f32_to_bf16(float f);
float bf16_to_f32(uint16_t b);

}  // namespace tmx

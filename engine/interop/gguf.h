// The GGUF v3 file format (ggml's docs/gguf.md): a streaming writer, a reader that treats its
// file as hostile, and the Q8_0 block quantisation. The format only: what the tensors and
// metadata mean for a model is the caller's business.
//
// Layout (little-endian): "GGUF", uint32 version, uint64 tensor_count, uint64 metadata_kv_count;
// the metadata (gguf string key, uint32 value type, value); the tensor infos (name, uint32
// n_dims, uint64 dims[n_dims] with dims[0] varying fastest, uint32 ggml type, uint64 offset into
// the data section); zero padding to `general.alignment` (default 32); the tensor data, each
// tensor starting at a multiple of the alignment. A gguf string is a uint64 length and that many
// bytes, without a NUL.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/compute/weight_format.h"
#include "engine/core/file_io.h"
#include "engine/model/safetensors.h"

namespace tmx::gguf {

inline constexpr uint32_t kVersion = 3;
inline constexpr uint32_t kDefaultAlignment = 32;
inline constexpr const char* kAlignmentKey = "general.alignment";
inline constexpr uint32_t kMaxDims = 4;       // GGML_MAX_DIMS
inline constexpr size_t kMaxTensorName = 63;  // GGML_MAX_NAME (64) less the NUL
inline constexpr uint64_t kQ8_0BlockValues = tmx::kQ8_0BlockValues;  // QK8_0
inline constexpr uint64_t kQ8_0BlockBytes = tmx::kQ8_0BlockBytes;    // f16 scale + 32 int8

enum class ValueType : uint32_t {
    UINT8 = 0,
    INT8 = 1,
    UINT16 = 2,
    INT16 = 3,
    UINT32 = 4,
    INT32 = 5,
    FLOAT32 = 6,
    BOOL = 7,
    STRING = 8,
    ARRAY = 9,
    UINT64 = 10,
    INT64 = 11,
    FLOAT64 = 12,
};

enum class TensorType : uint32_t { F32 = 0, F16 = 1, Q8_0 = 8, BF16 = 30 };

const char* to_string(ValueType t);   // "uint8", ..., "string", "array"
const char* to_string(TensorType t);  // "F32", "F16", "Q8_0", "BF16"

// Bytes of `numel` elements of a type; Q8_0 needs a multiple of 32. A size that overflows, or a
// Q8_0 count that is not a multiple of 32, is a tmx::Error.
uint64_t tensor_bytes(TensorType t, uint64_t numel);

// A metadata value: a scalar, a string, or an array of scalars or of strings (arrays of arrays
// are not supported). Scalars keep their little-endian bits in `bits`, zero-extended (a float32
// as its 32 bits, a bool as 0 or 1); numeric and bool arrays keep their elements as the file
// stores them, in `raw`.
struct Value {
    ValueType type = ValueType::UINT8;
    ValueType array_type = ValueType::UINT8;  // the element type when type == ARRAY
    uint64_t bits = 0;                        // scalar payload
    std::string str;                          // STRING
    std::vector<std::string> strings;         // ARRAY of STRING
    std::string raw;                          // ARRAY of a scalar type: count * size bytes

    static Value u8(uint8_t x);
    static Value i8(int8_t x);
    static Value u16(uint16_t x);
    static Value i16(int16_t x);
    static Value u32(uint32_t x);
    static Value i32(int32_t x);
    static Value u64(uint64_t x);
    static Value i64(int64_t x);
    static Value f32(float x);
    static Value f64(double x);
    static Value boolean(bool b);
    static Value string(std::string s);
    static Value string_array(std::vector<std::string> v);
    static Value f32_array(const std::vector<float>& v);
    static Value f64_array(const std::vector<double>& v);
    static Value i32_array(const std::vector<int32_t>& v);
    static Value u32_array(const std::vector<uint32_t>& v);
    static Value i64_array(const std::vector<int64_t>& v);
    static Value u64_array(const std::vector<uint64_t>& v);
    static Value bool_array(const std::vector<bool>& v);
    // An array of any scalar element type (not STRING or ARRAY) from its little-endian bytes.
    static Value scalar_array(ValueType element, std::string raw_bytes);

    bool is_array() const { return type == ValueType::ARRAY; }
    uint64_t size() const;       // the number of array elements (0 for a scalar)
    Value at(uint64_t i) const;  // array element i as a scalar Value (or a STRING)

    // Scalar conversions: false when the value is not of a fitting kind.
    bool to_u64(uint64_t& out) const;  // any integer type holding a value >= 0
    bool to_i64(int64_t& out) const;   // any integer type holding a value <= INT64_MAX
    bool to_f64(double& out) const;    // FLOAT32 or FLOAT64
    bool to_bool(bool& out) const;     // BOOL

    std::string type_name() const;  // "uint32", "string", "array of float32", ...
};

struct TensorInfo {
    std::string name;
    std::vector<uint64_t>
        dims;  // dims[0] varies fastest: a row-major [out, in] matrix is {in, out}
    TensorType type = TensorType::F32;
    uint64_t offset = 0;  // relative to the start of the tensor data section
    uint64_t bytes = 0;
    uint64_t numel = 0;
};

// Writes a GGUF file in one pass: add() metadata and add_tensor() the tensors, write_header(),
// then the data of each tensor in the order added (append() in chunks of any size, or
// append_f32() converting from fp32), then finish(). The file is written to a temporary
// sibling and renamed onto `path` by finish() after an fsync, so a reader sees the old file or
// the complete new one; a Writer destroyed without finish() removes its temporary file.
class Writer {
  public:
    explicit Writer(std::string path);
    ~Writer();
    Writer(const Writer&) = delete;
    Writer& operator=(const Writer&) = delete;

    // Metadata in insertion order; a duplicate key is an error. `general.alignment` must be a
    // UINT32 power of two and sets the alignment of the data.
    void add(const std::string& key, Value v);
    // A tensor of 1 to 4 dims, each > 0 (dims[0] fastest); a duplicate name is an error, and
    // so is a name over 63 bytes (ggml's limit) or a Q8_0 tensor whose dims[0] is not a
    // multiple of 32.
    void add_tensor(const std::string& name, std::vector<uint64_t> dims, TensorType type);
    const std::vector<TensorInfo>& tensors() const { return tensors_; }
    uint32_t alignment() const { return alignment_; }

    void write_header();
    // Raw bytes of the current tensor, already in its type; moves on to the next tensor when
    // the current one is complete. More bytes than the tensors hold is an error.
    void append(const void* bytes, size_t n);
    // fp32 values converted to the current tensor's type (round to nearest even for F16 and
    // BF16; Q8_0 in whole blocks: n a multiple of 32 and the tensor's byte position at a block).
    void append_f32(const float* x, size_t n);
    // Pads, flushes, fsyncs and renames onto the final path. Every tensor must be complete.
    void finish();

  private:
    void check_data_state() const;
    void write_out(const void* p, size_t n);
    void flush_buffer();
    void pad_to_alignment();
    void advance_after_data();
    std::string path_;
    AtomicFileWriter out_;
    enum class State { Adding, Data, Finished } state_ = State::Adding;
    uint32_t alignment_ = kDefaultAlignment;
    std::vector<std::pair<std::string, Value>> metadata_;
    std::vector<TensorInfo> tensors_;
    std::unordered_map<std::string, size_t> keys_, names_;
    uint64_t next_offset_ = 0;   // where the next tensor added will start
    uint64_t written_ = 0;       // bytes written to the file so far
    size_t current_ = 0;         // the tensor whose data append() writes
    uint64_t current_done_ = 0;  // bytes of it written
    std::string buffer_;
};

// A GGUF file (version 3; version 2, the same little-endian layout, is read too), validated
// completely at open: the header, every metadata value, every tensor info (dims, type, size,
// alignment, inside the file, no two tensors overlapping). Tensor data stays in the file and is
// read on request with pread, in bounded chunks. Every problem is a tmx::Error whose text starts
// with the path and names the key or tensor at fault.
class Reader {
  public:
    explicit Reader(const std::string& path);
    ~Reader();
    Reader(const Reader&) = delete;
    Reader& operator=(const Reader&) = delete;

    const std::string& path() const { return path_; }
    uint32_t version() const { return version_; }
    uint64_t file_size() const { return file_size_; }
    uint32_t alignment() const { return alignment_; }
    uint64_t data_offset() const { return data_offset_; }  // absolute start of tensor data

    const std::vector<std::pair<std::string, Value>>& metadata() const { return metadata_; }
    const Value* find(const std::string& key) const;  // nullptr when absent
    bool has(const std::string& key) const { return find(key) != nullptr; }

    // Typed getters: a missing key, or a value of another kind or out of range, is a tmx::Error
    // "PATH: metadata 'KEY': expected ..., got ...".
    uint32_t get_u32(const std::string& key) const;  // any integer type that fits
    uint64_t get_u64(const std::string& key) const;
    int64_t get_i64(const std::string& key) const;
    float get_f32(const std::string& key) const;  // FLOAT32 or FLOAT64
    double get_f64(const std::string& key) const;
    bool get_bool(const std::string& key) const;
    const std::string& get_string(const std::string& key) const;
    const std::vector<std::string>& get_string_array(const std::string& key) const;
    std::vector<float> get_f32_array(const std::string& key) const;    // FLOAT32/FLOAT64 arrays
    std::vector<int32_t> get_i32_array(const std::string& key) const;  // integer arrays that fit
    std::vector<uint32_t> get_u32_array(const std::string& key) const;

    const std::vector<TensorInfo>& tensors() const { return tensors_; }
    const TensorInfo* find_tensor(const std::string& name) const;  // nullptr when absent

    // Elements [first, first + count) of a tensor of this file, converted to fp32 into `out`
    // (F16 and BF16 widened, Q8_0 dequantised: first and count multiples of 32).
    void read_f32(const TensorInfo& t, uint64_t first, uint64_t count, float* out) const;
    // Bytes [first, first + n) of a tensor's data, as stored.
    void read_raw(const TensorInfo& t, uint64_t first, uint64_t n, void* out) const;

  private:
    void parse();
    const Value& get(const std::string& key) const;
    [[noreturn]] void fail_type(const std::string& key, const std::string& expected,
                                const Value& got) const;
    void pread_exact(uint64_t offset, void* out, uint64_t n, const std::string& what) const;
    void check_tensor(const TensorInfo& t) const;

    std::string path_;
    int fd_ = -1;
    uint64_t file_size_ = 0;
    uint32_t version_ = 0;
    uint32_t alignment_ = kDefaultAlignment;
    uint64_t data_offset_ = 0;
    std::vector<std::pair<std::string, Value>> metadata_;
    std::unordered_map<std::string, size_t> keys_, names_;
    std::vector<TensorInfo> tensors_;
};

// The Q8_0 block conversions and fp32 to IEEE half (engine/compute/weight_format.h).
using tmx::dequantize_q8_0;
using tmx::f32_to_f16;
using tmx::quantize_q8_0;

}  // namespace tmx::gguf

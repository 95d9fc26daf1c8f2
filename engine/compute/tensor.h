// Tensors: a typed, shaped view into a backend's device buffer. A Tensor owns nothing but a
// reference to its buffer; views into one buffer (e.g. each expert's weights inside the
// stacked expert tensor) share it. Data lives on the device; only backends touch it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

namespace tmx {

// BF16 holds bfloat16 values: the upper 16 bits of an fp32 (round_to_bf16 in
// engine/compute/precision.h gives the value an fp32 rounds to). Backends with bf16 matmuls have
// them (engine/compute/backend.h). F16 (IEEE half) and Q8_0 (GGUF's blocks of 32 values: an f16
// scale and 32 int8) are formats weights may be stored in for inference
// (engine/compute/weight_format.h); a Q8_0 tensor's element count and offset are whole blocks.
enum class DType : uint8_t { F32, I32, BF16, F16, Q8_0 };

// Bytes of n elements of t (for Q8_0, n / 32 blocks of 34 bytes; n must be whole blocks).
inline int64_t dtype_bytes(DType t, int64_t n) {
    switch (t) {
        case DType::BF16:
        case DType::F16:
            return 2 * n;
        case DType::Q8_0:
            return n / 32 * 34;
        default:
            return 4 * n;
    }
}
const char* to_string(DType t);

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& s);
std::string shape_string(const Shape& s);

// Backend-owned memory. Each backend subclasses it with its own handle.
class DeviceBuffer {
  public:
    explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {}
    virtual ~DeviceBuffer() = default;
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    size_t bytes() const { return bytes_; }

  private:
    size_t bytes_;
};

class Tensor {
  public:
    Tensor() = default;
    Tensor(std::shared_ptr<DeviceBuffer> buffer, Shape shape, DType dtype, int64_t offset = 0);

    bool defined() const { return buffer_ != nullptr; }
    const Shape& shape() const { return shape_; }
    DType dtype() const { return dtype_; }
    int64_t offset() const { return offset_; }  // in elements from the buffer's start
    int64_t numel() const { return shape_numel(shape_); }
    size_t bytes() const { return static_cast<size_t>(dtype_bytes(dtype_, numel())); }
    int rank() const { return static_cast<int>(shape_.size()); }
    int64_t dim(int i) const { return shape_.at(i < 0 ? i + rank() : i); }
    DeviceBuffer* buffer() const { return buffer_.get(); }

    // The same elements with another shape (same element count).
    Tensor reshape(Shape shape) const;
    // Elements [offset, offset + numel(shape)) of this tensor, with the given shape.
    Tensor slice(int64_t offset, Shape shape) const;
    // Rows [begin, end) along the first dimension.
    Tensor rows(int64_t begin, int64_t end) const;
    // This tensor and `next` as one view of the given shape, when next's elements directly
    // follow this tensor's in the same buffer (a decoded token's q and k, slices of one
    // projection's row); an undefined tensor otherwise.
    Tensor joined(const Tensor& next, Shape shape) const;

  private:
    std::shared_ptr<DeviceBuffer> buffer_;
    Shape shape_;
    DType dtype_ = DType::F32;
    int64_t offset_ = 0;
};

}  // namespace tmx

#include "engine/compute/tensor.h"

#include <stdexcept>

#include "engine/core/checked_math.h"

namespace tmx {

const char* to_string(DType t) {
    switch (t) {
        case DType::F32:
            return "f32";
        case DType::I32:
            return "i32";
        case DType::BF16:
            return "bf16";
        case DType::F16:
            return "f16";
        case DType::Q8_0:
            return "q8_0";
    }
    return "unknown dtype";
}

int64_t shape_numel(const Shape& s) {
    // Checked inline rather than through checked_mul: this runs on every tensor op, and the
    // context string is only worth building on failure.
    int64_t n = 1;
    for (int64_t d : s)
        if (__builtin_mul_overflow(n, d, &n))
            throw_int64_overflow("tensor shape " + shape_string(s));
    return n;
}

std::string shape_string(const Shape& s) {
    std::string out = "[";
    for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + "]";
}

Tensor::Tensor(std::shared_ptr<DeviceBuffer> buffer, Shape shape, DType dtype, int64_t offset)
    : buffer_(std::move(buffer)), shape_(std::move(shape)), dtype_(dtype), offset_(offset) {
    for (int64_t d : shape_)
        if (d < 0) throw std::logic_error("negative tensor dimension " + shape_string(shape_));
    if (dtype_ == DType::Q8_0 && (offset_ % 32 != 0 || numel() % 32 != 0))
        throw std::logic_error("q8_0 tensor " + shape_string(shape_) + " at offset " +
                               std::to_string(offset_) + " is not whole blocks of 32");
    if (!buffer_) return;
    const int64_t end = checked_add(offset_, numel(), "tensor offset");
    checked_mul(end, int64_t{4}, "tensor bytes");  // so dtype_bytes(end) cannot overflow
    if (offset_ < 0 || dtype_bytes(dtype_, end) > static_cast<int64_t>(buffer_->bytes()))
        throw std::logic_error("tensor " + shape_string(shape_) + " at offset " +
                               std::to_string(offset_) + " overruns its buffer");
}

Tensor Tensor::reshape(Shape shape) const {
    if (shape_numel(shape) != numel())
        throw std::logic_error("reshape " + shape_string(shape_) + " -> " + shape_string(shape));
    return Tensor(buffer_, std::move(shape), dtype_, offset_);
}

Tensor Tensor::slice(int64_t offset, Shape shape) const {
    if (offset < 0 || checked_add(offset, shape_numel(shape), "tensor slice") > numel())
        throw std::logic_error("slice at " + std::to_string(offset) + " of " + shape_string(shape) +
                               " outside " + shape_string(shape_));
    return Tensor(buffer_, std::move(shape), dtype_, offset_ + offset);
}

Tensor Tensor::joined(const Tensor& next, Shape shape) const {
    if (!defined() || buffer_ != next.buffer_ || dtype_ != next.dtype_ ||
        next.offset_ != offset_ + numel() || shape_numel(shape) != numel() + next.numel())
        return Tensor{};
    return Tensor(buffer_, std::move(shape), dtype_, offset_);
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
    int64_t row = numel() / (shape_.empty() || shape_[0] == 0 ? 1 : shape_[0]);
    Shape s = shape_;
    s[0] = end - begin;
    return slice(begin * row, s);
}

}  // namespace tmx

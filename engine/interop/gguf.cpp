#include "engine/interop/gguf.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <new>
#include <numeric>

#include "engine/core/checked_math.h"
#include "engine/core/errors.h"
#include "engine/core/file_io.h"
#include "engine/model/safetensors.h"

namespace tmx::gguf {

static_assert(std::endian::native == std::endian::little,
              "GGUF is read and written as the host's bytes: a little-endian host is required");

namespace {

constexpr char kMagic[4] = {'G', 'G', 'U', 'F'};

// Bytes of one scalar of a type; 0 for STRING, ARRAY and unknown types.
uint64_t scalar_size(uint32_t t) {
    switch (static_cast<ValueType>(t)) {
        case ValueType::UINT8:
        case ValueType::INT8:
        case ValueType::BOOL:
            return 1;
        case ValueType::UINT16:
        case ValueType::INT16:
            return 2;
        case ValueType::UINT32:
        case ValueType::INT32:
        case ValueType::FLOAT32:
            return 4;
        case ValueType::UINT64:
        case ValueType::INT64:
        case ValueType::FLOAT64:
            return 8;
        case ValueType::STRING:
        case ValueType::ARRAY:
            return 0;
    }
    return 0;
}

bool known_value_type(uint32_t t) {
    return t <= static_cast<uint32_t>(ValueType::FLOAT64);
}

bool known_tensor_type(uint32_t t) {
    switch (static_cast<TensorType>(t)) {
        case TensorType::F32:
        case TensorType::F16:
        case TensorType::Q8_0:
        case TensorType::BF16:
            return true;
    }
    return false;
}

bool is_signed(ValueType t) {
    return t == ValueType::INT8 || t == ValueType::INT16 || t == ValueType::INT32 ||
           t == ValueType::INT64;
}

bool is_unsigned(ValueType t) {
    return t == ValueType::UINT8 || t == ValueType::UINT16 || t == ValueType::UINT32 ||
           t == ValueType::UINT64;
}

// The signed value of a signed scalar's bits.
int64_t sign_extend(ValueType t, uint64_t bits) {
    switch (t) {
        case ValueType::INT8:
            return static_cast<int8_t>(static_cast<uint8_t>(bits));
        case ValueType::INT16:
            return static_cast<int16_t>(static_cast<uint16_t>(bits));
        case ValueType::INT32:
            return static_cast<int32_t>(static_cast<uint32_t>(bits));
        default:
            return static_cast<int64_t>(bits);
    }
}

bool is_power_of_two(uint64_t x) {
    return x != 0 && (x & (x - 1)) == 0;
}

uint64_t align_up(uint64_t x, uint64_t alignment) {
    const uint64_t rem = x % alignment;
    return rem == 0 ? x : x + (alignment - rem);
}

std::string quote(const std::string& s) {
    return "'" + s + "'";
}

// A scalar's value in words, for error messages: "int32 -5", "float32 0.5", "string".
std::string describe(const Value& v) {
    std::string out = v.type_name();
    uint64_t u = 0;
    int64_t i = 0;
    double f = 0;
    if (is_signed(v.type) && v.to_i64(i)) return out + " " + std::to_string(i);
    if (is_unsigned(v.type) && v.to_u64(u)) return out + " " + std::to_string(u);
    if (v.to_f64(f)) {
        char buf[64];
        std::snprintf(buf, sizeof buf, " %.9g", f);
        return out + buf;
    }
    return out;
}

// A little-endian scalar appended to a byte string.
template <typename T>
void put(std::string& out, T x) {
    char b[sizeof(T)];
    std::memcpy(b, &x, sizeof(T));
    out.append(b, sizeof(T));
}

void put_string(std::string& out, const std::string& s) {
    put<uint64_t>(out, s.size());
    out += s;
}

// Reads the header region of a file sequentially through a buffer, refusing every read that
// would go past the end of the file before it allocates anything.
class Cursor {
  public:
    Cursor(int fd, const std::string& path, uint64_t size) : fd_(fd), path_(path), size_(size) {}

    uint64_t pos() const { return pos_; }
    uint64_t left() const { return size_ - pos_; }

    [[noreturn]] void fail(const std::string& what, const std::string& msg) const {
        throw Error(path_ + ": " + what + ": " + msg);
    }

    // `n` bytes at the cursor into `out`; past the end of the file is an error naming `what`.
    void read(void* out, uint64_t n, const std::string& what) {
        if (n > left())
            fail(what, "truncated: needs " + std::to_string(n) + " bytes at offset " +
                           std::to_string(pos_) + ", the file has " + std::to_string(left()) +
                           " left");
        auto* dst = static_cast<char*>(out);
        while (n > 0) {
            if (buf_pos_ == buf_.size()) refill(what);
            const uint64_t take = std::min<uint64_t>(n, buf_.size() - buf_pos_);
            std::memcpy(dst, buf_.data() + buf_pos_, take);
            buf_pos_ += take;
            pos_ += take;
            dst += take;
            n -= take;
        }
    }

    template <typename T>
    T scalar(const std::string& what) {
        T x;
        read(&x, sizeof(T), what);
        return x;
    }

    std::string str(const std::string& what) {
        const uint64_t n = scalar<uint64_t>(what + " length");
        if (n > left())
            fail(what, "string length " + std::to_string(n) + " at offset " +
                           std::to_string(pos_ - 8) + " exceeds the file (" +
                           std::to_string(left()) + " bytes left)");
        std::string s(n, '\0');
        read(s.data(), n, what);
        return s;
    }

  private:
    void refill(const std::string& what) {
        const uint64_t n = std::min<uint64_t>(kChunk, left());
        buf_.resize(n);
        buf_pos_ = 0;
        read_exact_at(fd_, buf_.data(), static_cast<size_t>(n), pos_, path_ + ": " + what);
    }

    static constexpr uint64_t kChunk = 1 << 20;
    int fd_;
    const std::string& path_;
    uint64_t size_;
    uint64_t pos_ = 0;
    std::string buf_;
    size_t buf_pos_ = 0;
};

// One value of type `t` at the cursor; `what` names the key for errors.
Value read_value(Cursor& cur, uint32_t t, const std::string& what) {
    if (!known_value_type(t)) cur.fail(what, "unknown value type " + std::to_string(t));
    Value v;
    v.type = static_cast<ValueType>(t);
    if (v.type == ValueType::STRING) {
        v.str = cur.str(what);
        return v;
    }
    if (v.type != ValueType::ARRAY) {
        const uint64_t size = scalar_size(t);
        cur.read(&v.bits, size, what);
        if (v.type == ValueType::BOOL && v.bits > 1)
            cur.fail(what, "bool value " + std::to_string(v.bits) + ", expected 0 or 1");
        return v;
    }
    const uint32_t et = cur.scalar<uint32_t>(what + " array element type");
    if (et == static_cast<uint32_t>(ValueType::ARRAY))
        cur.fail(what, "arrays of arrays are not supported");
    if (!known_value_type(et)) cur.fail(what, "unknown array element type " + std::to_string(et));
    v.array_type = static_cast<ValueType>(et);
    const uint64_t count = cur.scalar<uint64_t>(what + " array length");
    if (v.array_type == ValueType::STRING) {
        // Each string takes at least its 8-byte length.
        if (count > cur.left() / 8)
            cur.fail(what, "array of " + std::to_string(count) + " strings exceeds the file (" +
                               std::to_string(cur.left()) + " bytes left)");
        v.strings.reserve(count);
        for (uint64_t i = 0; i < count; ++i)
            v.strings.push_back(cur.str(what + " element " + std::to_string(i)));
        return v;
    }
    const uint64_t size = scalar_size(et);
    if (count > cur.left() / size)
        cur.fail(what, "array of " + std::to_string(count) + " " + to_string(v.array_type) +
                           " exceeds the file (" + std::to_string(cur.left()) + " bytes left)");
    v.raw.resize(count * size);
    cur.read(v.raw.data(), count * size, what);
    if (v.array_type == ValueType::BOOL)
        for (uint64_t i = 0; i < count; ++i)
            if (static_cast<uint8_t>(v.raw[i]) > 1)
                cur.fail(what, "bool element " + std::to_string(i) + " is " +
                                   std::to_string(static_cast<uint8_t>(v.raw[i])) +
                                   ", expected 0 or 1");
    return v;
}

// Checks what a writer is given: no arrays of arrays, raw bytes a whole number of elements.
void check_value(const Value& v, const std::string& what) {
    if (!known_value_type(static_cast<uint32_t>(v.type)))
        throw Error(what + ": unknown value type " + std::to_string(static_cast<uint32_t>(v.type)));
    if (v.type != ValueType::ARRAY) return;
    const uint32_t et = static_cast<uint32_t>(v.array_type);
    if (v.array_type == ValueType::ARRAY)
        throw Error(what + ": arrays of arrays are not supported");
    if (!known_value_type(et))
        throw Error(what + ": unknown array element type " + std::to_string(et));
    if (v.array_type != ValueType::STRING && v.raw.size() % scalar_size(et) != 0)
        throw Error(what + ": " + std::to_string(v.raw.size()) +
                    " bytes are not a whole number of " + to_string(v.array_type));
}

void serialize_value(std::string& out, const Value& v) {
    put<uint32_t>(out, static_cast<uint32_t>(v.type));
    if (v.type == ValueType::STRING) {
        put_string(out, v.str);
    } else if (v.type == ValueType::ARRAY) {
        put<uint32_t>(out, static_cast<uint32_t>(v.array_type));
        put<uint64_t>(out, v.size());
        if (v.array_type == ValueType::STRING)
            for (const auto& s : v.strings) put_string(out, s);
        else
            out += v.raw;
    } else {
        const uint64_t bits = v.bits;
        out.append(reinterpret_cast<const char*>(&bits),
                   scalar_size(static_cast<uint32_t>(v.type)));
    }
}

template <typename T>
Value typed_array(ValueType t, const std::vector<T>& v) {
    std::string raw(v.size() * sizeof(T), '\0');
    if (!v.empty()) std::memcpy(raw.data(), v.data(), raw.size());
    return Value::scalar_array(t, std::move(raw));
}

Value scalar_value(ValueType t, uint64_t bits) {
    Value v;
    v.type = t;
    v.bits = bits;
    return v;
}

}  // namespace

const char* to_string(ValueType t) {
    switch (t) {
        case ValueType::UINT8:
            return "uint8";
        case ValueType::INT8:
            return "int8";
        case ValueType::UINT16:
            return "uint16";
        case ValueType::INT16:
            return "int16";
        case ValueType::UINT32:
            return "uint32";
        case ValueType::INT32:
            return "int32";
        case ValueType::FLOAT32:
            return "float32";
        case ValueType::BOOL:
            return "bool";
        case ValueType::STRING:
            return "string";
        case ValueType::ARRAY:
            return "array";
        case ValueType::UINT64:
            return "uint64";
        case ValueType::INT64:
            return "int64";
        case ValueType::FLOAT64:
            return "float64";
    }
    return "unknown";
}

const char* to_string(TensorType t) {
    switch (t) {
        case TensorType::F32:
            return "F32";
        case TensorType::F16:
            return "F16";
        case TensorType::Q8_0:
            return "Q8_0";
        case TensorType::BF16:
            return "BF16";
    }
    return "unknown";
}

uint64_t tensor_bytes(TensorType t, uint64_t numel) {
    if (numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        throw_int64_overflow(std::string(to_string(t)) + " tensor of " + std::to_string(numel) +
                             " elements");
    const auto n = static_cast<int64_t>(numel);
    const std::string ctx = std::string(to_string(t)) + " tensor bytes";
    switch (t) {
        case TensorType::F32:
            return static_cast<uint64_t>(checked_mul(n, 4, ctx));
        case TensorType::F16:
        case TensorType::BF16:
            return static_cast<uint64_t>(checked_mul(n, 2, ctx));
        case TensorType::Q8_0:
            if (numel % kQ8_0BlockValues != 0)
                throw Error("Q8_0 needs a multiple of 32 elements, got " + std::to_string(numel));
            return static_cast<uint64_t>(checked_mul(n / 32, 34, ctx));
    }
    throw Error("unknown tensor type " + std::to_string(static_cast<uint32_t>(t)));
}

// ---- Value ----

Value Value::u8(uint8_t x) {
    return scalar_value(ValueType::UINT8, x);
}
Value Value::i8(int8_t x) {
    return scalar_value(ValueType::INT8, static_cast<uint8_t>(x));
}
Value Value::u16(uint16_t x) {
    return scalar_value(ValueType::UINT16, x);
}
Value Value::i16(int16_t x) {
    return scalar_value(ValueType::INT16, static_cast<uint16_t>(x));
}
Value Value::u32(uint32_t x) {
    return scalar_value(ValueType::UINT32, x);
}
Value Value::i32(int32_t x) {
    return scalar_value(ValueType::INT32, static_cast<uint32_t>(x));
}
Value Value::u64(uint64_t x) {
    return scalar_value(ValueType::UINT64, x);
}
Value Value::i64(int64_t x) {
    return scalar_value(ValueType::INT64, static_cast<uint64_t>(x));
}
Value Value::f32(float x) {
    return scalar_value(ValueType::FLOAT32, std::bit_cast<uint32_t>(x));
}
Value Value::f64(double x) {
    return scalar_value(ValueType::FLOAT64, std::bit_cast<uint64_t>(x));
}
Value Value::boolean(bool b) {
    return scalar_value(ValueType::BOOL, b ? 1 : 0);
}

Value Value::string(std::string s) {
    Value v;
    v.type = ValueType::STRING;
    v.str = std::move(s);
    return v;
}

Value Value::string_array(std::vector<std::string> s) {
    Value v;
    v.type = ValueType::ARRAY;
    v.array_type = ValueType::STRING;
    v.strings = std::move(s);
    return v;
}

Value Value::scalar_array(ValueType element, std::string raw_bytes) {
    Value v;
    v.type = ValueType::ARRAY;
    v.array_type = element;
    v.raw = std::move(raw_bytes);
    check_value(v, "gguf::Value::scalar_array");
    return v;
}

Value Value::f32_array(const std::vector<float>& v) {
    return typed_array(ValueType::FLOAT32, v);
}
Value Value::f64_array(const std::vector<double>& v) {
    return typed_array(ValueType::FLOAT64, v);
}
Value Value::i32_array(const std::vector<int32_t>& v) {
    return typed_array(ValueType::INT32, v);
}
Value Value::u32_array(const std::vector<uint32_t>& v) {
    return typed_array(ValueType::UINT32, v);
}
Value Value::i64_array(const std::vector<int64_t>& v) {
    return typed_array(ValueType::INT64, v);
}
Value Value::u64_array(const std::vector<uint64_t>& v) {
    return typed_array(ValueType::UINT64, v);
}
Value Value::bool_array(const std::vector<bool>& v) {
    std::string raw;
    raw.reserve(v.size());
    for (bool b : v) raw.push_back(b ? 1 : 0);
    return scalar_array(ValueType::BOOL, std::move(raw));
}

uint64_t Value::size() const {
    if (type != ValueType::ARRAY) return 0;
    if (array_type == ValueType::STRING) return strings.size();
    const uint64_t s = scalar_size(static_cast<uint32_t>(array_type));
    return s == 0 ? 0 : raw.size() / s;
}

Value Value::at(uint64_t i) const {
    if (type != ValueType::ARRAY || i >= size())
        throw Error("gguf value: element " + std::to_string(i) + " of a " + type_name() + " of " +
                    std::to_string(size()) + " elements");
    if (array_type == ValueType::STRING) return string(strings[i]);
    const uint64_t s = scalar_size(static_cast<uint32_t>(array_type));
    uint64_t bits = 0;
    std::memcpy(&bits, raw.data() + i * s, s);
    return scalar_value(array_type, bits);
}

bool Value::to_u64(uint64_t& out) const {
    if (is_unsigned(type)) {
        out = bits;
        return true;
    }
    if (is_signed(type)) {
        const int64_t x = sign_extend(type, bits);
        if (x < 0) return false;
        out = static_cast<uint64_t>(x);
        return true;
    }
    return false;
}

bool Value::to_i64(int64_t& out) const {
    if (is_signed(type)) {
        out = sign_extend(type, bits);
        return true;
    }
    if (is_unsigned(type)) {
        if (bits > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
        out = static_cast<int64_t>(bits);
        return true;
    }
    return false;
}

bool Value::to_f64(double& out) const {
    if (type == ValueType::FLOAT32) {
        out = std::bit_cast<float>(static_cast<uint32_t>(bits));
        return true;
    }
    if (type == ValueType::FLOAT64) {
        out = std::bit_cast<double>(bits);
        return true;
    }
    return false;
}

bool Value::to_bool(bool& out) const {
    if (type != ValueType::BOOL) return false;
    out = bits != 0;
    return true;
}

std::string Value::type_name() const {
    if (type == ValueType::ARRAY) return std::string("array of ") + to_string(array_type);
    return to_string(type);
}

// ---- Writer ----

Writer::Writer(std::string path) : path_(std::move(path)), out_(path_) {}

Writer::~Writer() = default;  // without finish(), out_ removes its temporary file

void Writer::add(const std::string& key, Value v) {
    const std::string what = path_ + ": metadata " + quote(key);
    if (state_ != State::Adding) throw Error(what + ": added after the header was written");
    if (keys_.count(key)) throw Error(what + ": duplicate key");
    check_value(v, what);
    if (key == kAlignmentKey) {
        if (v.type != ValueType::UINT32 || !is_power_of_two(v.bits))
            throw Error(what + ": must be a uint32 power of two, got " + describe(v));
        alignment_ = static_cast<uint32_t>(v.bits);
    }
    keys_.emplace(key, metadata_.size());
    metadata_.emplace_back(key, std::move(v));
}

void Writer::add_tensor(const std::string& name, std::vector<uint64_t> dims, TensorType type) {
    const std::string what = path_ + ": tensor " + quote(name);
    if (state_ != State::Adding) throw Error(what + ": added after the header was written");
    if (names_.count(name)) throw Error(what + ": duplicate tensor name");
    if (name.size() > kMaxTensorName)
        throw Error(what + ": the name has " + std::to_string(name.size()) +
                    " bytes, ggml allows at most " + std::to_string(kMaxTensorName));
    if (!known_tensor_type(static_cast<uint32_t>(type)))
        throw Error(what + ": unsupported type " + std::to_string(static_cast<uint32_t>(type)));
    if (dims.empty() || dims.size() > kMaxDims)
        throw Error(what + ": " + std::to_string(dims.size()) + " dims, expected 1 to 4");
    int64_t numel = 1;
    for (uint64_t d : dims) {
        if (d == 0 || d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
            throw Error(what + ": dim " + std::to_string(d) + " out of range");
        numel = checked_mul(numel, static_cast<int64_t>(d), what + " element count");
    }
    if (type == TensorType::Q8_0 && dims[0] % kQ8_0BlockValues != 0)
        throw Error(what + ": Q8_0 needs dims[0] (" + std::to_string(dims[0]) +
                    ") to be a multiple of 32");
    TensorInfo t;
    t.name = name;
    t.dims = std::move(dims);
    t.type = type;
    t.numel = static_cast<uint64_t>(numel);
    try {
        t.bytes = tensor_bytes(type, t.numel);
    } catch (const Error& e) {
        throw Error(what + ": " + e.what());
    }
    names_.emplace(name, tensors_.size());
    tensors_.push_back(std::move(t));
}

void Writer::write_out(const void* p, size_t n) {
    written_ += n;
    if (n >= (1u << 20)) {  // large data goes straight to the file, never copied whole
        flush_buffer();
        out_.write(p, n);
        return;
    }
    buffer_.append(static_cast<const char*>(p), n);
    if (buffer_.size() >= (1u << 20)) flush_buffer();
}

void Writer::flush_buffer() {
    out_.write(buffer_);
    buffer_.clear();
}

void Writer::pad_to_alignment() {
    static const char zeros[256] = {};
    uint64_t pad = align_up(written_, alignment_) - written_;
    while (pad > 0) {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(pad, sizeof zeros));
        write_out(zeros, n);
        pad -= n;
    }
}

void Writer::write_header() {
    if (state_ != State::Adding) throw Error(path_ + ": the header is already written");
    uint64_t offset = 0;
    for (auto& t : tensors_) {
        t.offset = offset;
        offset = align_up(static_cast<uint64_t>(checked_add(static_cast<int64_t>(offset),
                                                            static_cast<int64_t>(t.bytes),
                                                            path_ + ": tensor data size")),
                          alignment_);
    }
    std::string h;
    h.append(kMagic, 4);
    put<uint32_t>(h, kVersion);
    put<uint64_t>(h, tensors_.size());
    put<uint64_t>(h, metadata_.size());
    for (const auto& [key, v] : metadata_) {
        put_string(h, key);
        serialize_value(h, v);
    }
    for (const auto& t : tensors_) {
        put_string(h, t.name);
        put<uint32_t>(h, static_cast<uint32_t>(t.dims.size()));
        for (uint64_t d : t.dims) put<uint64_t>(h, d);
        put<uint32_t>(h, static_cast<uint32_t>(t.type));
        put<uint64_t>(h, t.offset);
    }
    write_out(h.data(), h.size());
    pad_to_alignment();
    state_ = State::Data;
    current_ = 0;
    current_done_ = 0;
}

void Writer::check_data_state() const {
    if (state_ != State::Data)
        throw Error(path_ + ": tensor data " +
                    (state_ == State::Adding ? "before the header was written"
                                             : "after the file was finished"));
}

void Writer::append(const void* bytes, size_t n) {
    check_data_state();
    const auto* p = static_cast<const char*>(bytes);
    while (n > 0) {
        if (current_ >= tensors_.size())
            throw Error(path_ + ": more tensor data than the tensors hold");
        const TensorInfo& t = tensors_[current_];
        const size_t take = static_cast<size_t>(std::min<uint64_t>(n, t.bytes - current_done_));
        write_out(p, take);
        p += take;
        n -= take;
        current_done_ += take;
        if (current_done_ == t.bytes) advance_after_data();
    }
}

void Writer::advance_after_data() {
    pad_to_alignment();
    ++current_;
    current_done_ = 0;
}

void Writer::append_f32(const float* x, size_t n) {
    check_data_state();
    if (n == 0) return;
    if (current_ >= tensors_.size())
        throw Error(path_ + ": more tensor data than the tensors hold");
    const TensorInfo& t = tensors_[current_];
    const std::string what = path_ + ": tensor " + quote(t.name);
    const uint64_t elem_done = t.type == TensorType::Q8_0
                                   ? current_done_ / kQ8_0BlockBytes * kQ8_0BlockValues
                                   : current_done_ / (t.type == TensorType::F32 ? 4 : 2);
    if (n > t.numel - elem_done)
        throw Error(what + ": " + std::to_string(n) + " values given, " +
                    std::to_string(t.numel - elem_done) + " left in the tensor");
    if (t.type == TensorType::Q8_0 &&
        (n % kQ8_0BlockValues != 0 || current_done_ % kQ8_0BlockBytes != 0))
        throw Error(what + ": Q8_0 data must be given in whole blocks of 32 values");
    if (t.type != TensorType::Q8_0 && current_done_ % (t.type == TensorType::F32 ? 4 : 2) != 0)
        throw Error(what + ": values appended after a partial element of raw bytes");
    if (t.type == TensorType::F32) {
        append(x, n * sizeof(float));
        return;
    }
    constexpr size_t kChunk = 4096;  // values, a multiple of 32
    std::vector<uint8_t> buf(kChunk / kQ8_0BlockValues * kQ8_0BlockBytes + kChunk * 2);
    for (size_t i = 0; i < n; i += kChunk) {
        const size_t m = std::min(kChunk, n - i);
        size_t bytes = 0;
        if (t.type == TensorType::Q8_0) {
            quantize_q8_0(x + i, m, buf.data());
            bytes = m / kQ8_0BlockValues * kQ8_0BlockBytes;
        } else {
            for (size_t j = 0; j < m; ++j) {
                const uint16_t h =
                    t.type == TensorType::F16 ? f32_to_f16(x[i + j]) : f32_to_bf16(x[i + j]);
                std::memcpy(buf.data() + 2 * j, &h, 2);
            }
            bytes = 2 * m;
        }
        append(buf.data(), bytes);
    }
}

void Writer::finish() {
    if (state_ == State::Finished) throw Error(path_ + ": finished twice");
    if (state_ == State::Adding) write_header();
    if (current_ < tensors_.size())
        throw Error(path_ + ": tensor " + quote(tensors_[current_].name) + " has " +
                    std::to_string(current_done_) + " of its " +
                    std::to_string(tensors_[current_].bytes) + " bytes of data");
    flush_buffer();
    out_.commit();
    state_ = State::Finished;
}

// ---- Reader ----

Reader::Reader(const std::string& path) : path_(path) {
    fd_ = open_regular_file(path_);
    try {
        struct stat st {};
        if (::fstat(fd_, &st) != 0) throw Error(path_ + ": cannot stat: " + std::strerror(errno));
        file_size_ = static_cast<uint64_t>(st.st_size);
        parse();
    } catch (const std::bad_alloc&) {
        ::close(fd_);
        throw Error(path_ + ": out of memory reading the GGUF header");
    } catch (...) {
        ::close(fd_);
        throw;
    }
}

Reader::~Reader() {
    if (fd_ >= 0) ::close(fd_);
}

void Reader::parse() {
    Cursor cur(fd_, path_, file_size_);
    char magic[4];
    cur.read(magic, 4, "GGUF magic");
    if (std::memcmp(magic, kMagic, 4) != 0) cur.fail("GGUF magic", "not a GGUF file (bad magic)");
    version_ = cur.scalar<uint32_t>("GGUF version");
    if (version_ == 1) cur.fail("GGUF version", "version 1 is not supported (only 2 and 3)");
    if (version_ != 2 && version_ != 3) {
        const uint32_t swapped = __builtin_bswap32(version_);
        if (swapped == 2 || swapped == 3)
            cur.fail("GGUF version", "a big-endian GGUF file is not supported");
        cur.fail("GGUF version",
                 "version " + std::to_string(version_) + " is not supported (only 2 and 3)");
    }
    const uint64_t n_tensors = cur.scalar<uint64_t>("tensor_count");
    const uint64_t n_kv = cur.scalar<uint64_t>("metadata_kv_count");
    // A key-value pair takes at least 13 bytes (key length, type, a one-byte value), a tensor
    // info at least 32 (name length, n_dims, one dim, type, offset).
    if (n_kv > cur.left() / 13)
        cur.fail("metadata_kv_count", std::to_string(n_kv) + " pairs cannot fit in the " +
                                          std::to_string(cur.left()) + " bytes left");
    if (n_tensors > cur.left() / 32)
        cur.fail("tensor_count", std::to_string(n_tensors) + " tensors cannot fit in the " +
                                     std::to_string(cur.left()) + " bytes left");

    metadata_.reserve(n_kv);
    for (uint64_t i = 0; i < n_kv; ++i) {
        std::string key = cur.str("metadata key #" + std::to_string(i));
        const std::string what = "metadata " + quote(key);
        if (keys_.count(key)) cur.fail(what, "duplicate key");
        const uint32_t t = cur.scalar<uint32_t>(what + " value type");
        Value v = read_value(cur, t, what);
        keys_.emplace(key, metadata_.size());
        metadata_.emplace_back(std::move(key), std::move(v));
    }
    if (const Value* a = find(kAlignmentKey)) {
        if (a->type != ValueType::UINT32 || !is_power_of_two(a->bits))
            cur.fail(std::string("metadata '") + kAlignmentKey + "'",
                     "must be a uint32 power of two, got " + describe(*a));
        alignment_ = static_cast<uint32_t>(a->bits);
    }

    tensors_.reserve(n_tensors);
    for (uint64_t i = 0; i < n_tensors; ++i) {
        TensorInfo t;
        t.name = cur.str("tensor #" + std::to_string(i) + " name");
        const std::string what = "tensor " + quote(t.name);
        if (names_.count(t.name)) cur.fail(what, "duplicate tensor name");
        const uint32_t n_dims = cur.scalar<uint32_t>(what + " n_dims");
        if (n_dims < 1 || n_dims > kMaxDims)
            cur.fail(what, "n_dims " + std::to_string(n_dims) + ", expected 1 to 4");
        int64_t numel = 1;
        for (uint32_t d = 0; d < n_dims; ++d) {
            const uint64_t dim = cur.scalar<uint64_t>(what + " dims");
            if (dim == 0) cur.fail(what, "dims[" + std::to_string(d) + "] is 0");
            if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
                __builtin_mul_overflow(numel, static_cast<int64_t>(dim), &numel))
                cur.fail(what, "element count overflows a 64-bit integer");
            t.dims.push_back(dim);
        }
        t.numel = static_cast<uint64_t>(numel);
        const uint32_t type = cur.scalar<uint32_t>(what + " type");
        if (!known_tensor_type(type))
            cur.fail(what, "tensor type " + std::to_string(type) +
                               " is not supported (supported: F32 0, F16 1, Q8_0 8, BF16 30)");
        t.type = static_cast<TensorType>(type);
        if (t.type == TensorType::Q8_0 && t.dims[0] % kQ8_0BlockValues != 0)
            cur.fail(what, "Q8_0 needs dims[0] (" + std::to_string(t.dims[0]) +
                               ") to be a multiple of 32");
        try {
            t.bytes = tensor_bytes(t.type, t.numel);
        } catch (const Error& e) {
            cur.fail(what, e.what());
        }
        t.offset = cur.scalar<uint64_t>(what + " offset");
        if (t.offset % alignment_ != 0)
            cur.fail(what, "offset " + std::to_string(t.offset) + " is not a multiple of the " +
                               "alignment " + std::to_string(alignment_));
        names_.emplace(t.name, tensors_.size());
        tensors_.push_back(std::move(t));
    }

    data_offset_ = align_up(cur.pos(), alignment_);
    if (tensors_.empty()) return;
    if (data_offset_ > file_size_)
        cur.fail("tensor data", "the data section would start at offset " +
                                    std::to_string(data_offset_) + ", past the end of the file (" +
                                    std::to_string(file_size_) + " bytes)");
    const uint64_t data_size = file_size_ - data_offset_;
    for (const auto& t : tensors_)
        if (t.offset > data_size || t.bytes > data_size - t.offset)
            cur.fail("tensor " + quote(t.name), "data [" + std::to_string(t.offset) + ", +" +
                                                    std::to_string(t.bytes) +
                                                    ") runs past the end of the data section (" +
                                                    std::to_string(data_size) + " bytes)");
    std::vector<size_t> order(tensors_.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::sort(order.begin(), order.end(),
              [&](size_t a, size_t b) { return tensors_[a].offset < tensors_[b].offset; });
    for (size_t i = 1; i < order.size(); ++i) {
        const TensorInfo& a = tensors_[order[i - 1]];
        const TensorInfo& b = tensors_[order[i]];
        if (a.offset + a.bytes > b.offset)
            cur.fail("tensor " + quote(b.name), "data at offset " + std::to_string(b.offset) +
                                                    " overlaps tensor " + quote(a.name) + " [" +
                                                    std::to_string(a.offset) + ", " +
                                                    std::to_string(a.offset + a.bytes) + ")");
    }
}

const Value* Reader::find(const std::string& key) const {
    auto it = keys_.find(key);
    return it == keys_.end() ? nullptr : &metadata_[it->second].second;
}

const TensorInfo* Reader::find_tensor(const std::string& name) const {
    auto it = names_.find(name);
    return it == names_.end() ? nullptr : &tensors_[it->second];
}

const Value& Reader::get(const std::string& key) const {
    const Value* v = find(key);
    if (!v) throw Error(path_ + ": metadata " + quote(key) + ": missing");
    return *v;
}

void Reader::fail_type(const std::string& key, const std::string& expected,
                       const Value& got) const {
    throw Error(path_ + ": metadata " + quote(key) + ": expected " + expected + ", got " +
                describe(got));
}

uint32_t Reader::get_u32(const std::string& key) const {
    const Value& v = get(key);
    uint64_t u = 0;
    if (!v.to_u64(u) || u > std::numeric_limits<uint32_t>::max())
        fail_type(key, "an integer that fits uint32", v);
    return static_cast<uint32_t>(u);
}

uint64_t Reader::get_u64(const std::string& key) const {
    const Value& v = get(key);
    uint64_t u = 0;
    if (!v.to_u64(u)) fail_type(key, "an integer that fits uint64", v);
    return u;
}

int64_t Reader::get_i64(const std::string& key) const {
    const Value& v = get(key);
    int64_t i = 0;
    if (!v.to_i64(i)) fail_type(key, "an integer that fits int64", v);
    return i;
}

double Reader::get_f64(const std::string& key) const {
    const Value& v = get(key);
    double f = 0;
    if (!v.to_f64(f)) fail_type(key, "float32 or float64", v);
    return f;
}

float Reader::get_f32(const std::string& key) const {
    return static_cast<float>(get_f64(key));
}

bool Reader::get_bool(const std::string& key) const {
    const Value& v = get(key);
    bool b = false;
    if (!v.to_bool(b)) fail_type(key, "bool", v);
    return b;
}

const std::string& Reader::get_string(const std::string& key) const {
    const Value& v = get(key);
    if (v.type != ValueType::STRING) fail_type(key, "string", v);
    return v.str;
}

const std::vector<std::string>& Reader::get_string_array(const std::string& key) const {
    const Value& v = get(key);
    if (!v.is_array() || v.array_type != ValueType::STRING) fail_type(key, "array of string", v);
    return v.strings;
}

std::vector<float> Reader::get_f32_array(const std::string& key) const {
    const Value& v = get(key);
    if (!v.is_array() || (v.array_type != ValueType::FLOAT32 && v.array_type != ValueType::FLOAT64))
        fail_type(key, "array of float32 or float64", v);
    std::vector<float> out(v.size());
    for (uint64_t i = 0; i < out.size(); ++i) {
        double f = 0;
        v.at(i).to_f64(f);
        out[i] = static_cast<float>(f);
    }
    return out;
}

std::vector<int32_t> Reader::get_i32_array(const std::string& key) const {
    const Value& v = get(key);
    if (!v.is_array() || !(is_signed(v.array_type) || is_unsigned(v.array_type)))
        fail_type(key, "array of integers", v);
    std::vector<int32_t> out(v.size());
    for (uint64_t i = 0; i < out.size(); ++i) {
        const Value e = v.at(i);
        int64_t x = 0;
        if (!e.to_i64(x) || x < std::numeric_limits<int32_t>::min() ||
            x > std::numeric_limits<int32_t>::max())
            throw Error(path_ + ": metadata " + quote(key) + ": element " + std::to_string(i) +
                        ": expected an integer that fits int32, got " + describe(e));
        out[i] = static_cast<int32_t>(x);
    }
    return out;
}

std::vector<uint32_t> Reader::get_u32_array(const std::string& key) const {
    const Value& v = get(key);
    if (!v.is_array() || !(is_signed(v.array_type) || is_unsigned(v.array_type)))
        fail_type(key, "array of integers", v);
    std::vector<uint32_t> out(v.size());
    for (uint64_t i = 0; i < out.size(); ++i) {
        const Value e = v.at(i);
        uint64_t x = 0;
        if (!e.to_u64(x) || x > std::numeric_limits<uint32_t>::max())
            throw Error(path_ + ": metadata " + quote(key) + ": element " + std::to_string(i) +
                        ": expected an integer that fits uint32, got " + describe(e));
        out[i] = static_cast<uint32_t>(x);
    }
    return out;
}

void Reader::pread_exact(uint64_t offset, void* out, uint64_t n, const std::string& what) const {
    read_exact_at(fd_, out, static_cast<size_t>(n), offset, path_ + ": " + what);
}

void Reader::check_tensor(const TensorInfo& t) const {
    const uint64_t data_size = file_size_ > data_offset_ ? file_size_ - data_offset_ : 0;
    if (t.offset > data_size || t.bytes > data_size - t.offset)
        throw Error(path_ + ": tensor " + quote(t.name) + ": not a tensor of this file");
}

void Reader::read_raw(const TensorInfo& t, uint64_t first, uint64_t n, void* out) const {
    check_tensor(t);
    if (first > t.bytes || n > t.bytes - first)
        throw Error(path_ + ": tensor " + quote(t.name) + ": bytes [" + std::to_string(first) +
                    ", +" + std::to_string(n) + ") outside its " + std::to_string(t.bytes) +
                    " bytes");
    pread_exact(data_offset_ + t.offset + first, out, n, "tensor " + quote(t.name));
}

void Reader::read_f32(const TensorInfo& t, uint64_t first, uint64_t count, float* out) const {
    check_tensor(t);
    const std::string what = "tensor " + quote(t.name);
    if (first > t.numel || count > t.numel - first)
        throw Error(path_ + ": " + what + ": elements [" + std::to_string(first) + ", +" +
                    std::to_string(count) + ") outside its " + std::to_string(t.numel));
    const uint64_t base = data_offset_ + t.offset;
    switch (t.type) {
        case TensorType::F32:
            pread_exact(base + first * 4, out, count * 4, what);
            return;
        case TensorType::F16:
        case TensorType::BF16: {
            constexpr uint64_t kChunk = 1 << 15;
            std::vector<uint16_t> buf(static_cast<size_t>(std::min(count, kChunk)));
            for (uint64_t i = 0; i < count; i += kChunk) {
                const uint64_t m = std::min(kChunk, count - i);
                pread_exact(base + (first + i) * 2, buf.data(), m * 2, what);
                for (uint64_t j = 0; j < m; ++j)
                    out[i + j] =
                        t.type == TensorType::F16 ? f16_to_f32(buf[j]) : bf16_to_f32(buf[j]);
            }
            return;
        }
        case TensorType::Q8_0: {
            if (first % kQ8_0BlockValues != 0 || count % kQ8_0BlockValues != 0)
                throw Error(path_ + ": " + what + ": Q8_0 reads need whole blocks of 32 (first " +
                            std::to_string(first) + ", count " + std::to_string(count) + ")");
            constexpr uint64_t kBlocks = 1024;
            std::vector<uint8_t> buf(
                static_cast<size_t>(std::min(count / kQ8_0BlockValues, kBlocks) * kQ8_0BlockBytes));
            const uint64_t first_block = first / kQ8_0BlockValues;
            const uint64_t n_blocks = count / kQ8_0BlockValues;
            for (uint64_t b = 0; b < n_blocks; b += kBlocks) {
                const uint64_t m = std::min(kBlocks, n_blocks - b);
                pread_exact(base + (first_block + b) * kQ8_0BlockBytes, buf.data(),
                            m * kQ8_0BlockBytes, what);
                dequantize_q8_0(buf.data(), static_cast<size_t>(m * kQ8_0BlockValues),
                                out + b * kQ8_0BlockValues);
            }
            return;
        }
    }
}

}  // namespace tmx::gguf

#include "engine/model/safetensors.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "engine/core/checked_math.h"
#include "engine/core/errors.h"
#include "engine/core/file_io.h"
#include "engine/core/json_fields.h"

namespace tmx {

const char* to_string(StorageType t) {
    switch (t) {
        case StorageType::F32:
            return "F32";
        case StorageType::BF16:
            return "BF16";
        case StorageType::F16:
            return "F16";
        case StorageType::F64:
            return "F64";
        case StorageType::Q8_0:
            return "Q8_0";
    }
    return "?";
}

DType storage_dtype(StorageType t) {
    switch (t) {
        case StorageType::BF16:
            return DType::BF16;
        case StorageType::F16:
            return DType::F16;
        case StorageType::Q8_0:
            return DType::Q8_0;
        default:
            return DType::F32;
    }
}

StorageType storage_of(DType t) {
    switch (t) {
        case DType::BF16:
            return StorageType::BF16;
        case DType::F16:
            return StorageType::F16;
        case DType::Q8_0:
            return StorageType::Q8_0;
        default:
            return StorageType::F32;
    }
}

StorageType parse_storage_type(const std::string& name) {
    std::string s = name;
    std::transform(s.begin(), s.end(), s.begin(), ::tolower);
    if (s == "f32" || s == "fp32" || s == "float32") return StorageType::F32;
    if (s == "bf16" || s == "bfloat16") return StorageType::BF16;
    if (s == "f16" || s == "fp16" || s == "float16") return StorageType::F16;
    if (s == "q8_0") return StorageType::Q8_0;
    throw UsageError("unknown weight dtype '" + name + "' (expected f32, bf16, f16 or q8_0)");
}

uint16_t f32_to_bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
    return static_cast<uint16_t>(u >> 16);
}

float bf16_to_f32(uint16_t b) {
    uint32_t u = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

namespace {

using nlohmann::json;

// Bytes of one element (Q8_0: of one byte of its blocks).
size_t storage_size(StorageType t) {
    switch (t) {
        case StorageType::F32:
            return 4;
        case StorageType::F64:
            return 8;
        case StorageType::Q8_0:
            return 1;
        default:
            return 2;
    }
}

StorageType parse_header_dtype(const std::string& dt, const std::string& where) {
    if (dt == "F32") return StorageType::F32;
    if (dt == "BF16") return StorageType::BF16;
    if (dt == "F16") return StorageType::F16;
    if (dt == "F64") return StorageType::F64;
    if (dt == "U8") return StorageType::Q8_0;
    throw Error(where + ": dtype " + dt +
                " cannot be read by this engine (supported: F32, BF16, F16, F64, and U8 holding "
                "Q8_0 blocks)");
}

// The header's dtype and shape of a tensor (Q8_0: U8 blocks, see safetensors.h).
const char* header_dtype(StorageType t) {
    return t == StorageType::Q8_0 ? "U8" : to_string(t);
}
Shape header_shape(StorageType t, Shape shape, const std::string& where) {
    if (t != StorageType::Q8_0) return shape;
    if (shape.empty() || shape.back() % kQ8_0BlockValues != 0)
        throw Error(where + ": Q8_0 needs rows of whole blocks of 32 values, not shape " +
                    shape_string(shape));
    shape.back() /= kQ8_0BlockValues;
    shape.push_back(kQ8_0BlockBytes);
    return shape;
}

// The JSON header; a key twice in one object (a tensor listed twice, or a field of one) is
// refused: JSON parsers keep one of the two silently, the safetensors format forbids it.
json parse_header(const char* begin, const char* end, const std::string& path) {
    json header = json_fields::parse_unique_keys(std::string_view(begin, end - begin),
                                                 path + ": corrupt header");
    if (!header.is_object()) throw Error(path + ": corrupt header (not a JSON object)");
    return header;
}

SafetensorsEntry parse_entry(const json& info, const std::string& where) {
    const json_fields::Fields f(info, where);
    SafetensorsEntry e;
    const std::string dt = f.string("dtype");
    e.dtype = parse_header_dtype(dt, where);
    const json& shape = f.at("shape", "a list of integers");
    if (!shape.is_array())
        json_fields::fail(where, "shape",
                          "expected a list of integers, got " + json_fields::describe(shape));
    int64_t numel = 1;
    for (size_t i = 0; i < shape.size(); ++i) {
        e.shape.push_back(
            json_fields::as_int(shape[i], where, "shape[" + std::to_string(i) + "]", 0));
        numel = checked_mul(numel, e.shape.back(), where + ": shape " + shape.dump());
    }
    const json& offs = f.at("data_offsets", "[begin, end]");
    if (!offs.is_array() || offs.size() != 2)
        json_fields::fail(where, "data_offsets",
                          "expected [begin, end], got " + json_fields::describe(offs));
    e.begin = static_cast<uint64_t>(json_fields::as_int(offs[0], where, "data_offsets[0]", 0));
    e.end = static_cast<uint64_t>(json_fields::as_int(offs[1], where, "data_offsets[1]", 0));
    if (e.begin > e.end)
        throw Error(where + ": data_offsets [" + std::to_string(e.begin) + ", " +
                    std::to_string(e.end) + "] end before they begin");
    const int64_t bytes = checked_mul(numel, static_cast<int64_t>(storage_size(e.dtype)),
                                      where + ": byte size of shape " + shape.dump());
    if (e.dtype == StorageType::Q8_0) {  // U8: [..., blocks, 34] is a tensor of [..., blocks * 32]
        if (e.shape.size() < 2 || e.shape.back() != kQ8_0BlockBytes)
            throw Error(where + ": a U8 tensor must hold Q8_0 blocks, shape [..., blocks, " +
                        std::to_string(kQ8_0BlockBytes) + "], not " + shape_string(e.shape));
        e.shape.pop_back();
        e.shape.back() = checked_mul(e.shape.back(), kQ8_0BlockValues, where + ": Q8_0 blocks");
    }
    if (e.end - e.begin != static_cast<uint64_t>(bytes))
        throw Error(where + ": " + std::to_string(e.end - e.begin) + " bytes do not match shape " +
                    shape_string(e.shape) + " of " + dt + " (" + std::to_string(bytes) + " bytes)");
    return e;
}

// The safetensors rule: the tensors' byte ranges, in offset order, follow each other without
// gap or overlap and cover the data section exactly.
void check_ranges_tile_the_data(const std::map<std::string, SafetensorsEntry>& entries,
                                uint64_t data_size, const std::string& path) {
    std::vector<std::pair<const std::string*, const SafetensorsEntry*>> by_offset;
    for (const auto& [name, e] : entries) by_offset.emplace_back(&name, &e);
    std::sort(by_offset.begin(), by_offset.end(), [](const auto& a, const auto& b) {
        return std::tie(a.second->begin, a.second->end) < std::tie(b.second->begin, b.second->end);
    });
    uint64_t covered = 0;
    const std::string* previous = nullptr;
    for (const auto& [name, e] : by_offset) {
        const std::string where = path + ": tensor '" + *name + "'";
        const std::string range =
            "[" + std::to_string(e->begin) + ", " + std::to_string(e->end) + ")";
        if (e->begin < covered)
            throw Error(where + ": data " + range + " overlaps tensor '" + *previous +
                        "', which ends at " + std::to_string(covered));
        if (e->begin > covered)
            throw Error(where + ": data " + range + " leaves bytes [" + std::to_string(covered) +
                        ", " + std::to_string(e->begin) +
                        ") that belong to no tensor (ranges must be contiguous)");
        covered = e->end;
        previous = name;
    }
    if (covered != data_size)
        throw Error(path + ": data bytes [" + std::to_string(covered) + ", " +
                    std::to_string(data_size) + ") belong to no tensor (" +
                    std::to_string(data_size) + " data bytes, tensors cover " +
                    std::to_string(covered) + ")");
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path)
    : path_(path), fd_(open_regular_file(path)) {
    // A destructor does not run for a constructor that throws: close the file on the way out,
    // or every refused file would leak a descriptor.
    try {
        open_checked();
    } catch (...) {
        ::close(fd_);
        fd_ = -1;
        throw;
    }
}

void SafetensorsFile::open_checked() {
    const std::string& path = path_;
    struct stat st {};
    if (::fstat(fd_, &st) != 0) throw Error(path + ": cannot stat: " + std::strerror(errno));
    const uint64_t file_size = static_cast<uint64_t>(st.st_size);
    if (file_size < 8)
        throw Error(path + ": truncated: " + std::to_string(file_size) +
                    " bytes, too short for a safetensors header");
    unsigned char len_bytes[8];
    read_exact_at(fd_, len_bytes, 8, 0, path);
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
    if (header_len > file_size - 8)
        throw Error(path + ": corrupt or truncated header: it claims " +
                    std::to_string(header_len) + " bytes but the file has " +
                    std::to_string(file_size - 8) + " after the length field");
    data_start_ = 8 + header_len;
    std::string header_text(static_cast<size_t>(header_len), '\0');
    read_exact_at(fd_, header_text.data(), header_text.size(), 8, path);
    const json header =
        parse_header(header_text.data(), header_text.data() + header_text.size(), path);
    const uint64_t data_size = file_size - data_start_;
    for (const auto& [name, info] : header.items()) {
        if (name == "__metadata__") continue;
        const std::string where = path + ": tensor '" + name + "'";
        try {
            SafetensorsEntry e = parse_entry(info, where);
            if (e.end > data_size)
                throw Error(where + ": data [" + std::to_string(e.begin) + ", " +
                            std::to_string(e.end) + ") lies outside the file's " +
                            std::to_string(data_size) + " data bytes (truncated file?)");
            entries_.emplace(name, std::move(e));
        } catch (const json::exception& ex) {
            throw Error(where + ": corrupt header entry (" + ex.what() + ")");
        }
    }
    check_ranges_tile_the_data(entries_, data_size, path);
}

SafetensorsFile::~SafetensorsFile() {
    if (fd_ >= 0) ::close(fd_);
}

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
    auto it = entries_.find(name);
    if (it == entries_.end()) throw Error(path_ + ": no tensor '" + name + "'");
    return it->second;
}

void SafetensorsFile::read_raw(const std::string& name, void* out) const {
    const SafetensorsEntry& e = entry(name);
    read_exact_at(fd_, out, e.end - e.begin, data_start_ + e.begin, path_);
}

void SafetensorsFile::read_f32(const std::string& name, float* out) const {
    const SafetensorsEntry& e = entry(name);
    const size_t n = static_cast<size_t>(shape_numel(e.shape));
    if (e.dtype == StorageType::F32) {  // straight into the caller's buffer
        read_exact_at(fd_, out, n * 4, data_start_ + e.begin, path_);
        return;
    }
    if (e.dtype == StorageType::Q8_0) {  // whole blocks at a time
        constexpr size_t kBlocks = size_t{1} << 15;
        const size_t blocks = n / kQ8_0BlockValues;
        std::vector<uint8_t> raw(std::min(blocks, kBlocks) * kQ8_0BlockBytes);
        for (size_t first = 0; first < blocks; first += kBlocks) {
            const size_t count = std::min(kBlocks, blocks - first);
            read_exact_at(fd_, raw.data(), count * kQ8_0BlockBytes,
                          data_start_ + e.begin + first * kQ8_0BlockBytes, path_);
            dequantize_q8_0(raw.data(), count * kQ8_0BlockValues, out + first * kQ8_0BlockValues);
        }
        return;
    }
    // Other dtypes in chunks, so that memory stays at the fp32 result.
    const size_t es = storage_size(e.dtype);
    constexpr size_t kChunk = size_t{1} << 20;  // elements
    std::vector<unsigned char> raw(std::min(n, kChunk) * es);
    for (size_t first = 0; first < n; first += kChunk) {
        const size_t count = std::min(kChunk, n - first);
        read_exact_at(fd_, raw.data(), count * es, data_start_ + e.begin + first * es, path_);
        const unsigned char* src = raw.data();
        float* dst = out + first;
        for (size_t i = 0; i < count; ++i) {
            if (e.dtype == StorageType::F64) {
                double v;
                std::memcpy(&v, src + 8 * i, 8);
                dst[i] = static_cast<float>(v);
            } else {
                uint16_t h;
                std::memcpy(&h, src + 2 * i, 2);
                dst[i] = e.dtype == StorageType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
            }
        }
    }
}

void encode_f32_as(StorageType dtype, const float* data, size_t n, std::string& out) {
    out.clear();
    if (dtype == StorageType::F32) {
        out.assign(reinterpret_cast<const char*>(data), n * 4);
        return;
    }
    if (dtype == StorageType::Q8_0) {
        out.resize(static_cast<size_t>(dtype_bytes(DType::Q8_0, static_cast<int64_t>(n))));
        quantize_q8_0(data, n, reinterpret_cast<uint8_t*>(out.data()));
        return;
    }
    if (dtype != StorageType::BF16 && dtype != StorageType::F16)
        throw UsageError(std::string("writing ") + to_string(dtype) +
                         " safetensors is not supported");
    out.resize(n * 2);
    for (size_t i = 0; i < n; ++i) {
        const uint16_t b = dtype == StorageType::BF16 ? f32_to_bf16(data[i]) : f32_to_f16(data[i]);
        out[2 * i] = static_cast<char>(b & 0xff);
        out[2 * i + 1] = static_cast<char>(b >> 8);
    }
}

namespace {

// The length field and the JSON header of a file holding `plan`'s tensors in plan order.
std::string header_bytes(const std::vector<SafetensorsEntryPlan>& plan, const std::string& path) {
    nlohmann::json header = nlohmann::json::object();
    header["__metadata__"] = {{"format", "pt"}};
    uint64_t off = 0;
    std::set<std::string> names;
    for (const auto& t : plan) {
        if (!names.insert(t.name).second)
            throw Error(path + ": tensor '" + t.name + "' is listed twice");
        if (t.dtype == StorageType::F64)
            throw UsageError(path + ": writing F64 safetensors is not supported");
        const Shape shape = header_shape(t.dtype, t.shape, path + ": tensor '" + t.name + "'");
        const uint64_t n = static_cast<uint64_t>(
            checked_mul(shape_numel(shape), static_cast<int64_t>(storage_size(t.dtype)),
                        path + ": tensor '" + t.name + "'"));
        header[t.name] = {
            {"dtype", header_dtype(t.dtype)}, {"shape", shape}, {"data_offsets", {off, off + n}}};
        off += n;
    }
    std::string h = header.dump();
    h.append((8 - h.size() % 8) % 8, ' ');  // align the data section to 8 bytes
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((h.size() >> (8 * i)) & 0xff);
    return out + h;
}

}  // namespace

SafetensorsWriter::SafetensorsWriter(const std::string& path,
                                     const std::vector<SafetensorsEntryPlan>& tensors)
    : out_(path), plan_(tensors) {
    out_.write(header_bytes(plan_, path));
}

void SafetensorsWriter::write_next(const float* data) {
    if (next_ >= plan_.size())
        throw Error(out_.path() + ": more tensors written than the header lists");
    const SafetensorsEntryPlan& t = plan_[next_++];
    const size_t n = static_cast<size_t>(shape_numel(t.shape));
    if (t.dtype == StorageType::F32) {  // no copy
        out_.write(data, n * 4);
        return;
    }
    // Elements, whole Q8_0 blocks: memory stays at the caller's data.
    constexpr size_t kChunk = size_t{1} << 20;
    for (size_t first = 0; first < n; first += kChunk) {
        encode_f32_as(t.dtype, data + first, std::min(kChunk, n - first), scratch_);
        out_.write(scratch_);
    }
}

void SafetensorsWriter::finish() {
    if (next_ != plan_.size())
        throw Error(out_.path() + ": only " + std::to_string(next_) + " of " +
                    std::to_string(plan_.size()) + " tensors were written");
    out_.commit();
}

std::string encode_safetensors(const std::vector<HostTensorRef>& tensors, StorageType dtype) {
    std::vector<const HostTensorRef*> sorted;
    for (const auto& t : tensors) sorted.push_back(&t);
    std::sort(sorted.begin(), sorted.end(),
              [](const HostTensorRef* a, const HostTensorRef* b) { return a->name < b->name; });
    std::vector<SafetensorsEntryPlan> plan;
    for (const auto* t : sorted) plan.push_back({t->name, t->shape, dtype});
    std::string out = header_bytes(plan, "safetensors"), bytes;
    for (const auto* t : sorted) {
        encode_f32_as(dtype, t->data, static_cast<size_t>(shape_numel(t->shape)), bytes);
        out += bytes;
    }
    return out;
}

}  // namespace tmx

#include "engine/compute/weight_format.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>

#include "engine/compute/precision.h"
#include "engine/core/errors.h"

namespace tmx {

bool is_weight_format(DType t) {
    return t == DType::F32 || t == DType::BF16 || t == DType::F16 || t == DType::Q8_0;
}

DType parse_weight_format(const std::string& text, const std::string& what) {
    std::string s = text;
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
    if (s == "f32" || s == "fp32") return DType::F32;
    if (s == "bf16") return DType::BF16;
    if (s == "f16" || s == "fp16") return DType::F16;
    if (s == "q8_0") return DType::Q8_0;
    throw UsageError(what + ": unknown weight format '" + text +
                     "' (expected f32, bf16, f16 or q8_0)");
}

float f16_to_f32(uint16_t h) {
    uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ffu, u;
    if (exp == 0) {
        if (mant == 0) {
            u = sign;
        } else {  // subnormal: normalise
            exp = 127 - 15 + 1;
            while (!(mant & 0x400u)) {
                mant <<= 1;
                --exp;
            }
            u = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (mant << 13);
    } else {
        u = sign | ((exp - 15 + 127) << 23) | (mant << 13);
    }
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

uint16_t f32_to_f16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    const uint32_t sign = (u >> 16) & 0x8000u;
    const uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN stays NaN
    if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds past 65504
    if (abs < 0x38800000u) {  // below the smallest normal f16 (2^-14): subnormal or zero
        // The value in units of 2^-24, rounded to nearest even.
        const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
        const int shift = 126 - static_cast<int>(abs >> 23);  // 2^-24 units: shift right by this
        if (shift > 24) return static_cast<uint16_t>(sign);
        const uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1),
                       half = 1u << (shift - 1);
        const uint32_t r = q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
        return static_cast<uint16_t>(sign | r);
    }
    // Normal: rebias the exponent and round the mantissa from 23 to 10 bits, ties to even (a
    // carry into the exponent is the correct next value).
    const uint32_t rebased = abs - ((127u - 15u) << 23);
    const uint32_t r = rebased + 0xfffu + ((rebased >> 13) & 1u);
    return static_cast<uint16_t>(sign | (r >> 13));
}

namespace {
constexpr size_t kValues = kQ8_0BlockValues, kBytes = kQ8_0BlockBytes;
}  // namespace

void quantize_q8_0(const float* x, size_t n, uint8_t* out) {
    if (n % kValues != 0)
        throw Error("Q8_0 needs a multiple of 32 values, got " + std::to_string(n));
    for (size_t b = 0; b < n / kValues; ++b) {
        const float* xb = x + b * kValues;
        uint8_t* ob = out + b * kBytes;
        float amax = 0.0f;
        for (size_t j = 0; j < kValues; ++j) amax = std::max(amax, std::fabs(xb[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        const uint16_t dh = f32_to_f16(d);
        std::memcpy(ob, &dh, 2);
        for (size_t j = 0; j < kValues; ++j) {
            const float q = std::round(xb[j] * id);  // roundf: ties away from zero
            const float c = std::isnan(q) ? 0.0f : std::clamp(q, -127.0f, 127.0f);
            ob[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(c));
        }
    }
}

void dequantize_q8_0(const uint8_t* in, size_t n, float* out) {
    if (n % kValues != 0)
        throw Error("Q8_0 needs a multiple of 32 values, got " + std::to_string(n));
    for (size_t b = 0; b < n / kValues; ++b) {
        const uint8_t* ib = in + b * kBytes;
        uint16_t dh;
        std::memcpy(&dh, ib, 2);
        const float d = f16_to_f32(dh);
        for (size_t j = 0; j < kValues; ++j)
            out[b * kValues + j] = d * static_cast<float>(static_cast<int8_t>(ib[2 + j]));
    }
}

void encode_weights(DType t, const float* x, int64_t n, void* out) {
    const size_t count = static_cast<size_t>(n);
    switch (t) {
        case DType::F32:
            std::memcpy(out, x, count * sizeof(float));
            return;
        case DType::BF16:
            for (size_t i = 0; i < count; ++i) static_cast<uint16_t*>(out)[i] = to_bf16_bits(x[i]);
            return;
        case DType::F16:
            for (size_t i = 0; i < count; ++i) static_cast<uint16_t*>(out)[i] = f32_to_f16(x[i]);
            return;
        case DType::Q8_0:
            return quantize_q8_0(x, count, static_cast<uint8_t*>(out));
        case DType::I32:
            break;
    }
    throw std::logic_error(std::string("encode_weights: ") + to_string(t) + " is no weight format");
}

void decode_weights(DType t, const void* in, int64_t n, float* out) {
    const size_t count = static_cast<size_t>(n);
    switch (t) {
        case DType::F32:
            std::memcpy(out, in, count * sizeof(float));
            return;
        case DType::BF16:
            for (size_t i = 0; i < count; ++i)
                out[i] = from_bf16_bits(static_cast<const uint16_t*>(in)[i]);
            return;
        case DType::F16:
            for (size_t i = 0; i < count; ++i)
                out[i] = f16_to_f32(static_cast<const uint16_t*>(in)[i]);
            return;
        case DType::Q8_0:
            return dequantize_q8_0(static_cast<const uint8_t*>(in), count, out);
        case DType::I32:
            break;
    }
    throw std::logic_error(std::string("decode_weights: ") + to_string(t) + " is no weight format");
}

}  // namespace tmx

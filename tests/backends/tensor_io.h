// Tensors to and from a backend in the backend tests: host vectors uploaded (float as F32,
// int32_t as I32), outputs poisoned before an op writes them (NaN for F32, a negative sentinel
// for I32: an element the op forgets to write shows up as a failure), and downloads.
// OneBackendIo gives a fixture that tests one backend the same without naming it.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "engine/compute/backend.h"

namespace tmx::test {

constexpr int32_t kPoisonId = -777777;

inline Tensor up(Backend& backend, const std::vector<float>& host, Shape shape) {
    Tensor t = backend.alloc(std::move(shape));
    EXPECT_EQ(static_cast<size_t>(t.numel()), host.size()) << "upload to " << backend.name();
    backend.upload(t, host.data());
    return t;
}
inline Tensor up_ids(Backend& backend, const std::vector<int32_t>& host, Shape shape) {
    Tensor t = backend.alloc(std::move(shape), DType::I32);
    EXPECT_EQ(static_cast<size_t>(t.numel()), host.size()) << "upload to " << backend.name();
    backend.upload(t, host.data());
    return t;
}

inline Tensor poisoned(Backend& backend, Shape shape) {
    Tensor t = backend.alloc(std::move(shape));
    backend.fill(t, std::numeric_limits<float>::quiet_NaN());
    return t;
}
inline Tensor poisoned_ids(Backend& backend, Shape shape) {
    Tensor t = backend.alloc(std::move(shape), DType::I32);
    const std::vector<int32_t> sentinel(static_cast<size_t>(t.numel()), kPoisonId);
    backend.upload(t, sentinel.data());
    return t;
}

inline std::vector<float> down(Backend& backend, const Tensor& t) {
    std::vector<float> host(static_cast<size_t>(t.numel()));
    backend.download(t, host.data());
    return host;
}
inline std::vector<int32_t> down_ids(Backend& backend, const Tensor& t) {
    std::vector<int32_t> host(static_cast<size_t>(t.numel()));
    backend.download(t, host.data());
    return host;
}

// For a fixture that tests one backend, be(): up(host, shape), down(t) and the rest on it.
class OneBackendIo {
  protected:
    virtual ~OneBackendIo() = default;
    virtual Backend& be() = 0;

    Tensor up(const std::vector<float>& host, Shape shape) {
        return test::up(be(), host, std::move(shape));
    }
    Tensor up_ids(const std::vector<int32_t>& host, Shape shape) {
        return test::up_ids(be(), host, std::move(shape));
    }
    Tensor poisoned(Shape shape) { return test::poisoned(be(), std::move(shape)); }
    Tensor poisoned_ids(Shape shape) { return test::poisoned_ids(be(), std::move(shape)); }
    std::vector<float> down(const Tensor& t) { return test::down(be(), t); }
    std::vector<int32_t> down_ids(const Tensor& t) { return test::down_ids(be(), t); }
};

}  // namespace tmx::test

// Overflow-checked 64-bit integer arithmetic for sizes that come from files and configs (shapes,
// byte counts, offsets). A result that does not fit in int64_t is a tmx::Error naming the
// caller's context ("tensor 'w' shape", "config n_layers x d_model", ...), never undefined
// behaviour or a silently wrapped value.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "engine/core/errors.h"

namespace tmx {

// The error the helpers throw; a caller that knows more (the file being read) can catch it and
// add that context.
class OverflowError : public Error {
  public:
    using Error::Error;
};

[[noreturn]] inline void throw_int64_overflow(const OptionText& context) {
    throw OverflowError(context + ": size overflows a 64-bit integer");
}

// a * b, or a tmx::Error naming `context` when the product does not fit in int64_t.
inline int64_t checked_mul(int64_t a, int64_t b, const std::string& context) {
    int64_t product = 0;
    if (__builtin_mul_overflow(a, b, &product)) throw_int64_overflow(context);
    return product;
}

// a + b, or a tmx::Error naming `context` when the sum does not fit in int64_t.
inline int64_t checked_add(int64_t a, int64_t b, const std::string& context) {
    int64_t sum = 0;
    if (__builtin_add_overflow(a, b, &sum)) throw_int64_overflow(context);
    return sum;
}

// The product of all factors, checked at every step.
inline int64_t checked_product(std::initializer_list<int64_t> factors, const std::string& context) {
    int64_t product = 1;
    for (int64_t f : factors) product = checked_mul(product, f, context);
    return product;
}
// The same for a product of options, named by their fields (option_text.h).
inline int64_t checked_option_product(std::initializer_list<int64_t> factors,
                                      const OptionText& options) {
    int64_t product = 1;
    for (int64_t f : factors)
        if (__builtin_mul_overflow(product, f, &product)) throw_int64_overflow(options);
    return product;
}

// The sum of all terms, checked at every step.
inline int64_t checked_sum(std::initializer_list<int64_t> terms, const std::string& context) {
    int64_t sum = 0;
    for (int64_t t : terms) sum = checked_add(sum, t, context);
    return sum;
}

}  // namespace tmx

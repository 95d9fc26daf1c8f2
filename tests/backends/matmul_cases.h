// The variants every matmul test walks: each shape with every combination of trans_a, trans_b,
// a bias and accumulate, each inside a SCOPED_TRACE naming it (ops_test.cpp against double
// precision, bf16_matmul_test.cpp against double precision on rounded operands).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <string>

namespace tmx::test {

struct MatmulShape {
    int64_t M, N, K;
};

struct MatmulVariant {
    int64_t M, N, K;
    bool trans_a, trans_b, bias, accumulate;
};

// Calls body(variant) for every shape and combination of the four options.
template <typename Body>
void for_each_matmul_variant(std::initializer_list<MatmulShape> shapes, Body body) {
    for (const MatmulShape& s : shapes)
        for (bool ta : {false, true})
            for (bool tb : {false, true})
                for (bool bias : {false, true})
                    for (bool acc : {false, true}) {
                        SCOPED_TRACE("M,N,K = " + std::to_string(s.M) + "x" + std::to_string(s.N) +
                                     "x" + std::to_string(s.K) + " trans_a=" + std::to_string(ta) +
                                     " trans_b=" + std::to_string(tb) + " bias=" +
                                     std::to_string(bias) + " accumulate=" + std::to_string(acc));
                        body(MatmulVariant{s.M, s.N, s.K, ta, tb, bias, acc});
                    }
}

}  // namespace tmx::test

// tmx bench's op timings: each op at the model's shapes, set up alike on every backend, timed and
// checked against the CPU's output. Internal to engine/report/ (bench.cpp runs them).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/compute/backend.h"
#include "engine/model/config.h"
#include "engine/report/bench.h"

namespace tmx::bench_detail {

// One op at one shape: what it costs, and how to set it up on a backend (inputs uploaded,
// output allocated) and launch it in the backend's precision. Inputs are host data fixed at
// construction, so every backend sees the same ones.
struct OpCase {
    std::string name, shape;
    double flops = 0, bytes = 0;  // bytes: with fp32 operands
    double operand_elements = 0;  // of matmul operands, which bf16 precision holds in 2 bytes
    double bytes_in(Precision p) const {
        return p == Precision::BF16 ? bytes - 2.0 * operand_elements : bytes;
    }
    struct Prepared {
        std::function<void()> launch;
        Tensor out;
    };
    std::function<Prepared(Backend&)> prepare;
};

// The ops of one model at prefill (P tokens) and decode shapes, with inputs drawn from `seed`;
// gemm > 0 adds a gemm x gemm x gemm matmul.
std::vector<OpCase> op_cases(const ModelConfig& c, int64_t P, uint64_t seed, int64_t gemm);

// Runs an op once and returns its output (the CPU's is the reference).
std::vector<float> run_op(const OpCase& op, Backend& be);

// Times `op` on `be` in its current precision after checking its output against `reference`. An
// op the backend cannot run at that shape is reported as skipped, with the reason.
OpBench measure_op(const OpCase& op, Backend& be, const std::vector<float>& reference,
                   const BenchOptions& o, Precision precision);

}  // namespace tmx::bench_detail

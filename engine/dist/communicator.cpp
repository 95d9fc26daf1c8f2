#include "engine/dist/communicator.h"

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <stdexcept>

namespace tmx {

void SoloCommunicator::reduce_scatter_sum(Backend& backend, const Tensor& t, const Tensor& shard) {
    backend.copy(t, shard);
}

void SoloCommunicator::all_gather(Backend& backend, const Tensor& shard, const Tensor& t) {
    backend.copy(shard, t);
}

void SoloCommunicator::abort(const std::string& message, int code) {
    if (!message.empty()) std::fprintf(stderr, "%s\n", message.c_str());
    std::exit(code);
}

namespace {

std::optional<int> env_int(const char* name) {
    const char* v = std::getenv(name);
    if (!v || !*v) return std::nullopt;
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (*end != '\0' || n < 0 || n > 1'000'000) return std::nullopt;
    return static_cast<int>(n);
}

}  // namespace

void check_collective_tensors(const char* op, const Tensor& t, const Tensor* shard, int ranks) {
    const auto fail = [op](const std::string& what) {
        throw std::logic_error(std::string("Communicator::") + op + ": " + what);
    };
    if (!t.defined()) fail("the tensor is not allocated");
    if (t.dtype() != DType::F32) fail(std::string("expected f32, got ") + to_string(t.dtype()));
    if (!shard) return;
    if (!shard->defined()) fail("the shard is not allocated");
    if (shard->dtype() != DType::F32)
        fail(std::string("expected an f32 shard, got ") + to_string(shard->dtype()));
    if (t.numel() != static_cast<int64_t>(ranks) * shard->numel())
        fail("the tensor has " + std::to_string(t.numel()) + " elements, expected " +
             std::to_string(ranks) + " ranks x " + std::to_string(shard->numel()));
}

void check_collective_root(const char* op, int root, int ranks) {
    if (root < 0 || root >= ranks)
        throw std::logic_error(std::string("Communicator::") + op + ": root " +
                               std::to_string(root) + " outside [0, " + std::to_string(ranks) +
                               ")");
}

LaunchEnv detect_launch_env() {
    // The variables each launcher family sets in every rank's environment: OpenMPI's mpirun,
    // Slurm's srun (a step's tasks, not a batch script), and PMI (MPICH's hydra mpiexec).
    struct Family {
        const char *name, *size, *rank, *local_size, *local_rank;
    };
    static constexpr Family families[] = {
        {"OpenMPI", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
         "OMPI_COMM_WORLD_LOCAL_RANK"},
        {"Slurm", "SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "SLURM_NTASKS_PER_NODE", "SLURM_LOCALID"},
        {"PMI", "PMI_SIZE", "PMI_RANK", "MPI_LOCALNRANKS", "MPI_LOCALRANKID"},
    };
    LaunchEnv env;
    for (const Family& f : families) {
        const std::optional<int> size = env_int(f.size), rank = env_int(f.rank);
        if (!size || !rank) continue;
        env.launcher = f.name;
        env.world_size = *size;
        env.world_rank = *rank;
        env.local_size = env_int(f.local_size).value_or(1);
        env.local_rank = env_int(f.local_rank).value_or(0);
        break;
    }
    return env;
}

}  // namespace tmx

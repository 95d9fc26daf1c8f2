#include "dist/open_communicator.h"

#include <cmath>
#include <cstdlib>
#include <string>

#include "engine/core/errors.h"

#ifdef TMX_HAS_MPI
#include "dist/mpi_communicator.h"
#endif
#ifdef TMX_HAS_NCCL
#include "backends/cuda/nccl_communicator.h"
#endif

namespace tmx {

namespace {

void check_options(const DistOptions& options) {
    if (!(options.collective_timeout_s >= 0) || !std::isfinite(options.collective_timeout_s))
        throw UsageError("the collective timeout must be a number of seconds >= 0 (0: none)");
}

}  // namespace

std::unique_ptr<Communicator> open_host_communicator(const DistOptions& options) {
    check_options(options);
    const LaunchEnv env = detect_launch_env();
    if (env.world_size <= 1) return std::make_unique<SoloCommunicator>();
#ifdef TMX_HAS_MPI
    return std::make_unique<MpiCommunicator>(
        MpiOptions{.collective_timeout_s = options.collective_timeout_s});
#else
    throw UsageError("this tmx was built without MPI, but " + env.launcher +
                     " launched it as rank " + std::to_string(env.world_rank) + " of " +
                     std::to_string(env.world_size) +
                     ": each rank would train alone. Install libopenmpi-dev and configure with "
                     "-DTMX_MPI=ON (scripts/setup.sh does both), or run one process");
#endif
}

std::unique_ptr<Communicator> open_device_communicator(Backend& backend,
                                                       std::unique_ptr<Communicator> host,
                                                       const DistOptions& options) {
    check_options(options);
#ifdef TMX_HAS_NCCL
    const char* force = std::getenv("TMX_FORCE_NCCL");
    const bool forced = force && std::string(force) == "1";
    if (backend.name() == "cuda" && (host->size() > 1 || forced))
        return make_nccl_communicator(backend, std::move(host), options.collective_timeout_s);
#else
    (void)backend;
#endif
    return host;
}

}  // namespace tmx

// Which communicator a process trains with: one process alone, the ranks of an MPI job, or NCCL
// on the CUDA backend's device memory (bootstrapped through MPI).
#pragma once

#include <memory>

#include "engine/compute/backend.h"
#include "engine/dist/communicator.h"

namespace tmx {

struct DistOptions {
    // Longest wait in one collective before the job is ended (a rank hung or died); 0: none.
    double collective_timeout_s = 600;
};

// SoloCommunicator when this process was not launched as one of several ranks
// (detect_launch_env()); MpiCommunicator when it was and this build has MPI. A build without MPI
// launched as N > 1 ranks throws tmx::UsageError rather than run N uncoordinated copies.
std::unique_ptr<Communicator> open_host_communicator(const DistOptions& options);

// The communicator for tensors on `backend`: NCCL on a CUDA backend in a build with NCCL when
// `host` has several ranks (or TMX_FORCE_NCCL=1, so that one GPU runs the NCCL path), taking
// `host` over for its bootstrap and host values; otherwise `host` itself. `options` bounds
// NCCL's setup and each of its collectives (pass those given to open_host_communicator).
// `backend` must outlive the result. Each rank's backend must be a different GPU (NCCL refuses
// two ranks on one device): pick it from detect_launch_env().local_rank.
std::unique_ptr<Communicator> open_device_communicator(Backend& backend,
                                                       std::unique_ptr<Communicator> host,
                                                       const DistOptions& options = {});

}  // namespace tmx

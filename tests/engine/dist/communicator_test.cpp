// What the launcher's environment says about the ranks (detect_launch_env), the one-process
// communicator, and which communicator a process opens (dist/open_communicator.h). The MPI
// communicator itself runs as an MPI job: tests/dist/comm_check.cpp.
#include "engine/dist/communicator.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "backends/registry.h"
#include "dist/open_communicator.h"
#include "engine/core/errors.h"

namespace tmx::test {
namespace {

// Every variable detect_launch_env reads, cleared for the test and restored after it: the test
// may itself run inside a Slurm job or under mpirun.
class LaunchEnvironment {
  public:
    LaunchEnvironment() {
        for (const char* name : kNames) {
            const char* value = std::getenv(name);
            saved_[name] = value ? std::optional<std::string>(value) : std::nullopt;
            ::unsetenv(name);
        }
    }
    ~LaunchEnvironment() {
        for (const auto& [name, value] : saved_) {
            if (value)
                ::setenv(name.c_str(), value->c_str(), 1);
            else
                ::unsetenv(name.c_str());
        }
    }
    void set(const char* name, const char* value) { ::setenv(name, value, 1); }

  private:
    static constexpr const char* kNames[] = {"OMPI_COMM_WORLD_SIZE",
                                             "OMPI_COMM_WORLD_RANK",
                                             "OMPI_COMM_WORLD_LOCAL_SIZE",
                                             "OMPI_COMM_WORLD_LOCAL_RANK",
                                             "SLURM_STEP_NUM_TASKS",
                                             "SLURM_PROCID",
                                             "SLURM_NTASKS_PER_NODE",
                                             "SLURM_LOCALID",
                                             "PMI_SIZE",
                                             "PMI_RANK",
                                             "MPI_LOCALNRANKS",
                                             "MPI_LOCALRANKID",
                                             "TMX_FORCE_NCCL"};
    std::map<std::string, std::optional<std::string>> saved_;
};

TEST(LaunchEnv, NoLauncherIsOneProcess) {
    LaunchEnvironment env;
    const LaunchEnv e = detect_launch_env();
    EXPECT_EQ(e.world_size, 1);
    EXPECT_EQ(e.world_rank, 0);
    EXPECT_EQ(e.local_size, 1);
    EXPECT_EQ(e.local_rank, 0);
    EXPECT_EQ(e.launcher, "");
}

TEST(LaunchEnv, ReadsOpenMpi) {
    LaunchEnvironment env;
    env.set("OMPI_COMM_WORLD_SIZE", "4");
    env.set("OMPI_COMM_WORLD_RANK", "3");
    env.set("OMPI_COMM_WORLD_LOCAL_SIZE", "2");
    env.set("OMPI_COMM_WORLD_LOCAL_RANK", "1");
    const LaunchEnv e = detect_launch_env();
    EXPECT_EQ(e.launcher, "OpenMPI");
    EXPECT_EQ(e.world_size, 4);
    EXPECT_EQ(e.world_rank, 3);
    EXPECT_EQ(e.local_size, 2);
    EXPECT_EQ(e.local_rank, 1);
}

TEST(LaunchEnv, ReadsSlurmSteps) {
    LaunchEnvironment env;
    env.set("SLURM_STEP_NUM_TASKS", "8");
    env.set("SLURM_PROCID", "5");
    env.set("SLURM_NTASKS_PER_NODE", "4");
    env.set("SLURM_LOCALID", "1");
    const LaunchEnv e = detect_launch_env();
    EXPECT_EQ(e.launcher, "Slurm");
    EXPECT_EQ(e.world_size, 8);
    EXPECT_EQ(e.world_rank, 5);
    EXPECT_EQ(e.local_size, 4);
    EXPECT_EQ(e.local_rank, 1);
}

TEST(LaunchEnv, ReadsPmi) {
    LaunchEnvironment env;
    env.set("PMI_SIZE", "3");
    env.set("PMI_RANK", "2");
    const LaunchEnv e = detect_launch_env();
    EXPECT_EQ(e.launcher, "PMI");
    EXPECT_EQ(e.world_size, 3);
    EXPECT_EQ(e.world_rank, 2);
    // Without the node-local variables: one rank on this node.
    EXPECT_EQ(e.local_size, 1);
    EXPECT_EQ(e.local_rank, 0);
}

// mpirun inside a Slurm allocation: OpenMPI's variables describe this job.
TEST(LaunchEnv, OpenMpiBeforeSlurm) {
    LaunchEnvironment env;
    env.set("SLURM_STEP_NUM_TASKS", "16");
    env.set("SLURM_PROCID", "0");
    env.set("OMPI_COMM_WORLD_SIZE", "2");
    env.set("OMPI_COMM_WORLD_RANK", "1");
    const LaunchEnv e = detect_launch_env();
    EXPECT_EQ(e.launcher, "OpenMPI");
    EXPECT_EQ(e.world_size, 2);
    EXPECT_EQ(e.world_rank, 1);
}

TEST(LaunchEnv, IgnoresIncompleteOrMalformedVariables) {
    LaunchEnvironment env;
    env.set("OMPI_COMM_WORLD_SIZE", "2");  // no rank
    env.set("PMI_SIZE", "two");
    env.set("PMI_RANK", "0");
    env.set("SLURM_STEP_NUM_TASKS", "-3");
    env.set("SLURM_PROCID", "0");
    const LaunchEnv e = detect_launch_env();
    EXPECT_EQ(e.launcher, "");
    EXPECT_EQ(e.world_size, 1);
}

TEST(SoloCommunicator, CollectivesLeaveOrCopyTheData) {
    std::unique_ptr<Backend> cpu = make_backend("cpu");
    SoloCommunicator solo;
    EXPECT_EQ(solo.rank(), 0);
    EXPECT_EQ(solo.size(), 1);
    Tensor t = cpu->alloc({3}), shard = cpu->alloc({3});
    const std::vector<float> values = {1.5f, -2.0f, 3.25f};
    cpu->upload(t, values.data());
    solo.all_reduce_sum(*cpu, t);
    solo.reduce_scatter_sum(*cpu, t, shard);
    std::vector<float> got(3);
    cpu->download(shard, got.data());
    EXPECT_EQ(got, values);
    std::vector<double> host = {1.0, 2.0};
    solo.all_reduce_sum(host);
    EXPECT_EQ(host, (std::vector<double>{1.0, 2.0}));
}

TEST(OpenCommunicator, OneProcessWithoutALauncher) {
    LaunchEnvironment env;
    std::unique_ptr<Communicator> host = open_host_communicator({});
    EXPECT_EQ(host->size(), 1);
    EXPECT_EQ(host->description(), "one process");
}

TEST(OpenCommunicator, TheDeviceCommunicatorOfTheCpuIsTheHostOne) {
    LaunchEnvironment env;
    env.set("TMX_FORCE_NCCL", "1");  // asks for NCCL, which only a CUDA backend has
    std::unique_ptr<Backend> cpu = make_backend("cpu");
    std::unique_ptr<Communicator> host = open_host_communicator({});
    Communicator* before = host.get();
    std::unique_ptr<Communicator> device = open_device_communicator(*cpu, std::move(host));
    EXPECT_EQ(device.get(), before);
}

TEST(OpenCommunicator, RefusesANegativeTimeout) {
    LaunchEnvironment env;
    EXPECT_THROW(open_host_communicator({.collective_timeout_s = -1}), UsageError);
}

TEST(OpenCommunicator, WithoutMpiRefusesToRunAsOneOfSeveralRanks) {
#ifdef TMX_HAS_MPI
    GTEST_SKIP() << "this build has MPI (tests/dist/comm_check.cpp runs it as a job)";
#else
    LaunchEnvironment env;
    env.set("OMPI_COMM_WORLD_SIZE", "3");
    env.set("OMPI_COMM_WORLD_RANK", "1");
    try {
        open_host_communicator({});
        FAIL() << "expected a UsageError";
    } catch (const UsageError& e) {
        const std::string message = e.what();
        EXPECT_NE(message.find("without MPI"), std::string::npos) << message;
        EXPECT_NE(message.find("OpenMPI"), std::string::npos) << message;
        EXPECT_NE(message.find("of 3"), std::string::npos) << message;
        EXPECT_NE(message.find("-DTMX_MPI=ON"), std::string::npos) << message;
    }
#endif
}

}  // namespace
}  // namespace tmx::test

// cuBLASLt is opened when a CUDA backend is made, not when tmx starts
// (backends/cuda/cublaslt_loader.cpp). No GPU needed.
#ifdef TMX_HAS_CUDA

#include "backends/cuda/cublaslt_loader.h"

#include <cublasLt.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace tmx::test {
namespace {

// Where the toolkit tmx was built with is installed (every machine that builds the CUDA
// backend), the library opens and every function the backend calls resolves: the forwarders then
// reach the library's own functions.
TEST(CudaCublasLt, OpensAndResolvesEveryFunctionTheBackendCalls) {
    if (cuda::cublaslt_path().empty()) {  // not opened yet by an earlier test in this process
        EXPECT_STREQ(cublasLtGetStatusName(CUBLAS_STATUS_SUCCESS), "cuBLASLt not loaded")
            << "the status strings answer before the library is opened";
    }
    ASSERT_NO_THROW(cuda::load_cublaslt());
    EXPECT_NE(cuda::cublaslt_path().find("libcublasLt.so"), std::string::npos)
        << cuda::cublaslt_path();
    EXPECT_STREQ(cublasLtGetStatusName(CUBLAS_STATUS_SUCCESS), "CUBLAS_STATUS_SUCCESS");
    EXPECT_STREQ(cublasLtGetStatusName(CUBLAS_STATUS_INVALID_VALUE), "CUBLAS_STATUS_INVALID_VALUE");
    ASSERT_NO_THROW(cuda::load_cublaslt()) << "a second call returns at once";
}

// A command that opens no CUDA backend never loads the library: the dynamic loader's log of
// `tmx --help` and `tmx params` names no libcublasLt.
TEST(CudaCublasLt, CommandsWithoutACudaBackendDoNotLoadIt) {
    TempDir dir;
    const std::vector<std::string> commands = {
        "--help", "params --config " + source_dir() + "/assets/configs/tiny-mixtral.json"};
    for (const std::string& args : commands) {
        const std::string log = dir / "ld.log";
        const std::string cmd = "LD_DEBUG=libs LD_DEBUG_OUTPUT=" + log + " " +
                                std::string(TMX_BINARY) + " " + args + " > /dev/null 2>&1";
        ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
        // LD_DEBUG_OUTPUT appends the process id to the file name.
        std::string text;
        for (const auto& e : std::filesystem::directory_iterator(dir.path()))
            if (e.path().filename().string().rfind("ld.log", 0) == 0) {
                std::ifstream in(e.path());
                text.append(std::istreambuf_iterator<char>(in), {});
                std::filesystem::remove(e.path());
            }
        EXPECT_NE(text.find("libc.so"), std::string::npos) << "no loader log for tmx " << args;
        EXPECT_EQ(text.find("libcublasLt"), std::string::npos) << "tmx " << args << " loaded it";
    }
}

}  // namespace
}  // namespace tmx::test

#endif  // TMX_HAS_CUDA

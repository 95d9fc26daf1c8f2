// cuBLASLt, opened when a CUDA backend is made rather than linked into tmx (the library is about
// 540 MB: linked, loading it cost every command, `tmx --help` included, about 1.4 s and 160 MB).
#pragma once

#include <string>

namespace tmx::cuda {

// Opens libcublasLt (once; later calls return at once) and resolves the functions the backend
// calls, which cublaslt_loader.cpp defines as forwarders. Throws tmx::Error naming the library
// and why it could not be opened or lacks a function.
void load_cublaslt();

// Where the library was found ("" before load_cublaslt() succeeded).
std::string cublaslt_path();

}  // namespace tmx::cuda

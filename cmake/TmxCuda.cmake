# Finds nvcc and the CUDA toolkit (>= 12.0) and enables the CUDA language for the backend.
# Sets <found_var> to TRUE when the backend can be built.
#
# Pitfalls handled here (shared/CUDA-NOTES.md): CMake's default architecture is sm_75, so the
# L4 (89) and H100 (90) are named, plus PTX for newer cards; CMake 3.25 does not know nvcc's
# C++20 flag, so it is given explicitly (the .cu files include the engine's C++20 headers).
macro(tmx_enable_cuda found_var)
  set(${found_var} FALSE)
  # nvcc at the toolkit's usual place when it is not on PATH.
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc CACHE FILEPATH "nvcc")
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # CUDAARCHS in the environment (CMake's own variable) chooses other architectures.
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES AND NOT DEFINED ENV{CUDAARCHS})
      set(CMAKE_CUDA_ARCHITECTURES 89-real 90-real 90-virtual)
    endif()
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    enable_language(CUDA)
    find_package(CUDAToolkit 12.0)
    if(CUDAToolkit_FOUND AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.0)
      set(CMAKE_CUDA_STANDARD 20)
      set(CMAKE_CUDA_STANDARD_REQUIRED ON)
      # Register spills and local memory in our kernels are build errors: nobody can profile
      # them on a machine without a GPU, so the compiler is the gate.
      set(CMAKE_CUDA_FLAGS "${CMAKE_CUDA_FLAGS} -Xptxas=-warn-spills,-warn-lmem-usage")
      set(CMAKE_CUDA_FLAGS "${CMAKE_CUDA_FLAGS} --Werror all-warnings -Xcompiler=-Wall,-Wextra")
      set(CMAKE_CUDA_FLAGS "${CMAKE_CUDA_FLAGS} -Xcompiler=-Wno-missing-field-initializers")
      set(${found_var} TRUE)
    endif()
  endif()
endmacro()

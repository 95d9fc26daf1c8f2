# TMX_SANITIZE: everything (engine, tmx, tests) built with AddressSanitizer and
# UndefinedBehaviorSanitizer. -fno-sanitize-recover makes every UBSan finding abort, so a test
# that triggers one fails instead of printing a line nobody reads. -g1: line tables, for
# readable stack traces at little build cost. Run the tests with
# LSAN_OPTIONS=suppressions=<source>/tests/sanitizers/lsan.supp (scripts/sanitize.sh does).
#
# With clang, the libFuzzer targets under tests/fuzz are built as well (GCC has no libFuzzer).
function(tmx_enable_sanitizers)
  set(flags -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g1)
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:${flags}>")
  if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    # The instrumentation keeps clang from vectorizing `omp simd` loops; it says so for each.
    add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:-Wno-pass-failed>")
  endif()
  add_link_options(${flags})
  message(STATUS "Sanitizers: address, undefined (${CMAKE_CXX_COMPILER_ID})")
endfunction()

# libFuzzer is guided by coverage of the code it explores: the readers of untrusted input. Only
# those sources get the instrumentation (clang only); elsewhere it would only slow the tests.
function(tmx_fuzz_coverage)
  if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    set_property(SOURCE ${ARGN} APPEND PROPERTY COMPILE_OPTIONS -fsanitize=fuzzer-no-link)
  endif()
endfunction()

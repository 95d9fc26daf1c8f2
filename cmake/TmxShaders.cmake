# Compiles shaders/*.comp to SPIR-V with glslangValidator at build time and embeds the modules
# in a generated C++ file, so the binary needs no shader files at run time.
#
#   tmx_embed_shaders(<out_var> SHADER_DIR <dir>)
# sets <out_var> to the generated .cpp (add it to a target's sources).
#
# A shader listed in TMX_SHADER_VARIANTS as <name>:<suffix>:<MACRO>[+<MACRO>...] is compiled a
# second time with -D<MACRO> (each) into the module <name>_<suffix>: one source, several
# pipelines, no copies.
set(TMX_SHADER_VARIANTS)
# Weights read in 16- and 8-bit formats (shaders/weights.glsl): the matmuls' weight operand and
# the embedding table (gather_rows).
foreach(module matmul matmul_gemv grouped_matmul grouped_matmul_gemv gather_rows)
  list(APPEND TMX_SHADER_VARIANTS ${module}:f16w:TMX_WEIGHTS_F16 ${module}:bf16w:TMX_WEIGHTS_BF16
       ${module}:q8_0w:TMX_WEIGHTS_Q8_0)
endforeach()
# The tiled products on NVIDIA's cooperative matrices (shaders/matmul_tile_coopmat.glsl, variants
# ".cm"), for fp16 weights only: modules of their own, as only a device with the extension and
# its features enabled may create them (vulkan_tuning.cpp refuses those variants elsewhere).
foreach(module matmul grouped_matmul)
  list(APPEND TMX_SHADER_VARIANTS ${module}:cm_f16w:TMX_WEIGHTS_F16+TMX_MATMUL_COOPMAT)
endforeach()
# The matrix-vector shaders reducing through subgroup shuffles (shaders/gemv_reduce.glsl), in
# every weight format: modules of their own, as a module using shuffles may only be created on
# a device that has them (vulkan_tuning.cpp refuses those variants elsewhere).
foreach(module matmul_gemv grouped_matmul_gemv)
  list(APPEND TMX_SHADER_VARIANTS ${module}:sg:TMX_GEMV_SUBGROUP)
  foreach(format f16w:TMX_WEIGHTS_F16 bf16w:TMX_WEIGHTS_BF16 q8_0w:TMX_WEIGHTS_Q8_0)
    string(REPLACE ":" ";" format_parts "${format}")
    list(GET format_parts 0 format_suffix)
    list(GET format_parts 1 format_macro)
    list(APPEND TMX_SHADER_VARIANTS
         ${module}:sg_${format_suffix}:TMX_GEMV_SUBGROUP+${format_macro})
  endforeach()
endforeach()
# Prefill attention with a query's row in registers, reduced through subgroup shuffles
# (shaders/attention_tiled.comp, variants ".sg1"): a module of its own for the same reason.
list(APPEND TMX_SHADER_VARIANTS attention_tiled:sg:TMX_ATTENTION_SUBGROUP)
# Prefill attention's register-blocked form (variants ".rb4").
list(APPEND TMX_SHADER_VARIANTS attention_tiled:rb:TMX_ATTENTION_BLOCKED)

function(tmx_embed_shaders out_var)
  cmake_parse_arguments(ARG "" "SHADER_DIR" "" ${ARGN})
  file(GLOB shader_sources CONFIGURE_DEPENDS "${ARG_SHADER_DIR}/*.comp")
  file(GLOB shader_includes CONFIGURE_DEPENDS "${ARG_SHADER_DIR}/*.glsl")
  set(spv_dir "${CMAKE_CURRENT_BINARY_DIR}/shaders")
  file(MAKE_DIRECTORY "${spv_dir}")
  set(spv_files "")
  foreach(src IN LISTS shader_sources)
    get_filename_component(name "${src}" NAME_WE)
    # Each build of the source: "<module>" or "<module>:<MACRO>".
    set(builds "${name}")
    foreach(variant IN LISTS TMX_SHADER_VARIANTS)
      if(variant MATCHES "^${name}:([a-z0-9_]+):([A-Za-z0-9_+]+)$")
        list(APPEND builds "${name}_${CMAKE_MATCH_1}:${CMAKE_MATCH_2}")
      endif()
    endforeach()
    foreach(build IN LISTS builds)
      string(REPLACE ":" ";" parts "${build}")
      list(GET parts 0 module)
      set(defines "")
      if(build MATCHES ":")
        list(GET parts 1 macros)
        string(REPLACE "+" ";" macros "${macros}")
        list(TRANSFORM macros PREPEND "-D" OUTPUT_VARIABLE defines)
      endif()
      set(spv "${spv_dir}/${module}.spv")
      add_custom_command(
        OUTPUT "${spv}"
        COMMAND "${TMX_GLSLANG_VALIDATOR}" -V --target-env vulkan1.2 -I${ARG_SHADER_DIR}
                ${defines} -o "${spv}" "${src}"
        DEPENDS "${src}" ${shader_includes}
        COMMENT "glslang: ${module}"
        VERBATIM)
      list(APPEND spv_files "${spv}")
    endforeach()
  endforeach()
  set(generated "${CMAKE_CURRENT_BINARY_DIR}/generated/vulkan_shaders.cpp")
  add_custom_command(
    OUTPUT "${generated}"
    COMMAND "${CMAKE_COMMAND}" -DOUTPUT=${generated} "-DSPIRV_FILES=${spv_files}"
            -P "${PROJECT_SOURCE_DIR}/cmake/EmbedSpirv.cmake"
    DEPENDS ${spv_files} "${PROJECT_SOURCE_DIR}/cmake/EmbedSpirv.cmake"
    COMMENT "Embedding SPIR-V shaders"
    VERBATIM)
  set(${out_var} "${generated}" PARENT_SCOPE)
endfunction()

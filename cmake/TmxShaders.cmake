# Compiles shaders/*.comp to SPIR-V with glslangValidator at build time and embeds the modules
# in a generated C++ file, so the binary needs no shader files at run time.
#
#   tmx_embed_shaders(<out_var> SHADER_DIR <dir>)
# sets <out_var> to the generated .cpp (add it to a target's sources).
function(tmx_embed_shaders out_var)
  cmake_parse_arguments(ARG "" "SHADER_DIR" "" ${ARGN})
  file(GLOB shader_sources CONFIGURE_DEPENDS "${ARG_SHADER_DIR}/*.comp")
  file(GLOB shader_includes CONFIGURE_DEPENDS "${ARG_SHADER_DIR}/*.glsl")
  set(spv_dir "${CMAKE_CURRENT_BINARY_DIR}/shaders")
  file(MAKE_DIRECTORY "${spv_dir}")
  set(spv_files "")
  foreach(src IN LISTS shader_sources)
    get_filename_component(name "${src}" NAME_WE)
    set(spv "${spv_dir}/${name}.spv")
    add_custom_command(
      OUTPUT "${spv}"
      COMMAND "${TMX_GLSLANG_VALIDATOR}" -V --target-env vulkan1.2 -I${ARG_SHADER_DIR}
              -o "${spv}" "${src}"
      DEPENDS "${src}" ${shader_includes}
      COMMENT "glslang: ${name}.comp"
      VERBATIM)
    list(APPEND spv_files "${spv}")
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

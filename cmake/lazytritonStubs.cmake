# lazytriton_add_stub(<target> KERNEL module:function SIGNATURE sig [CONSTEXPRS NAME=VALUE ...]
#                     [FUNCTION name] [PYTHONPATH dir ...])
# Generates <name>.h/.cc with `lazytriton export-cpp` at build time (rerun when
# the kernel's module changes) and adds them to <target>.
function(lazytriton_add_stub target)
  cmake_parse_arguments(ARG "" "KERNEL;SIGNATURE;FUNCTION" "CONSTEXPRS;PYTHONPATH" ${ARGN})
  if(NOT ARG_KERNEL OR NOT DEFINED ARG_SIGNATURE)
    message(FATAL_ERROR "lazytriton_add_stub(${target}): KERNEL and SIGNATURE are required")
  endif()
  if(NOT lazytriton_PYTHON_EXECUTABLE)
    message(FATAL_ERROR "lazytriton_add_stub: this lazytriton was built without a Python interpreter; "
                        "run `lazytriton export-cpp` yourself and add the files")
  endif()
  string(REGEX REPLACE "^.*:" "" fn "${ARG_KERNEL}")
  if(NOT ARG_FUNCTION)
    set(ARG_FUNCTION "launch_${fn}")
  endif()
  set(out_dir "${CMAKE_CURRENT_BINARY_DIR}/lazytriton_stubs/${target}")  # per target: no shared outputs
  set(cmd "${lazytriton_PYTHON_EXECUTABLE}" -m lazytriton export-cpp "${ARG_KERNEL}"
          --signature "${ARG_SIGNATURE}" --function "${ARG_FUNCTION}" --out-dir "${out_dir}")
  foreach(c IN LISTS ARG_CONSTEXPRS)
    list(APPEND cmd --constexpr "${c}")
  endforeach()
  string(REGEX REPLACE ":.*$" "" mod "${ARG_KERNEL}")
  string(REPLACE "." "/" mod "${mod}")
  set(deps "")
  foreach(p IN LISTS ARG_PYTHONPATH)
    list(APPEND cmd --path "${p}")
    if(EXISTS "${p}/${mod}.py")
      list(APPEND deps "${p}/${mod}.py")
    endif()
  endforeach()
  add_custom_command(
    OUTPUT "${out_dir}/${ARG_FUNCTION}.h" "${out_dir}/${ARG_FUNCTION}.cc"
    COMMAND ${cmd}
    DEPENDS ${deps}
    COMMENT "lazytriton export-cpp ${ARG_KERNEL} -> ${ARG_FUNCTION}"
    VERBATIM)
  target_sources(${target} PRIVATE "${out_dir}/${ARG_FUNCTION}.cc" "${out_dir}/${ARG_FUNCTION}.h")
  target_include_directories(${target} PRIVATE "${out_dir}")
endfunction()

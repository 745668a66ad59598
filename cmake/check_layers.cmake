# Fails when an include points up the layers, or names no folder. Run as a CPU test:
#   cmake -DROOT=<tree> -P cmake/check_layers.cmake
# The layers, lowest first; a file may include its own layer and those below it:
#   templates/  device code; includes only other templates/ headers, by bare name (NVRTC sees
#               them under those names)
#   jit/        key -> source -> NVRTC -> cache -> driver -> engine -> launch
#   oracle/     float64 references, host number formats, the workloads that check a call (the
#               tests' and the tuner's self-check's, not the tuner)
#   autotune/   launch policy, heuristic, candidates, tuner, tuning file
#   api/        the public entry points; installs autotune's policy in the engine
#   cli/        the `ropejit` command
# Public headers (include/ropejit/...) may be included from every host layer.
# Within a host layer, a kernel family's folder (jit/decode/, oracle/decode/, autotune/decode/) is
# a room: the layer's own files (those directly in jit/, oracle/, autotune/) never include one, so
# the core of each layer builds without any family on top of it.
if(NOT ROOT)
  message(FATAL_ERROR "usage: cmake -DROOT=<tree> -P check_layers.cmake")
endif()
set(layers templates jit oracle autotune api cli)
set(problems "")

file(GLOB device_files RELATIVE ${ROOT} ${ROOT}/templates/*.cuh ${ROOT}/templates/*.cu.in)
foreach(file IN LISTS device_files)
  file(STRINGS ${ROOT}/${file} lines REGEX "^[ \t]*#[ \t]*include")
  foreach(line IN LISTS lines)
    # ${CMAKE_MATCH_1} expands before if() runs, so the match and the test are two steps.
    set(name "")
    if(line MATCHES "#[ \t]*include[ \t]+\"([^\"/]+)\"")
      set(name ${CMAKE_MATCH_1})
    endif()
    # The entry template's header is a binding (jit/render.cpp binds a templates/ header).
    if(name MATCHES "^{{[a-z_]+}}$")
      continue()
    endif()
    if(name STREQUAL "" OR NOT EXISTS ${ROOT}/templates/${name})
      string(APPEND problems "  ${file}: '${line}': device code includes only templates/ headers, by bare name\n")
    endif()
  endforeach()
endforeach()

foreach(layer IN LISTS layers)
  if(layer STREQUAL templates)
    continue()
  endif()
  list(FIND layers ${layer} own)
  file(GLOB_RECURSE host_files RELATIVE ${ROOT} ${ROOT}/${layer}/*.cpp ${ROOT}/${layer}/*.hpp)
  foreach(file IN LISTS host_files)
    file(STRINGS ${ROOT}/${file} lines REGEX "^[ \t]*#[ \t]*include[ \t]+\"")
    foreach(line IN LISTS lines)
      string(REGEX REPLACE ".*#[ \t]*include[ \t]+\"([^\"]*)\".*" "\\1" target "${line}")
      if(NOT target MATCHES "^([a-z_]+)/")
        string(APPEND problems "  ${file}: \"${target}\" names no folder: include it as \"<layer>/${target}\"\n")
        continue()
      endif()
      set(folder ${CMAKE_MATCH_1})
      if(folder STREQUAL ropejit)
        continue()  # the public headers
      endif()
      list(FIND layers ${folder} theirs)
      string(REGEX MATCH "^${layer}/[^/]+$" in_core "${file}")
      string(REGEX MATCH "^${layer}/[a-z_]+/" into_room "${target}")
      if(in_core AND into_room)
        string(APPEND problems "  ${file}: \"${target}\" is a family's room: ${layer}/'s own files include no family folder\n")
      endif()
      if(theirs EQUAL -1)
        string(APPEND problems "  ${file}: \"${target}\" is in no layer\n")
      elseif(theirs GREATER own)
        string(APPEND problems "  ${file}: \"${target}\" points up (${layer}/ may include ${layer}/ and below)\n")
      endif()
    endforeach()
  endforeach()
endforeach()

if(problems)
  message(FATAL_ERROR "layer check failed in ${ROOT}:\n${problems}")
endif()
message(STATUS "layer check: every include in ${ROOT} points down")

# Dependencies of a pip build (scikit-build-core sets SKBUILD): nlohmann_json, xxHash and CLI11
# from the system or CMAKE_PREFIX_PATH when there, else from .deps/, which tools/fetch-deps.sh
# fills from Debian's packages without root. This is what lets `pip install .` work on a clean
# clone; other machines install the three packages or pass their prefix
# (pip install . -C cmake.define.CMAKE_PREFIX_PATH=DIR).
set(_ropejit_deps ${CMAKE_CURRENT_LIST_DIR}/../.deps)
get_filename_component(_ropejit_deps ${_ropejit_deps} ABSOLUTE)
if(EXISTS ${_ropejit_deps}/.complete)
  list(APPEND CMAKE_PREFIX_PATH ${_ropejit_deps}/usr)
endif()
find_package(nlohmann_json 3.10 QUIET)
find_package(CLI11 2.0 QUIET)
find_path(XXHASH_INCLUDE_DIR xxhash.h)
if(NOT nlohmann_json_FOUND OR NOT CLI11_FOUND OR NOT XXHASH_INCLUDE_DIR)
  if(EXISTS ${_ropejit_deps}/.complete)
    message(FATAL_ERROR "ropejit: ${_ropejit_deps} lacks nlohmann_json, CLI11 or xxhash.h; "
                        "remove it and build again")
  endif()
  message(STATUS "ropejit: fetching build dependencies into ${_ropejit_deps} (tools/fetch-deps.sh)")
  execute_process(COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/../tools/fetch-deps.sh ${_ropejit_deps}
                  RESULT_VARIABLE _ropejit_fetch)
  if(NOT _ropejit_fetch EQUAL 0)
    message(FATAL_ERROR "ropejit: tools/fetch-deps.sh failed (it needs apt-get, Debian/Ubuntu); "
                        "install nlohmann-json3-dev, libxxhash-dev and libcli11-dev, or pass "
                        "-C cmake.define.CMAKE_PREFIX_PATH=DIR where they are installed")
  endif()
  list(APPEND CMAKE_PREFIX_PATH ${_ropejit_deps}/usr)
  unset(XXHASH_INCLUDE_DIR CACHE)
endif()

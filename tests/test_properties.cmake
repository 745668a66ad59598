# Run by CTest after the suites' discovered tests are added (TEST_INCLUDE_FILES, set in
# tests/CMakeLists.txt). The names come from the binaries themselves, so the properties follow
# the source's decorators:
# - the GPU suite's doctest suite "exhaustive" (the sweeps over every variant) is labelled
#   `exhaustive` beside `gpu`: `ctest -LE exhaustive` (tools/dev.sh test) leaves them out and
#   `ctest -L exhaustive` (tools/dev.sh exhaustive) runs them;
# - doctest's suite "long" (minutes each on the GPU host, mostly kernel compiles) raises a case's
#   COST, so that CTest starts it first when the build folder has no timings of its own yet:
#   started late, the long cases set the end of the run. The GPU suite's go before the CPU
#   suite's, which go before the other GPU cases (COST 100, tests/CMakeLists.txt).
function(ropejit_suite_cases binary suite out)
  execute_process(COMMAND "${binary}" --test-suite=${suite} --list-test-cases
                  OUTPUT_VARIABLE listed RESULT_VARIABLE status)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "${binary} --list-test-cases failed (${status}): ${listed}")
  endif()
  string(REPLACE "\n" ";" lines "${listed}")
  set(cases)
  foreach(line IN LISTS lines)
    if(NOT (line STREQUAL "" OR line MATCHES "^=+$" OR line MATCHES "^\\[doctest\\] "))
      list(APPEND cases "${line}")
    endif()
  endforeach()
  set(${out} "${cases}" PARENT_SCOPE)
endfunction()

if(EXISTS "${ROPEJIT_GPU_TESTS}")  # else not built yet: doctest's include file reports that
  ropejit_suite_cases("${ROPEJIT_GPU_TESTS}" exhaustive cases)
  foreach(name IN LISTS cases)
    set_tests_properties("${name}" PROPERTIES LABELS "gpu;exhaustive")
  endforeach()
  ropejit_suite_cases("${ROPEJIT_GPU_TESTS}" long cases)
  foreach(name IN LISTS cases)
    set_tests_properties("${name}" PROPERTIES COST 1000)
  endforeach()
endif()
if(EXISTS "${ROPEJIT_CPU_TESTS}")
  ropejit_suite_cases("${ROPEJIT_CPU_TESTS}" long cases)
  foreach(name IN LISTS cases)
    set_tests_properties("${name}" PROPERTIES COST 500)
  endforeach()
endif()

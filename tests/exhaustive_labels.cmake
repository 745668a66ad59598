# Run by CTest after the GPU suite's discovered tests are added (TEST_INCLUDE_FILES, set in
# tests/CMakeLists.txt): every test case of doctest's suite "exhaustive" (the sweeps over every
# variant) is labelled `exhaustive` beside `gpu`. `ctest -LE exhaustive` (tools/dev.sh test)
# then leaves them out and `ctest -L exhaustive` (tools/dev.sh exhaustive) runs them. The names
# come from the binary itself, so the labels follow the source's decorators.
if(NOT EXISTS "${ROPEJIT_GPU_TESTS}")
  return()  # not built yet: doctest's include file reports that
endif()
execute_process(COMMAND "${ROPEJIT_GPU_TESTS}" --test-suite=exhaustive --list-test-cases
                OUTPUT_VARIABLE listed RESULT_VARIABLE status)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "${ROPEJIT_GPU_TESTS} --list-test-cases failed (${status}): ${listed}")
endif()
string(REPLACE "\n" ";" lines "${listed}")
foreach(line IN LISTS lines)
  if(line STREQUAL "" OR line MATCHES "^=+$" OR line MATCHES "^\\[doctest\\] ")
    continue()
  endif()
  set_tests_properties("${line}" PROPERTIES LABELS "gpu;exhaustive")
endforeach()

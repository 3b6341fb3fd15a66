# cmake -DCMD=<command;args> -DREGEX=<regex> -P expect_output.cmake
# Passes when the command exits 0 AND its output matches REGEX (e.g. a figure the run must print),
# so a run that fails, or succeeds without the figure, fails the test.
execute_process(COMMAND ${CMD} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the command failed (exit ${rc}):\n${out}\n${err}")
endif()
if(NOT "${out}${err}" MATCHES "${REGEX}")
  message(FATAL_ERROR "the command succeeded, but its output does not match '${REGEX}':\n${out}\n${err}")
endif()
message(STATUS "matched '${REGEX}'")

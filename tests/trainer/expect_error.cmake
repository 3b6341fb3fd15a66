# cmake -DCMD=<command;args> -DREGEX=<regex> -P expect_error.cmake
# Passes when the command exits non-zero AND its output matches REGEX (a typed gflow error with
# its fix), so a crash with the wrong message, or a run that succeeds, fails the test.
execute_process(COMMAND ${CMD} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0)
  message(FATAL_ERROR "expected a failure, the command succeeded:\n${out}\n${err}")
endif()
if(NOT "${out}${err}" MATCHES "${REGEX}")
  message(FATAL_ERROR "exit code ${rc}, but the output does not match '${REGEX}':\n${out}\n${err}")
endif()
message(STATUS "failed as expected (exit ${rc}): ${err}")

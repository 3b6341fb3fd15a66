# Runs one fault scenario of gflow_mpi_faults under mpiexec and checks what the ranks printed.
#   cmake -DMPIEXEC=... -DNP=4 -DEXE=... -DSCENARIO=never|stuck|exit|exit_killed -DTIMEOUT_MS=1500 [-DMPI_FLAGS="a;b"] -P run_fault.cmake
# exit_killed is exit under Open MPI's default policy (a rank that leaves without MPI_Finalize
# gets the whole job killed): the dying rank must print its 'exits' line, the job must end
# quickly, and no survivor may report success. No rank may print 'unsettled' (any scenario).
# Every surviving rank must print a timeout_error (or transport_error) naming the operation and
# the rank that did not arrive, within the timeout plus the stall inspector's grace period plus
# slack for a loaded machine; the whole job must end long before ctest's TIMEOUT.
cmake_minimum_required(VERSION 3.20)
foreach(v MPIEXEC NP EXE SCENARIO TIMEOUT_MS)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "run_fault.cmake: -D${v}=... is required")
  endif()
endforeach()

set(grace_ms 100)  # transport::grace(): timeout / 5 clamped to [100, 5000] ms
math(EXPR g "${TIMEOUT_MS} / 5")
if(g GREATER 5000)
  set(grace_ms 5000)
elseif(g GREATER 100)
  set(grace_ms ${g})
endif()
math(EXPR bound_ms "${TIMEOUT_MS} + ${grace_ms} + 5000")  # 5 s of slack: 4 busy-polling ranks on a loaded 2-core machine
math(EXPR last "${NP} - 1")

set(flags --allow-run-as-root --oversubscribe)
set(run_scenario ${SCENARIO})
if(SCENARIO STREQUAL "exit_killed")
  set(run_scenario exit)
elseif(SCENARIO STREQUAL "exit")
  # Open MPI kills the whole job when a rank exits without MPI_Finalize; this lets the
  # survivors run on and report.
  list(APPEND flags --mca orte_allowed_exit_without_sync 1)
endif()
string(TIMESTAMP t0 "%s")
execute_process(COMMAND ${MPIEXEC} ${flags} ${MPI_FLAGS} -n ${NP} ${EXE} ${run_scenario} ${TIMEOUT_MS}
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 90)
string(TIMESTAMP t1 "%s")
math(EXPR took "${t1} - ${t0}")
message("mpiexec exit: ${rc}, ${took} s\n--- stdout ---\n${out}--- stderr ---\n${err}")
set(failures "")

if(took GREATER 60)
  string(APPEND failures "the job took ${took} s (bound 60 s).\n")
endif()

# expect(rank kind-regex subject what-regex): rank's FAULT line matches, within bound_ms.
function(expect rank kinds subject what)
  string(REGEX MATCH "FAULT rank=${rank} kind=([a-z_]+) subject=([a-z_]+) ms=([0-9]+) what=([^\n]*)" line "${out}")
  if(NOT line)
    set(failures "${failures}rank ${rank} printed no FAULT line.\n" PARENT_SCOPE)
    return()
  endif()
  set(kind "${CMAKE_MATCH_1}")
  set(sub "${CMAKE_MATCH_2}")
  set(ms "${CMAKE_MATCH_3}")
  set(text "${CMAKE_MATCH_4}")
  set(f "")
  if(NOT kind MATCHES "^(${kinds})$")
    string(APPEND f "rank ${rank}: kind ${kind}, expected ${kinds}.\n")
  endif()
  if(NOT sub STREQUAL "${subject}")
    string(APPEND f "rank ${rank}: subject '${sub}', expected '${subject}'.\n")
  endif()
  if(ms GREATER bound_ms)
    string(APPEND f "rank ${rank}: reported after ${ms} ms, bound ${bound_ms} ms.\n")
  endif()
  if(NOT text MATCHES "${what}")
    string(APPEND f "rank ${rank}: message does not match '${what}'.\n")
  endif()
  set(failures "${failures}${f}" PARENT_SCOPE)
endfunction()

if(SCENARIO STREQUAL "never")
  if(NOT rc EQUAL 0)
    string(APPEND failures "mpiexec exited with ${rc}; every rank should finish cleanly.\n")
  endif()
  foreach(r RANGE 0 ${last})
    if(r LESS last)
      expect(${r} "timeout_error" "all_reduce" "collective #[0-9]+ all_reduce\\(.*rank\\(s\\) ${last} (did|had) not arrive")
    endif()
  endforeach()
elseif(SCENARIO STREQUAL "stuck")
  if(NOT rc EQUAL 0)
    string(APPEND failures "mpiexec exited with ${rc}; every rank should finish cleanly.\n")
  endif()
  expect(0 "timeout_error" "all_reduce" "rank\\(s\\) 1 did not arrive \\(rank 1: has started [0-9]+ collective\\(s\\) and is waiting in recv with rank 0")
  foreach(r RANGE 2 ${last})
    expect(${r} "timeout_error" "all_reduce" "rank\\(s\\) 1 (did|had) not arrive")
  endforeach()
  expect(1 "timeout_error" "recv" "recv\\(64 x f32, from rank 0\\); the peer, rank 0 did not arrive")
elseif(SCENARIO STREQUAL "exit")
  if(NOT out MATCHES "FAULT rank=${last} exits")
    string(APPEND failures "rank ${last} did not reach its exit.\n")
  endif()
  foreach(r RANGE 0 ${last})
    if(r LESS last)
      expect(${r} "timeout_error|transport_error" "all_reduce" "rank\\(s\\) ${last} (did|had) not arrive")
    endif()
  endforeach()
elseif(SCENARIO STREQUAL "exit_killed")
  # The job must have died of the rank's exit, not of anything earlier (a crash at start-up, a bad
  # command line, a missing binary would exit non-zero quickly too).
  if(NOT out MATCHES "FAULT rank=${last} exits")
    string(APPEND failures "rank ${last} did not reach its exit: the job ended for another reason.\n")
  endif()
  if(rc EQUAL 0)
    string(APPEND failures "mpiexec exited with 0; Open MPI should have killed the job.\n")
  endif()
  if(took GREATER 20)
    string(APPEND failures "the killed job took ${took} s (bound 20 s).\n")
  endif()
  if(out MATCHES "kind=none")
    string(APPEND failures "a survivor completed the collective the dead rank never joined.\n")
  endif()
  # Killed, not merely failed: the launcher says it ended the job for the rank's exit, and no
  # survivor lived to its own timeout (TIMEOUT_MS is long here) to report the fault itself.
  if(NOT "${out}${err}" MATCHES "process rank ${last} [^\n]*\n?[^\n]*exiting improperly")
    string(APPEND failures "mpiexec did not report rank ${last}'s improper exit: the launcher did not end the job for it.\n")
  endif()
  string(REGEX MATCHALL "FAULT rank=[0-9]+ kind=[a-z_]+" reports "${out}")
  if(reports)
    string(APPEND failures "survivors reported the fault themselves (${reports}): they were not killed, they timed out.\n")
  endif()
else()
  message(FATAL_ERROR "run_fault.cmake: unknown scenario ${SCENARIO}")
endif()

# fault_driver.cpp prints 'FAULT rank=R unsettled' when an abandoned collective did not complete
# within settle()'s 30 s: MPI could still write the buffers that are about to be freed.
string(REGEX MATCHALL "FAULT rank=[0-9]+ unsettled" unsettled "${out}")
if(unsettled)
  string(APPEND failures "an abandoned collective never completed: ${unsettled}.\n")
endif()

if(failures)
  message(FATAL_ERROR "fault scenario '${SCENARIO}' failed:\n${failures}")
endif()
message("fault scenario '${SCENARIO}': every check passed")

# Tests that configure leaves out are said loudly, never dropped in silence.
#   gflow_drop_tests(<what> <why>)   at each place a check leaves tests unregistered
# prints a WARNING naming them, and records them; gflow_report_dropped_tests(), called once at the
# end of the top-level configure, lists them all again and, with -DGFLOW_REQUIRE_TESTS=ON (what
# scripts/test.sh and CI pass), fails the configure: on a machine where every test should run, a
# missing package must fail CI, not shrink it.
option(GFLOW_REQUIRE_TESTS "Fail the configure when a check leaves tests unregistered (scripts/test.sh sets it)" OFF)

function(gflow_drop_tests what why)
  message(WARNING "gflow: ${what} NOT registered: ${why}")
  set_property(GLOBAL APPEND PROPERTY GFLOW_DROPPED_TESTS "${what}: ${why}")
endfunction()

function(gflow_report_dropped_tests)
  get_property(dropped GLOBAL PROPERTY GFLOW_DROPPED_TESTS)
  if(NOT dropped)
    message(STATUS "gflow: every test is registered")
    return()
  endif()
  list(LENGTH dropped n)
  list(JOIN dropped "\n  " text)
  if(GFLOW_REQUIRE_TESTS)
    message(FATAL_ERROR "gflow: ${n} group(s) of tests would not run (GFLOW_REQUIRE_TESTS=ON):\n  ${text}\n"
                        "Install what they need (bash scripts/install-deps.sh), or configure with -DGFLOW_REQUIRE_TESTS=OFF.")
  endif()
  message(WARNING "gflow: ${n} group(s) of tests are not registered on this machine:\n  ${text}")
endfunction()

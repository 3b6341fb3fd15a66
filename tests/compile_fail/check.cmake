# Compile-fail check for one case: cmake -DCXX=<compiler> -DSOURCE=<case.cpp>
#   -DINCLUDE_DIRS=<dir>[|<dir>...] [-DCXX_ID=GNU|Clang] [-DSTD_FLAG=-std=c++20]
#   [-DPCH=<dir>/gflow/exchanger.hpp.gch -DPCH_DIR=<dir> -DHEADERS=<include/gflow>] -P check.cmake
# With PCH (GCC), <dir> is searched first unless the .gch is missing or older than a header.
#
# The case's first line says what must happen:
#   // build error: <text>   compilation must FAIL and the compiler output must contain <text>
#   // build ok              compilation must SUCCEED (the positive control)
# An optional second line "// build errors: <N>" also requires exactly N compiler lines with
# ": error: " (a guard that names the fix must not come with a cascade of template errors).
# The text is matched literally (no regex), against stdout + stderr, with the compiler run
# under LC_ALL=C and without colours so quotes and escapes are stable.
cmake_minimum_required(VERSION 3.24)

foreach(var CXX SOURCE INCLUDE_DIRS)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "check.cmake: pass -D${var}=...")
  endif()
endforeach()
if(NOT DEFINED STD_FLAG)
  set(STD_FLAG -std=c++20)
endif()

file(STRINGS "${SOURCE}" first_line LIMIT_COUNT 1)
string(REGEX REPLACE "\r$" "" first_line "${first_line}")
# The second line, read as text (a list of lines would merge them where a line holds a bracket).
file(READ "${SOURCE}" head_text LIMIT 4096)
set(expect_errors "")
if(head_text MATCHES "^[^\n]*\n// build errors: ([0-9]+)[ \t\r]*\n")
  set(expect_errors "${CMAKE_MATCH_1}")
endif()
get_filename_component(case_name "${SOURCE}" NAME_WE)
if(first_line MATCHES "^// build error: (.+)$")
  set(expect_fail TRUE)
  string(STRIP "${CMAKE_MATCH_1}" expected)
elseif(first_line MATCHES "^// build ok[ \t]*$")
  set(expect_fail FALSE)
else()
  message(FATAL_ERROR "compile_fail.${case_name}: the first line of ${SOURCE} must be "
                      "'// build error: <expected text>' or '// build ok', not:\n  ${first_line}")
endif()

string(REPLACE "|" ";" include_list "${INCLUDE_DIRS}")
if(DEFINED PCH AND EXISTS "${PCH}")
  set(pch_fresh TRUE)
  file(GLOB_RECURSE headers "${HEADERS}/*.hpp")
  foreach(h IN LISTS headers)
    if("${h}" IS_NEWER_THAN "${PCH}")
      file(TIMESTAMP "${h}" th "%s")
      file(TIMESTAMP "${PCH}" tp "%s")
      if(th GREATER tp)  # equal seconds: IS_NEWER_THAN is true for ties
        set(pch_fresh FALSE)
        break()
      endif()
    endif()
  endforeach()
  if(pch_fresh)
    list(PREPEND include_list "${PCH_DIR}")
  else()
    message(STATUS "compile_fail: ${PCH} is older than a header; compiling without it (cmake --build rebuilds it)")
  endif()
endif()
set(include_flags)
foreach(dir IN LISTS include_list)
  list(APPEND include_flags "-I${dir}")
endforeach()
set(cmd "${CXX}" ${STD_FLAG} -fsyntax-only -fdiagnostics-color=never ${include_flags} "${SOURCE}")

execute_process(COMMAND "${CMAKE_COMMAND}" -E env LC_ALL=C LANG=C ${cmd}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(output "${out}${err}")
list(JOIN cmd " " cmd_text)

# Prints the details verbatim (message(FATAL_ERROR) would re-wrap them), then fails.
function(fail summary details)
  message(NOTICE "${details}")
  message(FATAL_ERROR "${summary}")
endfunction()

if(NOT expect_fail)
  if(NOT rc EQUAL 0)
    fail("compile_fail.${case_name}: the positive control must compile, but it failed (exit ${rc}). "
         "The harness or the headers are broken."
         "command: ${cmd_text}\n--- compiler output ---\n${output}")
  endif()
  message(STATUS "compile_fail.${case_name}: compiled, as expected")
  return()
endif()

if(rc EQUAL 0)
  fail("compile_fail.${case_name}: expected compilation to FAIL, but it compiled cleanly."
       "expected a compile error containing:\n+ ${expected}\ncommand: ${cmd_text}")
endif()
if(rc MATCHES "[^0-9]")
  message(FATAL_ERROR "compile_fail.${case_name}: the compiler could not be run (${rc}).\ncommand: ${cmd_text}")
endif()

string(FIND "${output}" "${expected}" at)
if(at EQUAL -1)
  # Show what the compiler did say: its error lines, so the mismatch is easy to see.
  string(REPLACE ";" "\\;" escaped "${output}")
  string(REPLACE "\n" ";" lines "${escaped}")
  set(errors)
  foreach(line IN LISTS lines)
    if(line MATCHES ": (fatal )?error: ")
      string(APPEND errors "- ${line}\n")
    endif()
  endforeach()
  if(errors STREQUAL "")
    set(errors "- (no line with 'error:')\n")
  endif()
  fail("compile_fail.${case_name}: compilation failed as expected, but not with the expected message (diff above)."
       "command: ${cmd_text}\n--- full compiler output ---\n${output}\n--- end of compiler output ---\n"
       "expected (a substring of the compiler output):\n+ ${expected}\nthe compiler's error lines:\n${errors}")
endif()
if(NOT expect_errors STREQUAL "")
  string(REPLACE ";" "," output_no_semicolons "${output}")  # a ';' in a message would split the list
  string(REGEX MATCHALL "[^\n]*: (fatal )?error: [^\n]*" error_lines "${output_no_semicolons}")
  list(LENGTH error_lines n_errors)
  if(NOT n_errors EQUAL expect_errors)
    fail("compile_fail.${case_name}: expected exactly ${expect_errors} error(s), the compiler reported ${n_errors} (a cascade)."
         "command: ${cmd_text}\n--- full compiler output ---\n${output}")
  endif()
endif()
message(STATUS "compile_fail.${case_name}: failed to compile with the expected message:\n  ${expected}")

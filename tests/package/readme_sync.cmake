# readme.usage_in_sync: README.md must contain, verbatim, the lines of
# examples/00_readme_usage.cpp between "// [readme-begin]" and "// [readme-end]".
#   cmake -DSOURCE_DIR=<gflow checkout> -P readme_sync.cmake            check
#   cmake -DSOURCE_DIR=<gflow checkout> -DUPDATE=ON -P readme_sync.cmake
#       rewrite the ```cpp block between "<!-- readme-usage-begin -->" and
#       "<!-- readme-usage-end -->" in README.md with the current snippet.
cmake_minimum_required(VERSION 3.24)

if(NOT SOURCE_DIR)
  message(FATAL_ERROR "readme_sync.cmake: pass -DSOURCE_DIR=<gflow checkout>")
endif()
set(example "${SOURCE_DIR}/examples/00_readme_usage.cpp")
set(readme "${SOURCE_DIR}/README.md")

include(${CMAKE_CURRENT_LIST_DIR}/../read_lines.cmake)  # read_lines(), restore()

# ---- the snippet ------------------------------------------------------------------------------
read_lines("${example}" example_lines)
set(snippet_lines)
set(state before)
foreach(line IN LISTS example_lines)
  restore("${line}" raw)
  if(raw MATCHES "^[ \t]*// \\[readme-begin\\]")
    set(state inside)
  elseif(raw MATCHES "^[ \t]*// \\[readme-end\\]")
    set(state after)
    break()
  elseif(state STREQUAL "inside")
    list(APPEND snippet_lines "${line}")
  endif()
endforeach()
if(NOT state STREQUAL "after" OR NOT snippet_lines)
  message(FATAL_ERROR "readme.usage_in_sync: ${example} needs a non-empty region between the lines "
                      "'// [readme-begin]' and '// [readme-end]'.")
endif()
set(snippet "")
foreach(line IN LISTS snippet_lines)
  restore("${line}" raw)
  string(APPEND snippet "${raw}\n")
endforeach()
list(LENGTH snippet_lines snippet_count)

string(CONCAT how_to_fix
  "To fix: copy the lines between '// [readme-begin]' and '// [readme-end]' of "
  "examples/00_readme_usage.cpp into README.md as a ```cpp block, unchanged. If README.md marks "
  "the block with <!-- readme-usage-begin --> and <!-- readme-usage-end --> lines, "
  "'cmake -DSOURCE_DIR=. -DUPDATE=ON -P tests/package/readme_sync.cmake' does it for you. "
  "Change the example first (it is compiled and run by example.readme_usage), then the README.")

# Prints the details verbatim (message(FATAL_ERROR) would re-wrap them), then fails.
function(fail summary details)
  message(NOTICE "${details}")
  message(FATAL_ERROR "${summary}")
endfunction()

# ---- update mode ------------------------------------------------------------------------------
if(UPDATE)
  if(NOT EXISTS "${readme}")
    message(FATAL_ERROR "readme_sync: ${readme} does not exist.")
  endif()
  file(READ "${readme}" text)
  string(FIND "${text}" "<!-- readme-usage-begin -->" b)
  string(FIND "${text}" "<!-- readme-usage-end -->" e)
  if(b EQUAL -1 OR e EQUAL -1 OR e LESS b)
    message(FATAL_ERROR "readme_sync: README.md has no '<!-- readme-usage-begin -->' ... "
                        "'<!-- readme-usage-end -->' region to update.")
  endif()
  string(LENGTH "<!-- readme-usage-begin -->" blen)
  math(EXPR head_len "${b} + ${blen}")
  string(SUBSTRING "${text}" 0 ${head_len} head)
  string(SUBSTRING "${text}" ${e} -1 tail)
  file(WRITE "${readme}" "${head}\n```cpp\n${snippet}```\n${tail}")
  message(STATUS "readme_sync: README.md updated with ${snippet_count} lines from examples/00_readme_usage.cpp")
  return()
endif()

# ---- check ------------------------------------------------------------------------------------
if(NOT EXISTS "${readme}")
  fail("readme.usage_in_sync: ${readme} does not exist yet, so it cannot show the usage example."
       "${how_to_fix}\n--- the snippet ---\n${snippet}")
endif()
file(READ "${readme}" readme_text)
string(REPLACE "\r" "" readme_text "${readme_text}")
string(FIND "${readme_text}" "${snippet}" at)
if(NOT at EQUAL -1)
  message(STATUS "readme.usage_in_sync: README.md contains the ${snippet_count}-line snippet of examples/00_readme_usage.cpp")
  return()
endif()

# Not found: find where the README's copy starts (its first line) and report the first line
# that differs, diff style.
read_lines("${readme}" readme_lines)
list(GET snippet_lines 0 first)
list(FIND readme_lines "${first}" start)
if(start EQUAL -1)
  restore("${first}" first_raw)
  fail("readme.usage_in_sync: README.md does not contain the usage snippet; not even its first line was found: ${first_raw}"
       "${how_to_fix}\n--- the snippet ---\n${snippet}")
endif()
list(LENGTH readme_lines readme_count)
set(diff "")
set(k 0)
foreach(line IN LISTS snippet_lines)
  math(EXPR r "${start} + ${k}")
  math(EXPR readme_line_no "${r} + 1")
  math(EXPR snippet_line_no "${k} + 1")
  restore("${line}" want)
  if(r LESS readme_count)
    list(GET readme_lines ${r} got_enc)
    restore("${got_enc}" got)
  else()
    set(got "<end of README.md>")
  endif()
  if(NOT got STREQUAL want)
    string(CONCAT diff "first difference at snippet line ${snippet_line_no} / README.md line ${readme_line_no}:\n"
             "- README.md:  ${got}\n+ example:    ${want}\n")
    break()
  endif()
  math(EXPR k "${k} + 1")
endforeach()
fail("readme.usage_in_sync: README.md's usage example differs from examples/00_readme_usage.cpp."
     "${diff}${how_to_fix}\n--- the snippet ---\n${snippet}")

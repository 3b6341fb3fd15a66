# layering.clients_use_facades: the code outside include/ that shows how gflow is used (bench/,
# examples/) includes only what a user includes: the facades (layer "facade" of layers.txt) and
# the other public headers (the "public" lines of layers.txt: the transports a composition binds
# to, the errors), and names nothing in gflow::detail. A file that needs more says why in a
# comment line
#     // layering: <why this file needs internals>
# and its includes and names are then accepted. Every file of DIRS except data (layouts) is at most
# MAX_LINES lines when MAX_LINES_DIRS names its directory.
#   cmake -DROOT=<repo> -DLAYERS=<repo>/tests/layering/layers.txt -DDIRS=bench,examples
#         [-DMAX_LINES=450 -DMAX_LINES_DIRS=bench] -P check_clients.cmake
cmake_minimum_required(VERSION 3.24)
foreach(var ROOT LAYERS DIRS)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check_clients.cmake: pass -D${var}=...")
  endif()
endforeach()

string(REPLACE "," ";" DIRS "${DIRS}")
string(REPLACE "," ";" MAX_LINES_DIRS "${MAX_LINES_DIRS}")

# ---- what a client may include: the facade layer and the public lines --------------------------
file(STRINGS "${LAYERS}" facade_lines REGEX "^[0-9]+[ \t]+facade[ \t]")
file(STRINGS "${LAYERS}" public_lines REGEX "^public[ \t]")
set(allowed)
foreach(line IN LISTS facade_lines public_lines)
  if(NOT line MATCHES "^([0-9]+[ \t]+facade|public)[ \t]+([^ \t]+)[ \t]*$")
    message(FATAL_ERROR "layers.txt: a facade or public rule is '<rank> facade <regex>' or 'public <regex>', not: ${line}")
  endif()
  list(APPEND allowed "${CMAKE_MATCH_2}")
endforeach()
if(NOT allowed)
  message(FATAL_ERROR "layers.txt names no facade: nothing a client could include")
endif()

set(problems "")
set(nfiles 0)
set(nreasons 0)
foreach(dir IN LISTS DIRS)
  if(NOT IS_DIRECTORY "${ROOT}/${dir}")
    message(FATAL_ERROR "check_clients.cmake: ${ROOT}/${dir} is not a directory")
  endif()
  file(GLOB_RECURSE sources RELATIVE "${ROOT}" "${ROOT}/${dir}/*.cpp" "${ROOT}/${dir}/*.hpp" "${ROOT}/${dir}/*.cu"
       "${ROOT}/${dir}/*.cuh" "${ROOT}/${dir}/*.h")
  list(SORT sources)
  foreach(f IN LISTS sources)
    math(EXPR nfiles "${nfiles} + 1")
    file(STRINGS "${ROOT}/${f}" reason REGEX "^[ \t]*//[ \t]*layering:[ \t]*[^ \t]")
    if(reason)
      math(EXPR nreasons "${nreasons} + 1")
      continue()
    endif()
    file(STRINGS "${ROOT}/${f}" internal REGEX "gflow::detail::")
    foreach(line IN LISTS internal)
      if(NOT line MATCHES "^[ \t]*//")
        string(STRIP "${line}" line)
        string(APPEND problems "  ${f} names gflow::detail (${line}): use the public names (<gflow/extension.hpp>, docs/GUIDE.md, 'What is public'), "
                               "or say why this file needs more in a line '// layering: <why>'\n")
        break()
      endif()
    endforeach()
    file(STRINGS "${ROOT}/${f}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*<gflow/")
    foreach(line IN LISTS lines)
      string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*<(gflow/[^>]+)>.*$" "\\1" h "${line}")
      set(ok FALSE)
      foreach(rx IN LISTS allowed)
        if(h MATCHES "${rx}")
          set(ok TRUE)
          break()
        endif()
      endforeach()
      if(NOT ok)
        string(APPEND problems "  ${f} includes ${h}, not a facade: include <gflow/exchanger.hpp> (or another "
                               "facade of tests/layering/layers.txt), or say why this file needs more in a line '// layering: <why>'\n")
      endif()
    endforeach()
  endforeach()
endforeach()

# ---- file length ------------------------------------------------------------------------------------
if(DEFINED MAX_LINES)
  foreach(dir IN LISTS MAX_LINES_DIRS)
    file(GLOB_RECURSE all RELATIVE "${ROOT}" "${ROOT}/${dir}/*")
    list(SORT all)
    foreach(f IN LISTS all)
      if(f MATCHES "/layouts/")
        continue()  # data: model layouts
      endif()
      file(READ "${ROOT}/${f}" text)
      string(REGEX MATCHALL "\n" newlines "${text}")
      list(LENGTH newlines nlines)
      if(nlines GREATER MAX_LINES)
        string(APPEND problems "  ${f}: ${nlines} lines, over ${MAX_LINES}: split it (one file per suite; shared code in bench/common.*)\n")
      endif()
    endforeach()
  endforeach()
endif()

if(NOT problems STREQUAL "")
  message(NOTICE "${problems}")
  message(FATAL_ERROR "layering: ${nfiles} files in ${DIRS}; the problems above break the client rules (tests/layering/check_clients.cmake)")
endif()
message(STATUS "layering: ${nfiles} files in ${DIRS} include only facades and public headers (${nreasons} say why they need more)")

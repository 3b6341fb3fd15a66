# Reading a text file as a CMake list of lines, for the cmake -P checkers (tests/package/readme_sync.cmake,
# tests/docs/check_user_docs.cmake). CMake lists split on ';' and treat brackets and backslashes
# specially, so those characters are encoded while a line is a list element and restored for display.
#   read_lines(<path> <out-list>)   \r stripped, one element per line, ; [ ] \ encoded
#   restore(<line> <out-var>)       the line as the file has it
function(read_lines path out)
  file(READ "${path}" text)
  string(REPLACE "\r" "" text "${text}")
  string(REPLACE ";" "<semicolon>" text "${text}")
  string(REPLACE "[" "<lbracket>" text "${text}")
  string(REPLACE "]" "<rbracket>" text "${text}")
  string(REPLACE "\\" "<backslash>" text "${text}")
  string(REPLACE "\n" ";" lines "${text}")
  set(${out} "${lines}" PARENT_SCOPE)
endfunction()
function(restore line out)
  string(REPLACE "<semicolon>" ";" line "${line}")
  string(REPLACE "<lbracket>" "[" line "${line}")
  string(REPLACE "<rbracket>" "]" line "${line}")
  string(REPLACE "<backslash>" "\\" line "${line}")
  set(${out} "${line}" PARENT_SCOPE)
endfunction()

# docs.no_journal: the user docs (README.md, docs/*.md) state what is, not how it got there. Each
# line is checked, case-insensitively, for
#   - the word "session" (or "sessions"; a file name such as examples/trainer/session.cpp is not
#     the word: an occurrence followed by ".<letter>" is skipped);
#   - "issue <digits>" or "issue #<digits>" (also "issues");
#   - "until 20" (a date by which something was otherwise);
#   - a path outside the repository: one starting with ../shared, /work/, /tmp/, /root/ or /home/.
# Every hit is reported as <file>:<line>: <what>: <the line>, and the script fails.
#   cmake -DROOT=<gflow checkout> -P check_user_docs.cmake
cmake_minimum_required(VERSION 3.24)
if(NOT ROOT)
  message(FATAL_ERROR "check_user_docs.cmake: pass -DROOT=<gflow checkout>")
endif()

file(GLOB docs RELATIVE "${ROOT}" "${ROOT}/docs/*.md")
list(SORT docs)
set(docs README.md ${docs})

# One rule per line of this list: <regex on the lower-cased line>|<what the report calls it>.
# A character that may not touch a word: [^a-z0-9_]; one that may not precede an absolute path:
# anything that would make it part of a longer, relative path.
set(word_before "(^|[^a-z0-9_])")
set(path_before "(^|[^a-z0-9_.~/-])")
set(rules
  "${word_before}sessions?([^a-z0-9_.]|[.]([^a-z]|$)|$)|the word 'session'"
  "${word_before}issues? #?[0-9]|an issue number"
  "${word_before}until 20|'until 20…'"
  "[.][.]/shared|a path outside the repository (../shared)"
  "${path_before}/(work|tmp|root|home)/|a path outside the repository")

include(${CMAKE_CURRENT_LIST_DIR}/../read_lines.cmake)  # read_lines(), restore()

set(failures "")
set(checked 0)
foreach(doc IN LISTS docs)
  if(NOT EXISTS "${ROOT}/${doc}")
    string(APPEND failures "${doc}: missing\n")
    continue()
  endif()
  read_lines("${ROOT}/${doc}" lines)
  set(n 0)
  foreach(line IN LISTS lines)
    math(EXPR n "${n} + 1")
    string(TOLOWER "${line}" low)
    foreach(rule IN LISTS rules)
      string(REGEX REPLACE "\\|[^|]*$" "" rx "${rule}")
      string(REGEX REPLACE "^.*\\|" "" what "${rule}")
      string(REGEX MATCH "${rx}" hit "${low}")
      if(NOT hit STREQUAL "")
        # Show the line around the hit (60 characters either side).
        string(FIND "${low}" "${hit}" at)
        math(EXPR from "${at} - 60")
        if(from LESS 0)
          set(from 0)
        endif()
        string(SUBSTRING "${line}" ${from} 140 shown)
        restore("${shown}" shown)
        string(APPEND failures "${doc}:${n}: ${what}: ...${shown}...\n")
      endif()
    endforeach()
  endforeach()
  math(EXPR checked "${checked} + 1")
endforeach()

if(failures)
  # Unwrapped, one hit a line (FATAL_ERROR's text is re-wrapped by CMake).
  message(NOTICE "${failures}")
  message(FATAL_ERROR "docs.no_journal: the lines above are journal, not documentation: the user docs "
                      "state what is (no session, issue number, 'until 20…' or path outside the repository).")
endif()
message("docs.no_journal: ${checked} user docs checked (README.md, docs/*.md): no session, issue number, "
        "'until 20…' or path outside the repository")

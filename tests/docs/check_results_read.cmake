# docs.results_are_read: every file under docs/results is read by a table or a plot, and there are
# at most MAX_FILES of them (default 150). A file counts as read when a reader names it:
#   readers: README.md, docs/*.md, and the plotting / table scripts bench/*.py and examples/**/*.py;
#   a name: docs/results/<path> or results/<path> (not preceded by another path component), where
#     <path> may hold the glob forms *, ? and [...] (within one path component) and {a,b,...};
#     a <path> that names a directory covers every file under it. "docs/results/" alone names
#     nothing, and neither do templates such as ex_<layout>_r<N>.jsonl: cite globs instead.
# A file no reader names is reported by name; a raw file that no table or plot reads belongs in
# git's history, not in the tree.
#   cmake -DROOT=<gflow checkout> [-DMAX_FILES=150] -P check_results_read.cmake
cmake_minimum_required(VERSION 3.24)
if(NOT ROOT)
  message(FATAL_ERROR "check_results_read.cmake: pass -DROOT=<gflow checkout>")
endif()
if(NOT DEFINED MAX_FILES)
  set(MAX_FILES 150)
endif()
set(results "${ROOT}/docs/results")

# ---- the readers and the names they cite -------------------------------------------------------
file(GLOB readers "${ROOT}/README.md" "${ROOT}/docs/*.md" "${ROOT}/bench/*.py")
file(GLOB_RECURSE example_scripts "${ROOT}/examples/*.py")
list(APPEND readers ${example_scripts})
set(patterns "")
foreach(reader IN LISTS readers)
  file(READ "${reader}" text)
  string(REPLACE ";" " " text "${text}")
  string(REGEX MATCHALL "(^|[^A-Za-z0-9_./-])(docs/)?results/([A-Za-z0-9_.*?+=/-]|\\[[^]]*\\]|{[^}]*})+" cited "${text}")
  foreach(c IN LISTS cited)
    string(REGEX REPLACE "^.*results/" "" c "${c}")
    string(REGEX REPLACE "[./]+$" "" c "${c}")  # a sentence's full stop, a directory's slash
    if(NOT c STREQUAL "")
      list(APPEND patterns "${c}")
    endif()
  endforeach()
endforeach()
list(REMOVE_DUPLICATES patterns)

# Glob to regex: . and + literal, * and ? within a path component, {a,b} alternatives; the result
# matches the path itself or anything under it (a directory).
set(regexes "")
foreach(p IN LISTS patterns)
  string(REPLACE "." "\\." rx "${p}")
  string(REPLACE "+" "\\+" rx "${rx}")
  string(REPLACE "*" "<star>" rx "${rx}")
  string(REPLACE "?" "[^/]" rx "${rx}")
  string(REPLACE "<star>" "[^/]*" rx "${rx}")
  string(REPLACE "{" "(" rx "${rx}")
  string(REPLACE "}" ")" rx "${rx}")
  string(REPLACE "," "|" rx "${rx}")
  list(APPEND regexes "^(${rx})(/.*)?$")
endforeach()

# ---- every file under docs/results -------------------------------------------------------------
file(GLOB_RECURSE files LIST_DIRECTORIES false RELATIVE "${results}" "${results}/*")
list(SORT files)
list(LENGTH files n_files)
set(unread "")
set(n_unread 0)
foreach(f IN LISTS files)
  set(read FALSE)
  foreach(rx IN LISTS regexes)
    if(f MATCHES "${rx}")
      set(read TRUE)
      break()
    endif()
  endforeach()
  if(NOT read)
    string(APPEND unread "  docs/results/${f}\n")
    math(EXPR n_unread "${n_unread} + 1")
  endif()
endforeach()

set(failures "")
if(n_unread GREATER 0)
  string(APPEND failures "${n_unread} file(s) under docs/results are read by no table or plot "
                         "(no README.md, docs/*.md, bench/*.py or examples/**/*.py names them): cite each "
                         "where its figure is, or git rm it:\n${unread}")
endif()
if(n_files GREATER MAX_FILES)
  string(APPEND failures "docs/results holds ${n_files} files, more than ${MAX_FILES}: keep the raw "
                         "files of the current figures only (superseded runs stay in git's history).\n")
endif()
if(failures)
  message(NOTICE "${failures}")
  message(FATAL_ERROR "docs.results_are_read: failed (see above).")
endif()
list(LENGTH patterns n_patterns)
message("docs.results_are_read: ${n_files} files under docs/results (at most ${MAX_FILES}), each named "
        "by one of ${n_patterns} citations in the docs and plotting scripts")

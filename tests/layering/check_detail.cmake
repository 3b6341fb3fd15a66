# layering.detail_is_internal: the path draws the public/internal line (docs/GUIDE.md, "What is
# public"). A header under gflow/detail/ opens namespaces only inside gflow::detail: every
# namespace it opens at file scope is gflow::detail or below it (`namespace gflow::detail {`,
# `namespace gflow::detail::plan {`), so nothing it declares is reachable as gflow::<name>; a
# public name it provides is an alias in a public header. A public header (outside detail/) may
# not open gflow::plan, gflow::kernels or gflow::cuda (those live in gflow::detail).
#   cmake -DINCLUDE_DIR=<repo>/include -P check_detail.cmake
cmake_minimum_required(VERSION 3.24)
if(NOT DEFINED INCLUDE_DIR)
  message(FATAL_ERROR "check_detail.cmake: pass -DINCLUDE_DIR=...")
endif()
get_filename_component(INCLUDE_DIR "${INCLUDE_DIR}" ABSOLUTE)
file(GLOB_RECURSE headers RELATIVE "${INCLUDE_DIR}" "${INCLUDE_DIR}/gflow/*.hpp" "${INCLUDE_DIR}/gflow/*.cuh")
list(SORT headers)
set(problems "")
set(ndetail 0)
foreach(h IN LISTS headers)
  file(STRINGS "${INCLUDE_DIR}/${h}" opens REGEX "^namespace[ \t]+[A-Za-z_:]*[ \t]*{")
  if(h MATCHES "^gflow/detail/")
    math(EXPR ndetail "${ndetail} + 1")
    # Track the file-scope namespace: the first `namespace gflow...` line opens it; the nested
    # `namespace x {` lines that follow sit inside it (their closing comments are not read).
    set(seen_gflow FALSE)
    foreach(line IN LISTS opens)
      if(line MATCHES "^namespace[ \t]+(gflow[A-Za-z_:]*)[ \t]*{")
        set(seen_gflow TRUE)
        set(ns "${CMAKE_MATCH_1}")
        if(NOT ns MATCHES "^gflow::detail(::|$)")
          string(APPEND problems "  ${h} opens namespace ${ns}: a header under gflow/detail/ declares only inside "
                                 "gflow::detail (give a public name an alias in a public header)\n")
        endif()
      elseif(NOT seen_gflow)
        string(APPEND problems "  ${h}: '${line}' opens a namespace outside gflow::detail\n")
      endif()
    endforeach()
  else()
    foreach(line IN LISTS opens)
      if(line MATCHES "^namespace[ \t]+gflow::(plan|kernels|cuda|sparse_message|oktopk_message)")
        string(APPEND problems "  ${h} (public) opens namespace gflow::${CMAKE_MATCH_1}: that namespace is internal (gflow::detail::${CMAKE_MATCH_1})\n")
      endif()
    endforeach()
  endif()
endforeach()
if(ndetail EQUAL 0)
  message(FATAL_ERROR "layering.detail_is_internal: no header under ${INCLUDE_DIR}/gflow/detail: nothing was checked")
endif()
if(problems)
  message(FATAL_ERROR "layering.detail_is_internal:\n${problems}")
endif()
message(STATUS "layering.detail_is_internal: ${ndetail} internal headers declare only inside gflow::detail")

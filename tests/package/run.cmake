# Package tests: builds tests/package/consumer against gflow the two ways a user can.
#   cmake -DMODE=install_find|add_subdirectory -DGFLOW_SOURCE_DIR=<src> -DWORK_DIR=<scratch>
#         -DGENERATOR=<gen> -DCXX=<compiler> [-DMAKE_PROGRAM=<prog>] [-DBUILD_TYPE=Release] -P run.cmake
#
# install_find:     configure a separate gflow build (tests/examples/bench/CUDA off), install
#                   it into WORK_DIR/prefix, then the consumer does find_package(gflow 0.1).
# add_subdirectory: the consumer does add_subdirectory(<gflow source> gflow-build) and checks
#                   that gflow's own tests/examples/bench are not defined.
# Then the consumer is built and run. WORK_DIR is wiped first, so every run starts clean.
cmake_minimum_required(VERSION 3.24)

foreach(var MODE GFLOW_SOURCE_DIR WORK_DIR GENERATOR CXX)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "run.cmake: pass -D${var}=...")
  endif()
endforeach()
if(NOT BUILD_TYPE)
  set(BUILD_TYPE Release)
endif()

set(common_args -G "${GENERATOR}" "-DCMAKE_CXX_COMPILER=${CXX}" "-DCMAKE_BUILD_TYPE=${BUILD_TYPE}")
if(GENERATOR_PLATFORM)
  list(APPEND common_args -A "${GENERATOR_PLATFORM}")
endif()
if(GENERATOR_TOOLSET)
  list(APPEND common_args -T "${GENERATOR_TOOLSET}")
endif()
if(MAKE_PROGRAM)
  list(APPEND common_args "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()

# Runs one step; on failure prints the step, the command and its output.
function(step name)
  string(TIMESTAMP t0 "%s")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  string(TIMESTAMP t1 "%s")
  math(EXPR dt "${t1} - ${t0}")
  list(JOIN ARGN " " cmd)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "package.${MODE}: step '${name}' failed (exit ${rc}).\ncommand: ${cmd}\n--- output ---\n${out}")
  endif()
  message(STATUS "package.${MODE}: ${name}: ok (${dt} s)")
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
set(consumer_src "${CMAKE_CURRENT_LIST_DIR}/consumer")
set(consumer_bin "${WORK_DIR}/consumer-build")

if(MODE STREQUAL "install_find")
  set(gflow_bin "${WORK_DIR}/gflow-build")
  set(prefix "${WORK_DIR}/prefix")
  step("configure gflow" "${CMAKE_COMMAND}" -S "${GFLOW_SOURCE_DIR}" -B "${gflow_bin}" ${common_args}
       -DGFLOW_INSTALL=ON -DGFLOW_BUILD_TESTS=OFF -DGFLOW_BUILD_EXAMPLES=OFF -DGFLOW_BUILD_BENCH=OFF
       -DGFLOW_ENABLE_CUDA=OFF -DGFLOW_PYTHON=OFF "-DCMAKE_INSTALL_PREFIX=${prefix}")
  step("build gflow" "${CMAKE_COMMAND}" --build "${gflow_bin}" --config "${BUILD_TYPE}")
  step("install gflow" "${CMAKE_COMMAND}" --install "${gflow_bin}" --config "${BUILD_TYPE}" --prefix "${prefix}")

  # The installed package must be relocatable: nothing in it may point back into the source
  # or build tree (a $<BUILD_INTERFACE> leaking into the export, for example).
  file(GLOB_RECURSE config_files "${prefix}/*/cmake/gflow/*.cmake")
  if(NOT config_files)
    message(FATAL_ERROR "package.install_find: no <prefix>/*/cmake/gflow/*.cmake was installed.")
  endif()
  foreach(f IN LISTS config_files)
    file(READ "${f}" text)
    foreach(tree "${GFLOW_SOURCE_DIR}" "${gflow_bin}")
      string(FIND "${text}" "${tree}" at)
      if(NOT at EQUAL -1)
        message(FATAL_ERROR "package.install_find: installed ${f} refers to ${tree}; the package is not relocatable.")
      endif()
    endforeach()
  endforeach()
  if(NOT EXISTS "${prefix}/include/gflow/exchanger.hpp")
    message(FATAL_ERROR "package.install_find: ${prefix}/include/gflow/exchanger.hpp was not installed.")
  endif()

  # Move the prefix before using it, to prove relocatability for real.
  set(moved "${WORK_DIR}/moved-prefix")
  file(RENAME "${prefix}" "${moved}")
  step("configure consumer (find_package)" "${CMAKE_COMMAND}" -S "${consumer_src}" -B "${consumer_bin}" ${common_args}
       -DGFLOW_CONSUMER_MODE=find_package "-DCMAKE_PREFIX_PATH=${moved}")
elseif(MODE STREQUAL "add_subdirectory")
  step("configure consumer (add_subdirectory)" "${CMAKE_COMMAND}" -S "${consumer_src}" -B "${consumer_bin}" ${common_args}
       -DGFLOW_CONSUMER_MODE=add_subdirectory "-DGFLOW_SOURCE_DIR=${GFLOW_SOURCE_DIR}" -DGFLOW_ENABLE_CUDA=OFF)
else()
  message(FATAL_ERROR "run.cmake: MODE must be install_find or add_subdirectory, not '${MODE}'")
endif()

step("build consumer" "${CMAKE_COMMAND}" --build "${consumer_bin}" --config "${BUILD_TYPE}")
step("run consumer" "${CMAKE_CTEST_COMMAND}" --test-dir "${consumer_bin}" -C "${BUILD_TYPE}" --output-on-failure)
message(STATUS "package.${MODE}: passed")

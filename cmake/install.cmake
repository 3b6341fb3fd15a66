# Installs the headers and exports gflow::gflow (+ gflow::mpi / gflow::cuda / gflow::nccl when
# built) with a package config, so a consumer can find_package(gflow).
include(CMakePackageConfigHelpers)
install(DIRECTORY include/gflow DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
set(_gflow_targets gflow)
if(TARGET gflow_mpi)
  list(APPEND _gflow_targets gflow_mpi)
endif()
if(TARGET gflow_cuda)
  list(APPEND _gflow_targets gflow_cuda)
endif()
if(TARGET gflow_nccl)
  list(APPEND _gflow_targets gflow_nccl)
endif()
install(TARGETS ${_gflow_targets} EXPORT gflowTargets)
install(EXPORT gflowTargets NAMESPACE gflow:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/gflow)
configure_package_config_file(cmake/gflowConfig.cmake.in ${PROJECT_BINARY_DIR}/gflowConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/gflow)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/gflowConfigVersion.cmake
  COMPATIBILITY SameMinorVersion ARCH_INDEPENDENT)
install(FILES ${PROJECT_BINARY_DIR}/gflowConfig.cmake ${PROJECT_BINARY_DIR}/gflowConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/gflow)

# Installs the headers and exports gflow::gflow with a package config. The optional parts
# (gflow::mpi, gflow::cuda, gflow::nccl) are not exported with this machine's paths: the package
# config finds MPI / the CUDA toolkit / NCCL again on the consumer's machine and creates them
# there, so `find_package(gflow)` works without MPI or CUDA, and
# `find_package(gflow REQUIRED COMPONENTS mpi)` insists on MPI.
include(CMakePackageConfigHelpers)
install(DIRECTORY include/gflow DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS gflow EXPORT gflowTargets)
install(EXPORT gflowTargets NAMESPACE gflow:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/gflow)
configure_package_config_file(cmake/gflowConfig.cmake.in ${PROJECT_BINARY_DIR}/gflowConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/gflow)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/gflowConfigVersion.cmake
  COMPATIBILITY SameMinorVersion ARCH_INDEPENDENT)
install(FILES ${PROJECT_BINARY_DIR}/gflowConfig.cmake ${PROJECT_BINARY_DIR}/gflowConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/gflow)

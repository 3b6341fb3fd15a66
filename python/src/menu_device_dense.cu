// The device-memory half of menu_dense.def, menu_overlap.def and menu_shard.def
// (device_port.cuh): each composition over gflow::mpi_device::transport and gflow::nccl::transport.
#include "device_port.cuh"

#define GFLOW_MENU(id, ...) GFLOW_PYTHON_DEVICE_COMPOSITION(id, __VA_ARGS__);
#include "menu_dense.def"
#include "menu_overlap.def"
#include "menu_shard.def"

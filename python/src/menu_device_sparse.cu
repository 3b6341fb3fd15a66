// The device-memory half of menu_topk.def and menu_csc.def (device_port.cuh): each composition
// over gflow::mpi_device::transport and gflow::nccl::transport.
#include "device_port.cuh"

#define GFLOW_MENU(id, ...) GFLOW_PYTHON_DEVICE_COMPOSITION(id, __VA_ARGS__);
#include "menu_topk.def"
#include "menu_csc.def"

#pragma once
// The Exchanger for CUDA trainers: include this one header from a .cu file.
//
//   #include <gflow/cuda/exchanger.cuh>
//   auto ranks = gflow::nccl::transport::init_all(ndev);       // or one rank per process
//   cudaSetDevice(ranks[r].device());
//   gflow::Exchanger<gflow::Precision<gflow::half>>::on<gflow::nccl::transport> ex(ranks[r], layout);
//
// It brings in the device backend (CUDA kernels on the transport's stream, see
// device_backend.cuh for what that asks of the trainer), the Exchanger facade, and the NCCL
// transport when <nccl.h> is on the include path (link gflow::nccl to use it).
#include "../detail/cuda/device_backend.cuh"
// The backend specialisation above must be visible before the Exchanger is instantiated.
#include "../exchanger.hpp"
// verify_replicas on device memory (a copy to the host, then the host fingerprint).
#include "replicas.cuh"

#if __has_include(<nccl.h>)
#include "../transport/nccl.hpp"
#endif

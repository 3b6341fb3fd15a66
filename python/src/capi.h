/* gflow's C ABI for the Python front end: libgflow_capi.so, loaded by gflow/_capi.py through ctypes.
 *
 * A C ABI rather than a CPython extension: the library depends on no Python version (one build
 * loads in any Python 3 with ctypes, NumPy and torch, e.g. a GPU machine's PyPI Python where
 * nothing can be built), and ctypes drops the GIL around every call.
 *
 * Conventions:
 *   - Every function that can fail returns 0, or -1 after a failure: gflow_last_error() then
 *     tells what (the gflow::error's class, kind, subject, message and fix; class "RuntimeError"
 *     for any other C++ exception, "StepFailed" when a join step callback returned non-zero).
 *   - Strings and arrays handed out through out-parameters live in this thread's scratch space (or,
 *     for the menu, in the registry) and stay valid until the next call on the same thread.
 *   - Sizes and counts are uint64_t; pool offsets and ranges are in float elements.
 *   - Device memory (libgflow_capi_cuda.so: the same functions, and a device menu): after
 *     gflow_device_init, gflow_exchanger_new(..., on_device = 1, ...) makes an exchanger whose pool
 *     is CUDA memory of the device gflow_device_init chose. `stream` arguments are the caller's
 *     cudaStream_t (torch's current stream): ready orders the exchange after the work enqueued on
 *     it; finish, gather_shards and join's step make it wait for the exchange. Host-memory
 *     exchangers take stream = NULL. libgflow_capi.so refuses on_device and gflow_device_init
 *     with a UsageError naming the library to build.
 */
#ifndef GFLOW_PYTHON_CAPI_H
#define GFLOW_PYTHON_CAPI_H
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GFLOW_CAPI_VERSION 2
#define GFLOW_CAPI __attribute__((visibility("default")))

typedef struct gflow_exchanger gflow_exchanger;
typedef struct gflow_timeline gflow_timeline;

typedef struct {
  uint64_t iteration;
  uint64_t nonfinite;
  uint64_t collectives;
  uint64_t wire_bytes;
  int32_t contributors;
  const uint64_t* unused; /* find_unused: tensors no rank marked ready (layout indices) */
  uint64_t unused_count;
} gflow_exchange_status;

typedef struct {
  uint64_t shadowed;
  int32_t last_rank;
} gflow_join_status;

/* join's step: run after each shadowed iteration; non-zero stops join (the caller's error). */
typedef int (*gflow_step_fn)(const gflow_exchange_status* status, void* user);

GFLOW_CAPI int gflow_capi_version(void);
GFLOW_CAPI void gflow_last_error(const char** cls, const char** kind, const char** subject, const char** message, const char** fix);

/* MPI and the world transport. */
GFLOW_CAPI int gflow_init(void);
GFLOW_CAPI int gflow_initialized(void);
GFLOW_CAPI int gflow_finalize(void);
GFLOW_CAPI void gflow_abort(int code);
GFLOW_CAPI int gflow_rank(int32_t* out);
GFLOW_CAPI int gflow_size(int32_t* out);
/* This rank among the ranks on its node (MPI_COMM_TYPE_SHARED), and how many there are. */
GFLOW_CAPI int gflow_local_rank(int32_t* local, int32_t* local_size);

/* CUDA: built = 1 in libgflow_capi_cuda.so; devices = the CUDA devices this process sees (0 without
 * a driver or a GPU). */
GFLOW_CAPI int gflow_cuda_support(int32_t* built, int32_t* devices);
/* The device transport, collective: transport "auto" (NCCL where every rank has a GPU of its own,
 * else MPI), "nccl" or "mpi"; device < 0: the node-local rank modulo the visible devices. Hands back
 * the transport chosen ("nccl" or "mpi") and the device. */
GFLOW_CAPI int gflow_device_init(const char* transport, int32_t device, const char** chosen, int32_t* device_out);

/* The compositions compiled into the library. */
GFLOW_CAPI uint64_t gflow_menu_size(void);
/* spaces: bit 0 host memory, bit 1 CUDA over MPI, bit 2 CUDA over NCCL (the spaces it was compiled for). */
GFLOW_CAPI int gflow_menu_entry(uint64_t i, const char** name, const char** policies, uint32_t* spaces);
GFLOW_CAPI int gflow_canonical_name(const char* name, const char** out);

/* Collectives on host buffers, in place. */
GFLOW_CAPI int gflow_broadcast(void* data, uint64_t bytes, int32_t root);
GFLOW_CAPI int gflow_broadcast_bytes(const void* data, uint64_t size, int32_t root, const void** out, uint64_t* out_size);
GFLOW_CAPI int gflow_allreduce_average(float* data, uint64_t n);
GFLOW_CAPI int gflow_verify_replicas(const float* values, uint64_t n, const char* const* names, const uint64_t* sizes, uint64_t count);

/* gflow::timeline. */
GFLOW_CAPI int gflow_timeline_new(uint64_t capacity, gflow_timeline** out);
GFLOW_CAPI void gflow_timeline_free(gflow_timeline* tl);
GFLOW_CAPI int gflow_timeline_start(gflow_timeline* tl);
GFLOW_CAPI int gflow_timeline_write(const gflow_timeline* tl, const char* path);
GFLOW_CAPI uint64_t gflow_timeline_size(const gflow_timeline* tl);

/* An exchanger over the world transport (on_device = 0) or the device transport (on_device = 1).
 * shapes: every tensor's dimensions one after another, ndims[i] of them for tensor i.
 * threshold_bytes < 0: the composition's own fusion plan. */
GFLOW_CAPI int gflow_exchanger_new(const char* composition, int32_t on_device, uint64_t count, const char* const* names, const uint64_t* ndims,
                                   const uint64_t* shapes, int32_t find_unused, int32_t learn_order, int32_t uneven_inputs,
                                   int32_t average, int64_t threshold_bytes, gflow_exchanger** out);
GFLOW_CAPI void gflow_exchanger_free(gflow_exchanger* ex);
GFLOW_CAPI int gflow_pool(gflow_exchanger* ex, float** data, uint64_t* size);
GFLOW_CAPI int gflow_offsets(const gflow_exchanger* ex, const uint64_t** data, uint64_t* n);
GFLOW_CAPI int gflow_ready(gflow_exchanger* ex, uint64_t i, void* stream);
GFLOW_CAPI int gflow_finish(gflow_exchanger* ex, void* stream, gflow_exchange_status* out);
GFLOW_CAPI int gflow_begin_no_sync(gflow_exchanger* ex);
GFLOW_CAPI int gflow_end_no_sync(gflow_exchanger* ex);
GFLOW_CAPI int gflow_join(gflow_exchanger* ex, void* stream, gflow_step_fn step, void* user, gflow_join_status* out);
GFLOW_CAPI int gflow_counters(const gflow_exchanger* ex, uint64_t* generation, uint64_t* iteration);
/* device: the CUDA device of the pool; -1: host memory. */
GFLOW_CAPI int gflow_describe(const gflow_exchanger* ex, const char** name, int32_t* dense, int32_t* sharded, int32_t* device);
/* (first, end) pairs: 2 * n values. */
GFLOW_CAPI int gflow_shard(const gflow_exchanger* ex, const uint64_t** pairs, uint64_t* n);
GFLOW_CAPI int gflow_buckets(const gflow_exchanger* ex, const uint64_t** pairs, uint64_t* n);
/* values: laid out like the pool, in the pool's memory (a device pointer for a device exchanger). */
GFLOW_CAPI int gflow_gather_shards(gflow_exchanger* ex, float* values, uint64_t n, void* stream);
GFLOW_CAPI int gflow_save_state(const gflow_exchanger* ex, const void** data, uint64_t* size);
GFLOW_CAPI int gflow_load_state(gflow_exchanger* ex, const void* data, uint64_t size);
GFLOW_CAPI int gflow_save_checkpoint(const gflow_exchanger* ex, const char* root, uint64_t count, const float* const* arrays,
                                     const uint64_t* sizes, const char** path);
/* The arrays read with the set (with_state) are then fetched with gflow_loaded_array. */
GFLOW_CAPI int gflow_load_checkpoint(gflow_exchanger* ex, const char* root, int32_t with_state, uint64_t* iteration, uint64_t* count);
GFLOW_CAPI int gflow_loaded_array(uint64_t i, const float** data, uint64_t* n);
GFLOW_CAPI int gflow_selected_chunks(const gflow_exchanger* ex, const uint32_t** data, uint64_t* n, uint64_t* chunk_elems);
GFLOW_CAPI int gflow_configure(gflow_exchanger* ex, double momentum, uint64_t warmup);
/* tl == NULL detaches; an attached timeline is kept alive by the exchanger. */
GFLOW_CAPI int gflow_set_timeline(gflow_exchanger* ex, gflow_timeline* tl);
/* The binding's yardstick (bench/ddp_gloo.py): `iterations` iterations of ready(count - 1) ...
 * ready(0) and finish() in a C++ loop, timed from the first ready to finish's return. */
GFLOW_CAPI int gflow_run_iterations(gflow_exchanger* ex, uint64_t iterations, void* stream, double* seconds);

#ifdef __cplusplus
}
#endif
#endif

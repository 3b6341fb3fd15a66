// libgflow_capi.so: the C ABI of capi.h over the registry's ports (port.hpp). It includes neither
// Python, torch nor CUDA: gflow/_capi.py loads it with ctypes and wraps its buffers as NumPy arrays
// and tensors without a copy. libgflow_capi_cuda.so is this file and the same host menu, plus the
// device menu and the device world (capi_cuda.cu, registered through python::set_device_support).
#include "capi.h"

#include <chrono>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gflow/replicas.hpp>

#include "port.hpp"

using namespace gflow;

struct gflow_exchanger {
  std::unique_ptr<python::port> port;
  std::shared_ptr<timeline> trace;  // set_timeline(): kept alive while attached
};
struct gflow_timeline {
  std::shared_ptr<timeline> tl;
};

namespace {

// MPI and the world transport, created by gflow_init() and kept until gflow_finalize() (or exit).
struct world {
  mpi::environment env;
  mpi::transport comm;
};
std::unique_ptr<world>& the_world() {
  static std::unique_ptr<world> w;
  return w;
}
python::device_support& device_support() {
  python::device_support* d = python::get_device_support();
  if (!d)
    throw usage_error("device", "this gflow.torch library (libgflow_capi.so) was built without CUDA, so it has no device menu.",
                      "build gflow where nvcc and NCCL are found (cmake reports 'CUDA ON'), which makes libgflow_capi_cuda.so, and load that one "
                      "(gflow.torch prefers it when it sits next to libgflow_capi.so; GFLOW_CAPI_LIBRARY names it explicitly).");
  return *d;
}

mpi::transport& comm() {
  if (!the_world())
    throw usage_error("init", "gflow.torch.init() has not been called in this process.",
                      "call gflow.torch.init() once, before rank(), size(), broadcasts or DistributedOptimizer.");
  return the_world()->comm;
}

// What a call hands back through its out-parameters, and the last error: per thread.
struct scratch_space {
  std::string cls, kind, subject, message, fix;
  std::string text, bytes;
  std::vector<std::uint64_t> u64, unused;
  std::vector<std::uint32_t> u32;
  std::vector<std::vector<float>> loaded;
};
scratch_space& scratch() {
  thread_local scratch_space s;
  return s;
}

// A join step that returned non-zero: unwinds join(), reported as class "StepFailed".
struct step_failed {};

const char* class_name(errc c) {
  switch (c) {
    case errc::invalid_argument: return "InvalidArgument";
    case errc::usage: return "UsageError";
    case errc::mismatch: return "MismatchError";
    case errc::transport: return "TransportError";
    case errc::timeout: return "TimeoutError";
    case errc::parse: return "ParseError";
  }
  return "Error";
}

// Runs f; any exception becomes the thread's last error and -1.
template <class F>
int guarded(F&& f) noexcept {
  scratch_space& s = scratch();
  try {
    f();
    return 0;
  } catch (const gflow::error& e) {
    s.message = e.what();
    const auto at = s.message.find(" Fix: ");
    s.fix = at == std::string::npos ? "" : s.message.substr(at + 6);
    s.cls = class_name(e.code());
    s.kind = std::string(to_string(e.code()));
    s.subject = e.subject();
  } catch (const step_failed&) {
    s.cls = "StepFailed";
    s.kind = s.subject = s.fix = "";
    s.message = "the join step raised";
  } catch (const std::exception& e) {
    s.cls = "RuntimeError";
    s.kind = s.subject = s.fix = "";
    s.message = e.what();
  } catch (...) {
    s.cls = "RuntimeError";
    s.kind = s.subject = s.fix = "";
    s.message = "unknown C++ exception";
  }
  return -1;
}

gflow_exchange_status to_c(const exchange_status& st, std::vector<std::uint64_t>& unused) {
  unused.assign(st.unused.begin(), st.unused.end());
  return {st.iteration, st.nonfinite, st.collectives, st.wire_bytes, st.contributors, unused.data(), unused.size()};
}

void hand_out_pairs(const std::vector<std::pair<std::size_t, std::size_t>>& v, const std::uint64_t** pairs, std::uint64_t* n) {
  std::vector<std::uint64_t>& out = scratch().u64;
  out.clear();
  for (const auto& [a, b] : v) {
    out.push_back(a);
    out.push_back(b);
  }
  *pairs = out.data();
  *n = v.size();
}

}  // namespace

extern "C" {

int gflow_capi_version(void) { return GFLOW_CAPI_VERSION; }

void gflow_last_error(const char** cls, const char** kind, const char** subject, const char** message, const char** fix) {
  const scratch_space& s = scratch();
  *cls = s.cls.c_str();
  *kind = s.kind.c_str();
  *subject = s.subject.c_str();
  *message = s.message.c_str();
  *fix = s.fix.c_str();
}

int gflow_init(void) {
  return guarded([] {
    if (!the_world()) the_world() = std::unique_ptr<world>(new world{mpi::environment(), mpi::transport()});
  });
}
int gflow_initialized(void) { return the_world() ? 1 : 0; }
int gflow_finalize(void) {
  return guarded([] {
    if (python::device_support* d = python::get_device_support()) d->finalize();  // its communicators before MPI
    the_world().reset();
  });
}
void gflow_abort(int code) { MPI_Abort(MPI_COMM_WORLD, code); }
int gflow_rank(int32_t* out) {
  return guarded([&] { *out = comm().rank(); });
}
int gflow_size(int32_t* out) {
  return guarded([&] { *out = comm().size(); });
}
int gflow_local_rank(int32_t* local, int32_t* local_size) {
  return guarded([&] {
    const mpi::node_place p = mpi::node_rank(comm().comm());
    *local = p.rank;
    *local_size = p.size;
  });
}

int gflow_cuda_support(int32_t* built, int32_t* devices) {
  return guarded([&] {
    python::device_support* d = python::get_device_support();
    *built = d ? 1 : 0;
    *devices = d ? d->device_count() : 0;
  });
}
int gflow_device_init(const char* transport, int32_t device, const char** chosen, int32_t* device_out) {
  return guarded([&] {
    python::device_support& d = device_support();
    d.init(comm(), transport ? transport : "auto", device);
    *chosen = d.transport_space() == python::space::device_nccl ? "nccl" : "mpi";
    *device_out = d.device();
  });
}

uint64_t gflow_menu_size(void) { return python::menu().size(); }
int gflow_menu_entry(uint64_t i, const char** name, const char** policies, uint32_t* spaces) {
  return guarded([&] {
    const auto& m = python::menu();
    if (i >= m.size()) throw invalid_argument("i", fmt::format("menu entry {} of {}.", i, m.size()), "pass i < gflow_menu_size().");
    *name = m[i].name.c_str();
    *policies = m[i].policies.c_str();
    *spaces = m[i].spaces_mask();
  });
}
int gflow_canonical_name(const char* name, const char** out) {
  return guarded([&] {
    scratch().text = python::canonical_name(name);
    *out = scratch().text.c_str();
  });
}

int gflow_broadcast(void* data, uint64_t bytes, int32_t root) {
  return guarded([&] {
    mpi::transport& t = comm();
    if (bytes % sizeof(float) == 0) {
      // gflow::broadcast_parameters checks count and root across ranks first (an error on every
      // rank, no hang); it moves bits, so any 4-byte-multiple dtype travels exactly.
      broadcast_parameters(t, std::span<float>(static_cast<float*>(data), bytes / sizeof(float)), root);
    } else {
      std::vector<float> padded((bytes + sizeof(float) - 1) / sizeof(float));
      std::memcpy(padded.data(), data, bytes);
      broadcast_parameters(t, std::span<float>(padded), root);
      std::memcpy(data, padded.data(), bytes);
    }
  });
}
int gflow_broadcast_bytes(const void* data, uint64_t size, int32_t root, const void** out, uint64_t* out_size) {
  return guarded([&] {
    mpi::transport& t = comm();
    std::vector<float> hdr(2);
    std::memcpy(hdr.data(), &size, sizeof size);
    broadcast_parameters(t, std::span<float>(hdr), root);
    std::uint64_t n = 0;
    std::memcpy(&n, hdr.data(), sizeof n);
    std::vector<float> buf((n + sizeof(float) - 1) / sizeof(float) + 1);
    if (t.rank() == root) std::memcpy(buf.data(), data, size);
    broadcast_parameters(t, std::span<float>(buf), root);
    std::string& s = scratch().bytes;
    s.assign(reinterpret_cast<const char*>(buf.data()), n);
    *out = s.data();
    *out_size = s.size();
  });
}
int gflow_allreduce_average(float* data, uint64_t n) {
  return guarded([&] {
    mpi::transport& t = comm();
    t.all_reduce(data, n, reduce_op::sum);
    const float inv = 1.0f / static_cast<float>(t.size());
    for (std::uint64_t i = 0; i < n; ++i) data[i] *= inv;
  });
}
int gflow_verify_replicas(const float* values, uint64_t n, const char* const* names, const uint64_t* sizes, uint64_t count) {
  return guarded([&] {
    std::vector<tensor_desc> tensors;
    for (std::uint64_t i = 0; i < count; ++i) tensors.push_back({names[i], {sizes[i]}, sizes[i]});
    verify_replicas(comm(), std::span<const float>(values, n), Layout(tensors));
  });
}

int gflow_timeline_new(uint64_t capacity, gflow_timeline** out) {
  return guarded([&] { *out = new gflow_timeline{std::make_shared<timeline>(capacity)}; });
}
void gflow_timeline_free(gflow_timeline* tl) { delete tl; }
int gflow_timeline_start(gflow_timeline* tl) {
  return guarded([&] { tl->tl->start(comm()); });
}
int gflow_timeline_write(const gflow_timeline* tl, const char* path) {
  return guarded([&] { tl->tl->write_chrome_trace(comm(), path); });
}
uint64_t gflow_timeline_size(const gflow_timeline* tl) { return tl->tl->size(); }

int gflow_exchanger_new(const char* composition, int32_t on_device, uint64_t count, const char* const* names, const uint64_t* ndims,
                        const uint64_t* shapes, int32_t find_unused, int32_t learn_order, int32_t uneven_inputs, int32_t average,
                        int64_t threshold_bytes, gflow_exchanger** out) {
  return guarded([&] {
    python::space where = python::space::host;
    void* transport = &comm();
    if (on_device != 0) {
      python::device_support& d = device_support();
      if (!d.initialized())
        throw usage_error("device", "a device exchanger was asked for before the device transport exists.",
                          "call gflow_device_init first (gflow.torch does when the first CUDA DistributedOptimizer is built).");
      where = d.transport_space();
      transport = d.transport();
    }
    const python::menu_entry& e = python::find_composition(composition, where);
    std::vector<tensor_desc> tensors;
    const uint64_t* dim = shapes;
    for (std::uint64_t i = 0; i < count; ++i) {
      std::vector<std::size_t> shape(dim, dim + ndims[i]);
      dim += ndims[i];
      std::size_t n = 1;
      for (std::size_t d : shape) n *= d;
      tensors.push_back({names[i], std::move(shape), n});
    }
    exchange_options o;
    o.find_unused = find_unused != 0;
    o.learn_order = learn_order != 0;
    o.uneven_inputs = uneven_inputs != 0;
    o.average = average != 0;
    auto ex = std::make_unique<gflow_exchanger>(gflow_exchanger{e.make[static_cast<std::size_t>(where)](transport, Layout(tensors), o), nullptr});  // collective
    if (threshold_bytes >= 0) ex->port->set_fusion(static_cast<std::size_t>(threshold_bytes));
    *out = ex.release();
  });
}
void gflow_exchanger_free(gflow_exchanger* ex) { delete ex; }
int gflow_pool(gflow_exchanger* ex, float** data, uint64_t* size) {
  return guarded([&] {
    *data = ex->port->pool_data();
    *size = ex->port->pool_size();
  });
}
int gflow_offsets(const gflow_exchanger* ex, const uint64_t** data, uint64_t* n) {
  return guarded([&] {
    const std::vector<std::size_t> o = ex->port->offsets();
    scratch().u64.assign(o.begin(), o.end());
    *data = scratch().u64.data();
    *n = o.size();
  });
}
int gflow_ready(gflow_exchanger* ex, uint64_t i, void* stream) {
  return guarded([&] {
    ex->port->use_stream(stream);
    ex->port->ready(i);
  });
}
int gflow_finish(gflow_exchanger* ex, void* stream, gflow_exchange_status* out) {
  return guarded([&] {
    ex->port->use_stream(stream);
    *out = to_c(ex->port->finish(), scratch().unused);
  });
}
int gflow_begin_no_sync(gflow_exchanger* ex) {
  return guarded([&] { ex->port->begin_no_sync(); });
}
int gflow_end_no_sync(gflow_exchanger* ex) {
  return guarded([&] { ex->port->end_no_sync(); });
}
int gflow_join(gflow_exchanger* ex, void* stream, gflow_step_fn step, void* user, gflow_join_status* out) {
  return guarded([&] {
    ex->port->use_stream(stream);
    std::function<void(const exchange_status&)> f;
    if (step) f = [step, user](const exchange_status& st) {
      std::vector<std::uint64_t> unused;
      const gflow_exchange_status c = to_c(st, unused);
      if (step(&c, user) != 0) throw step_failed{};
    };
    const join_status st = ex->port->join(f);
    *out = {st.shadowed, st.last_rank};
  });
}
int gflow_counters(const gflow_exchanger* ex, uint64_t* generation, uint64_t* iteration) {
  return guarded([&] {
    *generation = ex->port->generation();
    *iteration = ex->port->iteration();
  });
}
int gflow_describe(const gflow_exchanger* ex, const char** name, int32_t* dense, int32_t* sharded, int32_t* device) {
  return guarded([&] {
    scratch().text = ex->port->name();
    *name = scratch().text.c_str();
    *dense = ex->port->dense() ? 1 : 0;
    *sharded = ex->port->sharded() ? 1 : 0;
    *device = ex->port->device();
  });
}
int gflow_shard(const gflow_exchanger* ex, const uint64_t** pairs, uint64_t* n) {
  return guarded([&] { hand_out_pairs(ex->port->shard(), pairs, n); });
}
int gflow_buckets(const gflow_exchanger* ex, const uint64_t** pairs, uint64_t* n) {
  return guarded([&] { hand_out_pairs(ex->port->buckets(), pairs, n); });
}
int gflow_gather_shards(gflow_exchanger* ex, float* values, uint64_t n, void* stream) {
  return guarded([&] {
    ex->port->use_stream(stream);
    ex->port->gather_shards(values, n);
  });
}
int gflow_save_state(const gflow_exchanger* ex, const void** data, uint64_t* size) {
  return guarded([&] {
    scratch().bytes = ex->port->save_state();
    *data = scratch().bytes.data();
    *size = scratch().bytes.size();
  });
}
int gflow_load_state(gflow_exchanger* ex, const void* data, uint64_t size) {
  return guarded([&] { ex->port->load_state(std::string(static_cast<const char*>(data), size)); });
}
int gflow_save_checkpoint(const gflow_exchanger* ex, const char* root, uint64_t count, const float* const* arrays, const uint64_t* sizes,
                          const char** path) {
  return guarded([&] {
    std::vector<std::span<const float>> state;
    for (std::uint64_t i = 0; i < count; ++i) state.emplace_back(arrays[i], sizes[i]);
    scratch().text = ex->port->save_checkpoint(root, state);
    *path = scratch().text.c_str();
  });
}
int gflow_load_checkpoint(gflow_exchanger* ex, const char* root, int32_t with_state, uint64_t* iteration, uint64_t* count) {
  return guarded([&] {
    auto [it, state] = ex->port->load_checkpoint(root, with_state != 0);
    scratch().loaded = std::move(state);
    *iteration = it;
    *count = scratch().loaded.size();
  });
}
int gflow_loaded_array(uint64_t i, const float** data, uint64_t* n) {
  return guarded([&] {
    const auto& loaded = scratch().loaded;
    if (i >= loaded.size())
      throw invalid_argument("i", fmt::format("array {} of the {} the last load_checkpoint read.", i, loaded.size()), "pass i < its count.");
    *data = loaded[i].data();
    *n = loaded[i].size();
  });
}
int gflow_selected_chunks(const gflow_exchanger* ex, const uint32_t** data, uint64_t* n, uint64_t* chunk_elems) {
  return guarded([&] {
    scratch().u32 = ex->port->selected_chunks();
    *data = scratch().u32.data();
    *n = scratch().u32.size();
    *chunk_elems = ex->port->chunk_elems();
  });
}
int gflow_configure(gflow_exchanger* ex, double momentum, uint64_t warmup) {
  return guarded([&] { ex->port->configure(momentum, warmup); });
}
int gflow_run_iterations(gflow_exchanger* ex, uint64_t iterations, void* stream, double* seconds) {
  return guarded([&] {
    ex->port->use_stream(stream);
    const std::size_t count = ex->port->offsets().size();
    const auto t0 = std::chrono::steady_clock::now();
    for (std::uint64_t it = 0; it < iterations; ++it) {
      for (std::size_t i = count; i-- > 0;) ex->port->ready(i);
      (void)ex->port->finish();
    }
    *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  });
}
int gflow_set_timeline(gflow_exchanger* ex, gflow_timeline* tl) {
  return guarded([&] {
    std::shared_ptr<timeline> keep = tl ? tl->tl : nullptr;
    ex->port->set_timeline(keep.get());
    ex->trace = std::move(keep);
  });
}

}  // extern "C"

#pragma once
// The Python module's view of one exchanger: a small virtual interface over
// gflow::Exchanger<...>::on<Transport>, one implementation per composition and memory space
// compiled into the library (menu_*.cpp on gflow::mpi::transport; in libgflow_capi_cuda.so also
// menu_device_*.cu on gflow::mpi_device::transport and gflow::nccl::transport, device_port.cuh;
// gflow_add_python_composition). Free of Python, torch and CUDA, so the host translation units
// compile against gflow and MPI only.
//
// A composition is found by name. Its name is derived from its policy types (composition_name<Set>):
//   precision + fusion + sparsifier + topology + overlap, defaults left out, e.g.
//   "fp16+fusion=4MiB+topk=0.01+funneled"; Exchanger<> is "dense".
// canonical_name() puts a name a user typed into that form (order, case, 4194304 = 4MiB, 0.010 = 0.01).
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <array>
#include <functional>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include <gflow/error.hpp>
#include <gflow/exchanger.hpp>
#include <gflow/policies/csc.hpp>
#include <gflow/policies/topk.hpp>
#include <gflow/reshard.hpp>
#include <gflow/timeline.hpp>
#include <gflow/transport/mpi.hpp>

namespace gflow::python {

/// One exchanger, type-erased: what the Python side needs of it.
class port {
 public:
  virtual ~port() = default;
  [[nodiscard]] virtual float* pool_data() = 0;
  [[nodiscard]] virtual std::size_t pool_size() const = 0;
  [[nodiscard]] virtual std::vector<std::size_t> offsets() const = 0;  // pool offset per tensor (layout index)
  virtual void ready(std::size_t i) = 0;
  virtual exchange_status finish() = 0;
  virtual void begin_no_sync() = 0;
  virtual void end_no_sync() = 0;
  /// after_each (may be empty): run after each shadowed iteration (a sharded rank steps its shard there).
  virtual join_status join(const std::function<void(const exchange_status&)>& after_each) = 0;
  [[nodiscard]] virtual std::uint64_t generation() const = 0;
  [[nodiscard]] virtual std::uint64_t iteration() const = 0;
  [[nodiscard]] virtual std::string save_state() const = 0;
  virtual void load_state(const std::string& bytes) = 0;
  virtual void set_timeline(timeline* tl) = 0;
  /// Exchanger::set_fusion (refused with usage_error by a "fusion=auto" composition).
  virtual void set_fusion(std::size_t threshold_bytes) = 0;
  /// Bucket b: [first, first + count) elements of the pool.
  [[nodiscard]] virtual std::vector<std::pair<std::size_t, std::size_t>> buckets() const = 0;
  /// CSC: the chunks exchanged in the last iteration and the chunk size (empty / 0 otherwise).
  [[nodiscard]] virtual std::vector<std::uint32_t> selected_chunks() const { return {}; }
  [[nodiscard]] virtual std::size_t chunk_elems() const { return 0; }
  /// Sparsifier settings a trainer makes before its first iteration (the libtorch trainer's
  /// configure_sparsifier): CSC momentum correction and warm-up; TopK/GTopK warm-up densities.
  virtual void configure(double momentum, std::uint64_t warmup) = 0;
  [[nodiscard]] virtual bool dense() const = 0;
  [[nodiscard]] virtual std::string name() const = 0;
  /// The CUDA device the pool lives on; -1: host memory.
  [[nodiscard]] virtual int device() const { return -1; }
  /// The caller's CUDA stream (a cudaStream_t; null: none) for the calls that follow: ready(i)
  /// orders the exchange after the work enqueued on it, and finish(), gather_shards and join's
  /// step make it wait for the exchange (device_port.cuh). A host-memory exchanger takes none.
  virtual void use_stream(void* stream) {
    if (stream != nullptr)
      throw invalid_argument("stream", "composition '" + name() + "' exchanges host memory; a CUDA stream was passed with it.",
                             "pass no stream with CPU tensors (gflow.torch does this itself).");
  }
  /// Sharding<ReduceScatter> ("shard" in the name): this rank's shard as (first pool element, end),
  /// one range per bucket, and the in-place all-gather of a pool-sized buffer. Not sharded: false,
  /// empty, and gather_shards raises usage_error.
  [[nodiscard]] virtual bool sharded() const { return false; }
  [[nodiscard]] virtual std::vector<std::pair<std::size_t, std::size_t>> shard() const { return {}; }
  virtual void gather_shards(float*, std::size_t) {
    throw usage_error("gather_shards", "this composition does not shard (its name has no 'shard').",
                      "use a composition with Sharding<ReduceScatter>, e.g. 'fusion=4MiB+shard' (gflow.torch.compositions()).");
  }
  /// gflow::save_checkpoint(ex, root[, state]) (reshard.hpp): the file written. `state` (arrays
  /// packed over shard()) only with a sharded composition.
  virtual std::string save_checkpoint(const std::string& root, const std::vector<std::span<const float>>& state) const = 0;
  /// gflow::load_checkpoint(ex, root[, state]): the iteration resumed at and, with_state (sharded
  /// compositions), the arrays saved with the set, packed over shard() as it is after the load.
  virtual std::pair<std::uint64_t, std::vector<std::vector<float>>> load_checkpoint(const std::string& root, bool with_state) = 0;
};

/// Where an exchanger keeps its pool and what carries its collectives: host memory over
/// gflow::mpi::transport, or device memory over gflow::mpi_device::transport or
/// gflow::nccl::transport (libgflow_capi_cuda.so only).
enum class space : int { host = 0, device_mpi = 1, device_nccl = 2 };
inline constexpr std::size_t spaces = 3;
[[nodiscard]] const char* space_name(space s);  // "host memory", "CUDA over MPI", "CUDA over NCCL"

/// Makes an exchanger over `transport`, a pointer to the space's transport type.
using factory = std::unique_ptr<port> (*)(void* transport, Layout, exchange_options);

/// The compositions compiled into the library, by canonical name (registry.cpp), each with a
/// factory per memory space it was compiled for.
void register_composition(const std::string& name, const std::string& policies, space s, factory f);
struct menu_entry {
  std::string name;
  std::string policies;  // the C++ spelling
  std::array<factory, spaces> make{};
  [[nodiscard]] unsigned spaces_mask() const;  // bit s: compiled for space s
};
[[nodiscard]] const std::vector<menu_entry>& menu();
/// The entry named `name` (any order, case, size or density spelling of the canonical name),
/// compiled for space `s`; invalid_argument('composition') listing the menu when there is none.
[[nodiscard]] const menu_entry& find_composition(const std::string& name, space s = space::host);

/// What libgflow_capi_cuda.so adds to the C ABI: the device world (a device transport over the
/// MPI world), registered at load time (capi_cuda.cu). Absent from libgflow_capi.so.
class device_support {
 public:
  virtual ~device_support() = default;
  /// Creates this rank's device transport, collective over `world`: transport "auto" (NCCL where
  /// every rank has a GPU of its own, else MPI), "nccl" or "mpi"; device < 0: the node-local
  /// rank modulo the visible devices. Again with the same arguments: nothing; with others: usage_error.
  virtual void init(mpi::transport& world, const std::string& transport, int device) = 0;
  [[nodiscard]] virtual bool initialized() const = 0;
  [[nodiscard]] virtual int device() const = 0;
  [[nodiscard]] virtual space transport_space() const = 0;
  [[nodiscard]] virtual void* transport() = 0;  // the space's transport type
  [[nodiscard]] virtual int device_count() const = 0;
  /// Frees the device transport (before MPI is finalised).
  virtual void finalize() = 0;
};
void set_device_support(device_support* d);
[[nodiscard]] device_support* get_device_support();
[[nodiscard]] std::string canonical_name(const std::string& name);
[[nodiscard]] std::string bytes_name(std::size_t bytes);   // 4194304 -> "4MiB"
[[nodiscard]] std::string number_name(double v);           // shortest round-trip form

namespace detail {
template <class W> inline std::string precision_token() { return std::is_same_v<W, float> ? "" : std::string(wire_name<W>); }
template <class F>
std::string fusion_token() {
  if constexpr (requires { F::autotuned; })
    if (F::autotuned) return "fusion=auto";
  if (F::threshold_bytes == 0) return "";
  std::string s = "fusion=" + bytes_name(F::threshold_bytes);
  if constexpr (requires { F::first_bucket_bytes; })
    if (F::first_bucket_bytes != 0) s += ",first=" + bytes_name(F::first_bucket_bytes);
  return s;
}
template <class S>
inline constexpr bool is_oktopk = false;
template <double D>
inline constexpr bool is_oktopk<gflow::OkTopK<D>> = true;
template <class S>
std::string scheme_token() {
  if constexpr (std::is_same_v<S, gflow::detail::dense_scheme>) return "";
  else if constexpr (is_oktopk<S>) return "oktopk=" + number_name(S::density);
  else if constexpr (requires { S::chunk_elems; S::percent; }) return "csc=" + std::to_string(S::chunk_elems) + ":" + std::to_string(S::percent);
  else if constexpr (requires { S::density; S::global; }) return std::string(S::global ? "gtopk=" : "topk=") + number_name(S::density);
  else return "custom_sparsifier";
}
template <class A>
std::string topology_token() {
  if constexpr (std::is_same_v<A, Ring>) return "";
  else if constexpr (requires { A::threshold_bytes; A::group_size; }) return "hybrid=" + bytes_name(A::threshold_bytes) + ":" + std::to_string(A::group_size);
  else if constexpr (requires { A::group_size; }) return "hier=" + std::to_string(A::group_size);
  else return "custom_topology";
}
template <class S>
std::string sharding_token() {
  if constexpr (requires { requires S::sharded; }) return "shard";
  else return "";
}
template <class S>
std::string overlap_token() {
  if constexpr (std::is_same_v<S, None>) return "";
  else if constexpr (std::is_same_v<S, Funneled>) return "funneled";
  else if constexpr (std::is_same_v<S, Chained>) return "chained";
  else return "concurrent=" + std::to_string(S::communicators);
}
}  // namespace detail

/// The menu name of a policy set, from its types.
template <class Set>
std::string composition_name() {
  std::string out;
  for (const std::string& t : {detail::precision_token<typename Set::precision::wire_type>(), detail::fusion_token<typename Set::fusion>(),
                               detail::scheme_token<typename Set::sparsifier::scheme>(), detail::topology_token<typename Set::topology::algorithm>(),
                               detail::overlap_token<typename Set::overlap::strategy>(), detail::sharding_token<typename Set::sharding>()})
    if (!t.empty()) out += (out.empty() ? "" : "+") + t;
  return out.empty() ? "dense" : out;
}

template <class Exchange, class Transport = mpi::transport>
class port_for : public port {
 public:
  using exchanger_t = typename Exchange::template on<Transport>;
  using set = typename exchanger_t::policies;
  using sparsifier_t = std::remove_cvref_t<decltype(std::declval<exchanger_t&>().sparsifier())>;
  static constexpr bool is_csc = requires(sparsifier_t& e) { e.selected_chunks(); e.set_warmup(1, 1); };
  static constexpr bool is_topk = requires(sparsifier_t& e) { e.set_schedule(gflow::detail::plan::density_schedule::constant(1.0)); };

  port_for(Transport& t, Layout layout, exchange_options o) : ex_(t, std::move(layout), o) {}

  float* pool_data() override { return ex_.pool_data(); }
  std::size_t pool_size() const override { return ex_.pool_size(); }
  std::vector<std::size_t> offsets() const override { return ex_.pool_plan().offset; }
  void ready(std::size_t i) override { ex_.ready(i); }
  exchange_status finish() override { return ex_.finish(); }
  void begin_no_sync() override {
    if (scope_) throw usage_error("no_sync", "a no_sync() scope is already open on this optimizer.", "close the first scope before opening another.");
    scope_ = std::make_unique<no_sync_scope>(ex_.no_sync());
  }
  void end_no_sync() override { scope_.reset(); }
  join_status join(const std::function<void(const exchange_status&)>& after_each) override {
    if constexpr (!set::sparsifier::dense) {
      throw invalid_argument("join", "join() shadows the other ranks with zero contributions, which the residual of composition '" +
                                         name() + "' cannot be.",
                             "use join() with a dense composition (dense, fp16, bf16, fusion=..., funneled, ...).");
    } else if constexpr (set::sharding::sharded) {
      if (!after_each)
        throw invalid_argument("join", "join() with a sharded composition ('" + name() + "') needs a step: a rank out of data still owns a shard that must be stepped.",
                               "call ShardedOptimizer.join() (it steps the shard after each shadowed iteration), or pass join(step=...).");
      return ex_.join(after_each);
    } else {
      if (after_each) return ex_.join(after_each);
      return ex_.join();
    }
  }
  std::uint64_t generation() const override { return ex_.generation(); }
  std::uint64_t iteration() const override { return ex_.iteration(); }
  std::string save_state() const override {
    std::ostringstream out(std::ios::binary);
    ex_.save_state(out);
    return std::move(out).str();
  }
  void load_state(const std::string& bytes) override {
    std::istringstream in(bytes, std::ios::binary);
    ex_.load_state(in);
  }
  void set_timeline(timeline* tl) override { ex_.set_timeline(tl); }
  void set_fusion(std::size_t threshold_bytes) override {
    if constexpr (exchanger_t::autotuned)
      throw usage_error("threshold_bytes", "this composition's fusion plan is the auto-tuner's ('fusion=auto').",
                        "leave threshold_bytes out with 'fusion=auto', or pick a composition with a fixed 'fusion=<bytes>'.");
    else
      ex_.set_fusion(threshold_bytes);
  }
  std::vector<std::pair<std::size_t, std::size_t>> buckets() const override {
    std::vector<std::pair<std::size_t, std::size_t>> out;
    for (const auto& b : ex_.buckets()) out.emplace_back(b.offset, b.count);
    return out;
  }
  std::vector<std::uint32_t> selected_chunks() const override {
    if constexpr (is_csc) {
      const auto s = ex_.sparsifier().selected_chunks();
      return {s.begin(), s.end()};
    } else {
      return {};
    }
  }
  std::size_t chunk_elems() const override {
    if constexpr (is_csc) return ex_.sparsifier().chunk_elems();
    else return 0;
  }
  void configure(double momentum, std::uint64_t warmup) override {
    if constexpr (is_csc) {
      ex_.sparsifier().set_momentum(static_cast<float>(momentum));
      ex_.sparsifier().set_warmup(warmup, warmup);
    }
    if constexpr (is_topk) {
      const double final_d = ex_.sparsifier().density();
      if (warmup >= 3) {
        std::vector<gflow::detail::plan::density_step> steps;
        for (double d : {0.25, 0.0725, 0.015})
          if (d > final_d) steps.push_back({(steps.size() + 1) * (warmup / 3), d});
        ex_.sparsifier().set_schedule(gflow::detail::plan::density_schedule::per_iteration(steps, final_d));
      }
    }
    (void)momentum;
    (void)warmup;
  }
  bool dense() const override { return set::sparsifier::dense; }
  std::string name() const override { return composition_name<set>(); }
  bool sharded() const override { return set::sharding::sharded; }
  std::vector<std::pair<std::size_t, std::size_t>> shard() const override {
    std::vector<std::pair<std::size_t, std::size_t>> out;
    if constexpr (set::sharding::sharded)
      for (const pool_range r : ex_.shard()) out.emplace_back(r.begin, r.end);
    return out;
  }
  void gather_shards(float* values, std::size_t n) override {
    if constexpr (set::sharding::sharded) ex_.gather_shards({values, n});
    else port::gather_shards(values, n);
  }
  std::string save_checkpoint(const std::string& root, const std::vector<std::span<const float>>& state) const override {
    if constexpr (set::sharding::sharded) {
      return gflow::save_checkpoint(ex_, root, state).string();
    } else {
      if (!state.empty())
        throw invalid_argument("state", "composition '" + name() + "' does not shard, so a checkpoint holds no per-shard state.",
                               "save without state, or use a composition with Sharding<ReduceScatter> ('...+shard').");
      return gflow::save_checkpoint(ex_, root).string();
    }
  }
  std::pair<std::uint64_t, std::vector<std::vector<float>>> load_checkpoint(const std::string& root, bool with_state) override {
    std::vector<std::vector<float>> state;
    if constexpr (set::sharding::sharded) {
      if (with_state) {
        const std::uint64_t it = gflow::load_checkpoint(ex_, root, state);
        return {it, std::move(state)};
      }
    } else if (with_state) {
      throw invalid_argument("with_state", "composition '" + name() + "' does not shard, so its checkpoints hold no per-shard state.",
                             "load without state, or use a composition with Sharding<ReduceScatter> ('...+shard').");
    }
    return {gflow::load_checkpoint(ex_, root), std::move(state)};
  }

 protected:
  exchanger_t ex_;
  std::unique_ptr<no_sync_scope> scope_;
};

template <class Exchange>
std::unique_ptr<port> make_port(void* t, Layout layout, exchange_options o) {
  return std::make_unique<port_for<Exchange>>(*static_cast<mpi::transport*>(t), std::move(layout), o);
}

/// Registers factory f for space s under Exchange's derived name and `alias` (if any).
template <class Exchange>
void register_names(const char* policies, const char* alias, space s, factory f) {
  register_composition(composition_name<typename Exchange::policies>(), policies, s, f);
  if (alias && *alias) register_composition(alias, policies, s, f);
}

/// Registers Exchange on host memory at static initialisation (device memory: device_port.cuh).
template <class Exchange>
struct registrar {
  registrar(const char* policies, const char* alias = nullptr) { register_names<Exchange>(policies, alias, space::host, &make_port<Exchange>); }
};

}  // namespace gflow::python

/// GFLOW_PYTHON_COMPOSITION(id, policies...): one menu entry (a translation unit of the module).
#define GFLOW_PYTHON_COMPOSITION(id, ...) \
  static const ::gflow::python::registrar<::gflow::Exchanger<__VA_ARGS__>> gflow_python_entry_##id(#__VA_ARGS__)

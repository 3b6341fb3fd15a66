#pragma once
// The contracts of the engine layer, as named concepts (CONVENTIONS: "a concept per policy family,
// asserted at the definition"). Each implementation asserts the one it meets right after its
// definition (host_backend, device_backend, Ring / Hierarchical / Hybrid engines, Dense / CSC /
// TopK / GTopK engines); the exchanger requires them.
//
//   backend<B>                   memory and kernels of one memory space: host_backend forwards to
//                                kernels::, device_backend to the CUDA twins on the transport's stream
//   oktopk_backend<B>            and the OkTopK kernels (threshold gather, gather_keys, add_at)
//   backend_for_transport<B, T>  its kernel context can be built over transport T
//   topology_engine<E, T, W>     how one dense allreduce over T travels (run / start / wait)
//   checkpointed<E>              save_state / read_state / restore_state
//   sparsifier_engine<E, Ctx>    what part of the pool one bucket exchanges
//   counts_collectives<E>        optional: its own count of collectives for exchange_status
//   phased_engine<E>             optional: start(b) / complete(b, request) (Overlap<Chained>)
//   independent_buckets_engine<E> optional: no state crosses buckets (Overlap<Concurrent<N>>)
#include <concepts>
#include <cstddef>
#include <cstdint>

#include "../../dtype.hpp"
#include "../kernels/topk.hpp"
#include "../../transport/transport.hpp"
#include "../support/checkpoint.hpp"

namespace gflow::detail {

// ---- backend ------------------------------------------------------------------------------------
/// Memory and kernels of one memory space. Every kernel the engines run goes through the
/// context, so an engine is written once for host and device memory. Pointers are of the
/// backend's memory space except where a name says host (download / upload). Counting kernels add
/// to the context's non-finite count, which take_nonfinite() returns (device: one synchronisation).
template <class B>
concept backend =
    requires {
      { B::stream_ordered } -> std::convertible_to<bool>;  // kernels queue behind started collectives
      typename B::context;
      typename B::template buffer<float>;
      typename B::template buffer<half>;
      typename B::template buffer<bfloat16>;
      typename B::template buffer<std::uint32_t>;
    } &&
    std::default_initializable<typename B::template buffer<float>> && std::movable<typename B::template buffer<float>> &&
    std::constructible_from<typename B::template buffer<float>, std::size_t> &&  // zero-filled
    requires(const typename B::template buffer<float>& buf, typename B::context& k, float* f, const float* cf, half* h, const half* ch,
             bfloat16* b, const bfloat16* cb, std::uint32_t* u, const std::uint32_t* cu, std::size_t n, float s, bool flag) {
      { buf.data() } -> std::same_as<float*>;
      { buf.size() } -> std::same_as<std::size_t>;
      // dense path (exchange_context)
      k.scale_to_wire(cf, h, n, s);  // out = W(in * s)
      k.scale_to_wire(cf, b, n, s);
      k.wire_to_float(ch, f, n);     // counts non-finite results
      k.wire_to_float(cb, f, n);
      k.scale_in_place(f, n, s);     // counts non-finite results
      k.count_nonfinite(cf, n);
      k.copy(f, cf, n);
      k.add(f, cf, n);               // f += cf (gradient accumulation)
      { k.take_nonfinite() } -> std::convertible_to<std::size_t>;
      k.order_after_producer();
      // chunked sparse path (CSC), the kernels of kernels/sparse_chunks.hpp
      k.compact_chunks(cf, f, n, n, cu, n, f);
      k.compact_chunks_to_wire(cf, f, n, n, cu, n, h, s, s);
      k.compact_chunks_to_wire(cf, f, n, n, cu, n, b, s, s);
      k.defer_chunks(f, f, n, n, cu, n, s, f);
      k.scatter_chunks_counted(cf, f, n, n, cu, n, flag, s, f, s);  // counts non-finite results
      k.scatter_chunks_from_wire(ch, f, n, n, cu, n, f, s);         // counts non-finite results
      k.scatter_chunks_from_wire(cb, f, n, n, cu, n, f, s);
      k.count_nonfinite_at(cf, cu, n);                              // counts v[list[j]]
      k.select_top_chunks(cf, n, n, u);
      // the few transfers to and from the host (docs/DESIGN.md, "Device memory")
      k.download(f, cf, n);  // host f = space cf; synchronises
      k.download(u, cu, n);
      k.fill_zero(f, n);
      k.upload(f, cf, n);    // space f = host cf
      k.upload(u, cu, n);
    };

/// The Top-k kernels of a backend (TopK / GTopK engines), shown for 32-bit indices and an fp16
/// wire; each is a template over the index type (u32, u64) and the wire type.
template <class B>
concept topk_backend =
    backend<B> && requires { typename B::template topk_scratch<half>; } &&
    requires(typename B::context& k, typename B::template topk_scratch<half>& ws, float* f, const float* cf, std::uint32_t* u,
             const std::uint32_t* cu, half* h, const half* ch, unsigned char* m, const unsigned char* cm, std::size_t n, float s,
             kernels::merge_scratch<std::uint32_t> ms) {
      { k.accumulate_select_topk(cf, f, n, n, n, u, ws) } -> std::same_as<kernels::topk_result>;  // res = g + res; top-k of |res|
      k.take_selected_dropping(f, n, n, cu, n, h, s, s, ws);
      k.pack(m, n, cu, ch, n, sparse_message::header{});
      { k.unpack_checked(cm, n, n, n, u, h, ws) } -> std::same_as<sparse_message::unpack_result>;  // the verdict reaches the host
      k.fill_zero(f, n);
      k.scatter_add(f, cu, ch, n);
      { k.merge_topk(cu, ch, n, cu, ch, n, n, u, h, u, f, &n, ms, ws) } -> std::convertible_to<std::size_t>;
      k.decode_scatter_counted(f, cu, ch, n, s, f);  // counts non-finite results
      k.restore_unselected(f, cu, ch, n, cu, n, s);
      k.restore_records_in(f, cu, cf, n, cu, n, s);
      k.copy_n(u, cu, n);
      k.copy_n(h, ch, n);
    };

/// The OkTopK kernels of a backend (Sparsifier<OkTopK<d>>, engines/oktopk/): the threshold
/// selection's pass, a plain exact top-k, and two per-entry helpers; OkTopK's other per-entry
/// work runs on the host. select_topk, gather_keys and add_at are templates over the index type (u32, u64).
template <class B>
concept oktopk_backend = topk_backend<B> && requires(typename B::context& k, typename B::template topk_scratch<half>& ws, const float* cf, float* f,
                                                     std::uint64_t* p, std::uint32_t* u, const std::uint32_t* cu, const std::uint64_t* cp,
                                                     std::size_t n, std::uint32_t t) {
  // res = g + res over all n, then base + i and the key of every key >= t (t >= 1), increasing,
  // at most cap of them; returns the count, or cap + 1 when there were more (reaches the host)
  { k.accumulate_gather_above(cf, f, n, t, n, p, u, n) } -> std::convertible_to<std::size_t>;
  k.gather_keys(cf, cu, n, u);  // keys[j] = magnitude key (bits & 0x7fffffff) of v[idx[j]]
  k.gather_keys(cf, cp, n, u);
  k.add_at(f, cu, cf, n);       // dst[idx[j]] += v[j] (indices distinct; round to nearest)
  k.add_at(f, cp, cf, n);
  { k.select_topk(cf, n, n, n, u, ws) } -> std::convertible_to<std::size_t>;  // exactly kernels::select_topk (v only read); the count
};

/// The backend of a memory space: backend_for<host_memory> is engines/host_backend.hpp's,
/// backend_for<device_memory> cuda/device_backend.cuh's (present only where that header is).
template <class Space>
struct backend_for;
template <class Space>
concept has_backend = requires { typename backend_for<Space>::type; };

/// The backend's kernel context can be built over transport T (the exchanger and every
/// Concurrent<N> lane build one).
template <class B, class T>
concept backend_for_transport = backend<B> && std::constructible_from<typename B::context, T&>;

/// Optional: the context orders each bucket's work after a producer stream (device backends).
template <class Context, class Stream>
concept accepts_producer = requires(Context& k, Stream s) { k.set_producer(s); };

// ---- checkpointed state -------------------------------------------------------------------------
/// read_state reads and validates without changing anything; restore_state applies what it read.
/// The checkpoint members of an engine that keeps nothing across iterations (Dense, the sharded
/// Dense): inherit them.
struct stateless_engine {
  struct saved_state {};
  template <class Writer>
  void save_state(Writer&) const {}
  template <class Reader>
  [[nodiscard]] saved_state read_state(Reader&) const { return {}; }
  void restore_state(saved_state&&) noexcept {}
};

template <class E>
concept checkpointed = requires(const E& ce, E& e, checkpoint_writer& w, checkpoint_reader& r) {
  ce.save_state(w);
  e.restore_state(ce.read_state(r));
};

/// A topology with a run-time message-size switch (Topology<Hybrid>): Fusion<Auto> tunes it.
template <class E>
concept switched_topology = requires(E& e, const E& ce, std::size_t bytes) {
  e.set_threshold(bytes);
  { ce.threshold() } -> std::convertible_to<std::size_t>;
};

// ---- topology engine ----------------------------------------------------------------------------
/// How one dense allreduce over T travels. W: the wire type besides float (the Precision policy's;
/// the CSC norms and fp32 wires use float).
template <class E, class T, class W = float>
concept topology_engine = transport<T> && std::constructible_from<E, T&> &&  // collective over T: built on every rank
                          std::semiregular<typename E::request> &&           // requests are kept in vectors
                          requires(E& e, typename E::request& r, float* f, W* w, std::size_t n) {
                            e.run(f, n);  // sum over every rank, in place, complete on return
                            e.run(w, n);
                            { e.start(f, n) } -> std::same_as<typename E::request>;  // or begin it ...
                            { e.start(w, n) } -> std::same_as<typename E::request>;
                            e.wait(r);  // ... and complete it
                          };

// ---- sparsifier engine --------------------------------------------------------------------------
/// Built once per exchanger over its exchange context (engines/context.hpp); exchange(b)
/// runs in pool order, once per bucket per iteration, on every rank in the same order.
template <class E, class Ctx>
concept sparsifier_engine = std::constructible_from<E, Ctx&> && checkpointed<E> && requires(E& e, const E& ce, std::size_t b) {
  e.replan();         // the buckets changed (Exchanger::set_fusion)
  e.exchange(b);      // bucket b's gradients are final: exchange them in place
  e.end_iteration();  // after the last bucket
  { ce.wire_bytes() } -> std::convertible_to<std::size_t>;
};

/// Optional: its own count of collectives for exchange_status (else one per bucket).
template <class E>
concept counts_collectives = requires(const E& e) {
  { e.collectives() } -> std::convertible_to<std::size_t>;
};

/// Optional: the engine splits a bucket's exchange into start and complete, so that Overlap<Chained>
/// can start every ready bucket before completing any.
template <class E>
concept phased_engine = requires(E& e, std::size_t b, typename E::request& r) {
  requires E::phased;
  { e.start(b) } -> std::same_as<typename E::request>;
  e.complete(b, r);
};

/// Optional: no state crosses buckets, so Overlap<Concurrent<N>> may give buckets to N engines.
template <class E>
concept independent_buckets_engine = requires { requires E::independent_buckets; };

}  // namespace gflow::detail

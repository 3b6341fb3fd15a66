// A topology gflow does not ship, written outside include/ against the documented extension point
// (<gflow/extension.hpp>, gflow::topology_engine): "reduce, then broadcast" — every dense allreduce
// is a reduce of the sum onto one root rank followed by a broadcast of the root's bits. The root
// rotates with each message (message m goes to rank m mod P), so no one rank adds every bucket.
//
// It composes with the other families like Ring, Hierarchical<g> or Hybrid<t, g>:
//     gflow::Exchanger<gflow::Topology<ReduceBroadcast>, gflow::Precision<gflow::half>, gflow::Fusion<16 << 10>>
// and this program checks on 4 in-process ranks, for an fp32 and an fp16 wire, that the exchanged
// gradients are bit for bit those of Topology<Ring> on integer-valued gradients (every partial sum
// is exact there, so the order of the additions cannot change a bit), and identical on every rank.
// ctest example.custom_topology runs it.
#include <gflow/exchanger.hpp>
#include <gflow/transport/inproc.hpp>

#include <atomic>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <random>
#include <vector>

// ---- the engine: what gflow calls (gflow::topology_engine) ----------------------------------------
template <gflow::transport T>
class reduce_broadcast_engine {
 public:
  // Built once per exchanger, on every rank (it may split the transport here: that is collective).
  explicit reduce_broadcast_engine(T& t) : t_(&t) {}

  // Host transports: nothing runs concurrently here, so a request is empty and run() completes.
  struct request {};

  // Sum buf[0, n) over every rank, in place, complete on return. E is float or the wire type.
  template <class E>
  void run(E* buf, std::size_t n) {
    const int root = static_cast<int>(messages_++ % static_cast<std::uint64_t>(t_->size()));
    t_->reduce(buf, n, gflow::reduce_op::sum, root);  // the sum lands on the root
    t_->broadcast(buf, n, root);                       // every rank gets the root's bits
  }
  // The non-blocking form (Overlap<Chained>): here it runs to completion and returns a done request.
  template <class E>
  request start(E* buf, std::size_t n) {
    run(buf, n);
    return {};
  }
  void wait(request&) {}

 private:
  T* t_;
  std::uint64_t messages_ = 0;  // the same on every rank: every rank runs the same messages in order
};

// ---- the algorithm: what Topology<A> takes ----------------------------------------------------------
struct ReduceBroadcast {
  template <gflow::transport T>
  using engine = reduce_broadcast_engine<T>;
};

// Checked where it is defined, over a transport that does nothing, for the fp32 and fp16 wires.
static_assert(gflow::topology_engine<ReduceBroadcast::engine<gflow::transport_archetype<>>, gflow::transport_archetype<>, float>);
static_assert(gflow::topology_engine<ReduceBroadcast::engine<gflow::transport_archetype<>>, gflow::transport_archetype<>, gflow::half>);

// ---- use it ---------------------------------------------------------------------------------------
// Exchanges `iterations` of integer-valued gradients (|g| <= 64: every sum of 4 ranks, and its
// average, is exact in fp32 and in fp16) with composition E; returns every rank's views, in order.
template <class E>
std::vector<std::vector<float>> run(const gflow::Layout& layout, int P, int iterations, std::atomic<bool>& ok) {
  std::mutex mu;
  std::vector<std::vector<float>> out(static_cast<std::size_t>(P));
  gflow::inproc::run(P, [&](gflow::inproc::transport& comm) {
    typename E::template on<gflow::inproc::transport> ex(comm, layout);
    std::mt19937 rng(77u + static_cast<unsigned>(comm.rank()));
    std::uniform_int_distribution<int> u(-64, 64);
    std::vector<float> mine;
    for (int it = 0; it < iterations; ++it) {
      for (std::size_t i = layout.size(); i-- > 0;) {  // backward: last tensor first
        for (float& x : ex.view(i)) x = static_cast<float>(u(rng));
        ex.ready(i);
      }
      if (!ex.finish().finite()) ok = false;
      for (std::size_t i = 0; i < layout.size(); ++i) mine.insert(mine.end(), ex.view(i).begin(), ex.view(i).end());
    }
    std::lock_guard lk(mu);
    out[static_cast<std::size_t>(comm.rank())] = std::move(mine);
  });
  return out;
}

template <class Wire>
std::size_t compare(const gflow::Layout& layout, int P, std::atomic<bool>& ok, const char* name) {
  using Mine = gflow::Exchanger<gflow::Topology<ReduceBroadcast>, gflow::Precision<Wire>, gflow::Fusion<(16 << 10)>>;
  using Ring = gflow::Exchanger<gflow::Topology<gflow::Ring>, gflow::Precision<Wire>, gflow::Fusion<(16 << 10)>>;
  const auto mine = run<Mine>(layout, P, 3, ok);
  const auto ring = run<Ring>(layout, P, 3, ok);
  std::size_t checked = 0;
  for (int r = 0; r < P; ++r) {
    const auto& a = mine[static_cast<std::size_t>(r)];
    const auto& b = ring[static_cast<std::size_t>(r)];
    if (a.size() != b.size() || a.empty()) {
      ok = false;
      continue;
    }
    for (std::size_t j = 0; j < a.size(); ++j) {
      if (std::bit_cast<std::uint32_t>(a[j]) != std::bit_cast<std::uint32_t>(b[j])) ok = false;  // as Ring, bit for bit
      if (std::bit_cast<std::uint32_t>(a[j]) != std::bit_cast<std::uint32_t>(mine[0][j])) ok = false;  // identical on every rank
      ++checked;
    }
  }
  std::printf("reduce-broadcast, %s wire: %zu values compared with Ring\n", name, checked);
  return checked;
}

int main() {
  const auto layout = gflow::Layout::from_sizes({4096, 64, 25000, 10, 300});
  constexpr int P = 4;
  std::atomic<bool> ok = true;
  const std::size_t checked = compare<float>(layout, P, ok, "fp32") + compare<gflow::half>(layout, P, ok, "fp16");
  const bool good = ok && checked == 2u * P * 3u * layout.total_numel();
  std::printf("%s\n", good ? "identical to Ring on every rank, bit for bit" : "WRONG");
  return good ? 0 : 1;
}

// The simulated build against the in-process transport (ctest sim_bitwise_16, label "sim";
// tests/sim/run_bitwise.cmake): the same exchanges on 16 ranks, once under SimGrid's SMPI
// (gflow::mpi::transport compiled by smpicxx, as bench/simulate.sh builds it) and once on the
// in-process transport (16 threads), each printing one FNV-1a digest per composition, iteration
// and rank of the exchanged pool (and, for the sparse schemes, the residual). The digests must be
// equal, bit for bit.
//   The gradients are multiples of 2^-10 below 1 in magnitude: any sum of 16 of them is exact in
// fp32 (24 bits hold 10 fractional bits and the 14 bits of 16 x 1000), and the average divides by
// a power of two, so every summation order gives the same bits and the comparison checks what was
// sent where, not the order MPI's algorithms add in.
//   Built twice from this file: with GFLOW_SIM_MPI (smpicxx; run by smpirun) and without (the
// normal build, gflow_sim_reference, which runs inproc::run(16, ...)).
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <stdexcept>
#include <type_traits>
#include <string>
#include <vector>

#include <gflow/exchanger.hpp>
#ifdef GFLOW_SIM_MPI
#include <gflow/transport/mpi.hpp>
#else
#include <gflow/transport/inproc.hpp>
#endif

namespace {

constexpr int iterations = 3;

gflow::Layout layout() { return gflow::Layout::from_sizes({4000, 3, 1025, 16384, 1, 777, 9000}); }

// A multiple of 2^-10 in [-1000/1024, 1000/1024], from (rank, iteration, element).
float gradient(int rank, int it, std::size_t e) {
  std::uint64_t x = e * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(rank) * 0xBF58476D1CE4E5B9ull + static_cast<std::uint64_t>(it) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  x *= 0xD6E8FEB86659FD93ull;
  x ^= x >> 32;
  return static_cast<float>(static_cast<int>(x % 2001) - 1000) / 1024.0f;
}

std::uint64_t fnv(const float* p, std::size_t n, std::uint64_t h = 1469598103934665603ull) {
  const auto* b = reinterpret_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n * sizeof(float); ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

struct line {
  std::string name;
  int it, rank;
  std::uint64_t digest;
};

template <class E, class T>
void exchange(T& t, const char* name, std::vector<line>& out) {
  const auto l = layout();
  typename E::template on<T> ex(t, l);
  if constexpr (requires { ex.sparsifier().set_warmup(0, 0); }) ex.sparsifier().set_warmup(0, 0);  // CSC: sparse from the start
  for (int it = 0; it < iterations; ++it) {
    float* pool = ex.pool_data();
    for (std::size_t e = 0; e < ex.pool_size(); ++e) pool[e] = gradient(t.rank(), it, e);
    for (std::size_t q = l.size(); q-- > 0;) ex.ready(q);
    if (!ex.finish().finite()) throw std::runtime_error("sim_bitwise: a non-finite gradient");
    std::uint64_t h = 0;
    if constexpr (requires { ex.shard(); }) {  // sharded: this rank's shard, then the pool after gather_shards
      std::uint64_t s = 1469598103934665603ull;
      for (const gflow::pool_range r : ex.shard()) s = fnv(pool + r.begin, r.end - r.begin, s);
      ex.gather_shards(std::span<float>(pool, ex.pool_size()));
      h = fnv(pool, ex.pool_size(), s);
    } else {
      h = fnv(pool, ex.pool_size());
    }
    if constexpr (requires { ex.sparsifier().residual(); }) {  // what a sparse scheme kept back
      const auto r = ex.sparsifier().residual();
      h = fnv(r.data(), r.size(), h);
    }
    out.push_back({name, it, t.rank(), h});
  }
}

template <class T>
std::vector<line> run_all(T& t) {
  using namespace gflow;
  std::vector<line> out;
  exchange<Exchanger<>>(t, "Dense", out);
  exchange<Exchanger<Fusion<8192>>>(t, "Dense+Fusion<8192>", out);
  exchange<Exchanger<Fusion<8192>, Topology<Hierarchical<4>>>>(t, "Dense+Hierarchical<4>", out);
  exchange<Exchanger<Fusion<8192>, Topology<Hybrid<16384, 4>>>>(t, "Dense+Hybrid<16384,4>", out);
  exchange<Exchanger<Sparsifier<TopK<0.01>>>>(t, "TopK<0.01>", out);
  exchange<Exchanger<Sparsifier<GTopK<0.01>>>>(t, "GTopK<0.01>", out);
  exchange<Exchanger<Sparsifier<OkTopK<0.01>>>>(t, "OkTopK<0.01>", out);
  exchange<Exchanger<Sparsifier<CSC<512, 10>>>>(t, "CSC<512,10>", out);
  exchange<Exchanger<Fusion<8192>, Sharding<ReduceScatter>>>(t, "Sharding<ReduceScatter>", out);
  return out;
}

void print(const std::vector<line>& all) {
  for (const auto& x : all) std::printf("%s it %d rank %d %016" PRIx64 "\n", x.name.c_str(), x.it, x.rank, x.digest);
}

}  // namespace

int main(int argc, char** argv) {
  constexpr int P = 16;
#ifdef GFLOW_SIM_MPI
  gflow::mpi::environment env(argc, argv);
  gflow::mpi::transport t;
  if (t.size() != P) {
    if (t.rank() == 0) std::fprintf(stderr, "sim_bitwise: run on %d ranks (got %d)\n", P, t.size());
    return 2;
  }
  const auto mine = run_all(t);
  // Rank order: every rank's digests travel to rank 0, which prints them in (name, it, rank) order.
  std::vector<std::uint64_t> d(mine.size()), all(mine.size() * P);
  for (std::size_t i = 0; i < mine.size(); ++i) d[i] = mine[i].digest;
  t.all_gather(d.data(), all.data(), d.size());
  if (t.rank() == 0) {
    std::vector<line> lines;
    for (std::size_t i = 0; i < mine.size(); ++i)
      for (int r = 0; r < P; ++r) lines.push_back({mine[i].name, mine[i].it, r, all[static_cast<std::size_t>(r) * mine.size() + i]});
    print(lines);
  }
#else
  (void)argc;
  (void)argv;
  std::vector<std::vector<line>> per(P);
  gflow::inproc::run(P, [&](gflow::inproc::transport& t) { per[static_cast<std::size_t>(t.rank())] = run_all(t); });
  std::vector<line> lines;
  for (std::size_t i = 0; i < per[0].size(); ++i)
    for (int r = 0; r < P; ++r) lines.push_back(per[static_cast<std::size_t>(r)][i]);
  print(lines);
#endif
  return 0;
}

// The extension contract as a user sees it (<gflow/extension.hpp>, docs/GUIDE.md section 9): an
// engine of one's own, written with public names only, asserted against the archetype context,
// and the context's sparse wire (all_gather_sparse) through the Precision policy, on 3 in-process
// ranks: every rank receives every rank's pairs in rank order, the values cast to the wire type
// with round-to-nearest-even, and inf among them counted in exchange_status::nonfinite.
#include <doctest/doctest.h>

#include <gflow/exchanger.hpp>
#include <gflow/transport/inproc.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <mutex>
#include <vector>

namespace {

// What one rank received in its last exchange of bucket 0.
struct received {
  std::vector<std::uint32_t> idx;
  std::vector<float> val;
};

// Every bucket sends k = 3 pairs (index rank * 10 + j, value v(rank, j)); the pool is zeroed.
template <class Ctx>
class gather_engine {
 public:
  explicit gather_engine(Ctx& cx) : cx_(&cx) {}
  void replan() {}
  void exchange(std::size_t b) {
    const auto& bk = (*cx_->buckets)[b];
    const auto P = static_cast<std::size_t>(cx_->ranks()), r = static_cast<std::size_t>(cx_->transport->rank());
    std::vector<std::uint32_t> idx(k), all_idx(k * P);
    std::vector<float> val(k), all_val(k * P);
    std::vector<typename Ctx::wire_type> wire((P + 1) * k);
    for (std::size_t j = 0; j < k; ++j) {
      idx[j] = static_cast<std::uint32_t>(r * 10 + j);
      val[j] = value(r, j);
    }
    cx_->all_gather_sparse(idx.data(), val.data(), k, all_idx.data(), all_val.data(), wire.data());
    for (std::size_t j = 0; j < bk.count; ++j) cx_->grads[bk.offset + j] = 0.0f;
    if (b == 0) last = {all_idx, all_val};
  }
  void end_iteration() {}
  [[nodiscard]] std::size_t wire_bytes() const { return 0; }
  struct saved_state {};
  void save_state(gflow::checkpoint_writer&) const {}
  [[nodiscard]] saved_state read_state(gflow::checkpoint_reader&) const { return {}; }
  void restore_state(saved_state&&) {}

  static constexpr std::size_t k = 3;
  // Exact in every wire type but j = 1 (1 + 2^-12: fp16 and bf16 round it to 1) and, on rank 2,
  // j = 2 (inf).
  static float value(std::size_t r, std::size_t j) {
    if (j == 1) return 1.0f + 0x1p-12f;
    if (r == 2 && j == 2) return std::numeric_limits<float>::infinity();
    return static_cast<float>(r + 1) * 0.5f;
  }
  received last;

 private:
  Ctx* cx_;
};

struct GatherScheme {
  template <class Ctx>
  using engine = gather_engine<Ctx>;
};

static_assert(gflow::sparsifier_engine<gather_engine<gflow::archetype_context<>>, gflow::archetype_context<>>);
static_assert(gflow::sparsifier_engine<gather_engine<gflow::archetype_context<gflow::half>>, gflow::archetype_context<gflow::half>>);

template <class Wire>
void check_sparse_gather(bool narrow) {
  constexpr int P = 3;
  using Ex = gflow::Exchanger<gflow::Sparsifier<GatherScheme>, gflow::Precision<Wire>>;
  const auto layout = gflow::Layout::from_sizes({5, 7});
  std::mutex mu;
  std::vector<received> got(P);
  std::vector<std::size_t> nonfinite(P);
  gflow::inproc::run(P, [&](gflow::inproc::transport& t) {
    typename Ex::template on<gflow::inproc::transport> ex(t, layout);
    for (std::size_t i = layout.size(); i-- > 0;) ex.ready(i);
    const gflow::exchange_status st = ex.finish();
    std::lock_guard lk(mu);
    got[static_cast<std::size_t>(t.rank())] = ex.sparsifier().last;
    nonfinite[static_cast<std::size_t>(t.rank())] = st.nonfinite;
  });
  using E = gather_engine<gflow::archetype_context<>>;
  for (int me = 0; me < P; ++me) {
    const received& g = got[static_cast<std::size_t>(me)];
    REQUIRE(g.idx.size() == P * E::k);
    for (std::size_t r = 0; r < P; ++r)
      for (std::size_t j = 0; j < E::k; ++j) {
        CHECK(g.idx[r * E::k + j] == r * 10 + j);  // rank order, indices as sent
        const float sent = E::value(r, j);
        const float want = (narrow && j == 1) ? 1.0f : sent;  // 1 + 2^-12 rounds to 1 in 16 bits
        CHECK(g.val[r * E::k + j] == want);
      }
    // One inf per bucket (rank 2's), received by every rank: two buckets.
    CHECK(nonfinite[static_cast<std::size_t>(me)] == 2);
  }
}

}  // namespace

TEST_CASE("extension: all_gather_sparse sends every rank's pairs in rank order through the Precision's wire type") {
  SUBCASE("fp32") { check_sparse_gather<float>(false); }
  SUBCASE("fp16") { check_sparse_gather<gflow::half>(true); }
  SUBCASE("bf16") { check_sparse_gather<gflow::bfloat16>(true); }
}

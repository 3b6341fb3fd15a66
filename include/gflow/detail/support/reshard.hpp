#pragma once
// Re-sharding checkpoints: the P checkpoints of a job of P ranks rewritten as the checkpoint of
// rank r' in a job of P' ranks (P' < P or P' > P), at the byte-format level (support/checkpoint.hpp),
// so that both gflow::load_resharded (reshard.hpp) and the gflow-reshard tool use it without
// knowing the composition's C++ type. docs/DESIGN.md, "Re-sharding checkpoints".
//
// The share rule. State every rank holds identically (EXCH: iteration, fusion numbers,
// learn_order; TOPO: a Hybrid threshold; the sparsifier's settings, density schedule, CSC
// selections and norms) must be byte-equal over the P checkpoints and is copied. The per-rank
// residual (TopK / GTopK residual, CSC history: gradient computed but not yet applied) of old rank
// r goes to new rank r mod P'; new rank r' holds the sum of the residuals sent to it, scaled by
// P'/P when the exchanger averages (exchange_options::average), by 1 when it sums:
//
//   new residual[r'][i] = float( scale * sum over r = r' (mod P') of residual[r][i] ),  in double
//
// A residual element contributes residual / P to the averaged update of the old job; held by the
// new job it contributes residual' / P'. The factor P'/P keeps what the residuals add to the
// model (sum over ranks / ranks) what it was, element by element: sum'[i] / P' = sum[i] / P.
// Without it a job shrunk from 8 ranks to 1 would apply the pending gradient 8 times over. With
// average off the exchange sums, so the sum itself is what is applied and is kept (scale 1).
// New ranks past the old count (P' > P) start with a zero residual. Rounding: one per element
// (the sum and the scaling are exact in double for the few addends of a realistic P; the result
// is rounded to float once), so on dyadic values whose scaled sum is representable nothing is
// lost to the last bit. P' = P is the identity, byte for byte.
//
// OkTopK (engines/oktopk/engine.hpp, save_state): its residual follows the rule above, its
// parameters (periods, adaptation factors, capacity) are shared state and copied. Its estimates
// are not carried to P' != P: every unit's local and global thresholds become -1 and its region
// boundaries empty ("not estimated"), so the first iteration after the restart re-estimates them
// as on first use (exact local top-k, the boundaries' all_reduce, exact global top-k). The
// thresholds are magnitudes of the residual-plus-gradient sums, which the re-shard changes (a new
// rank holds the scaled sum of several old ranks' residuals), and the boundaries cut the unit into
// P regions, one per old rank: neither describes the new job. The global thresholds and the
// boundaries are identical on every rank and checked like other shared state; the local
// thresholds are each rank's own (not compared). With P' = P each rank keeps its own, byte for byte.
//
// The tuner (Fusion<Auto>) measured the old job's network; with P' != P it settles again (its
// probe phase starts over, its fitted alpha-beta and drift reference are cleared; its retune count
// carries over). With P' = P its state is kept.
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <istream>
#include <ostream>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "../../error.hpp"
#include "checkpoint.hpp"
#include "oktopk_params.hpp"

namespace gflow::detail {

/// What a re-shard needs besides the checkpoints.
struct reshard_options {
  /// The exchanger averages (exchange_options::average, the default): residuals are scaled by
  /// P'/P. false: the exchange sums, residuals are only added.
  bool average = true;
};

/// Which sections a composition writes, from its name (composition_name<Set>()).
struct checkpoint_schema {
  enum class sparse { dense, topk, oktopk, csc } kind = sparse::dense;
  bool topology_state = false;  // Topology<Hybrid>: TOPO holds the threshold
  bool tuned = false;           // Fusion<Auto>: a TUNE section
};

inline checkpoint_schema schema_of(std::string_view name) {
  checkpoint_schema s;
  const auto after = [&](std::string_view key) -> std::string_view {
    const std::size_t p = name.find(key);
    return p == std::string_view::npos ? std::string_view{} : name.substr(p + key.size());
  };
  const std::string_view sp = after("gflow::Sparsifier<");
  if (sp.starts_with(">") || sp.starts_with("gflow::None>")) s.kind = checkpoint_schema::sparse::dense;
  else if (sp.starts_with("gflow::TopK<") || sp.starts_with("gflow::GTopK<")) s.kind = checkpoint_schema::sparse::topk;
  else if (sp.starts_with("gflow::OkTopK<")) s.kind = checkpoint_schema::sparse::oktopk;
  else if (sp.starts_with("gflow::CSC<")) s.kind = checkpoint_schema::sparse::csc;
  // A sparsifier of one's own (a user's engine): its state is unknown here, so it is refused.
  else
    throw invalid_argument("composition",
                           "re-sharding reads the sparsifier state of Dense, TopK, GTopK, OkTopK and CSC; this checkpoint's composition is <" +
                               std::string(name) + ">, whose sparsifier writes a state re-sharding cannot split.",
                           "resume it on the same number of ranks (load_state), or restart its exchange state from zero.");
  const std::string_view topo = after("gflow::Topology<");
  if (topo.starts_with("gflow::Hybrid<")) s.topology_state = true;
  else if (!(topo.starts_with(">") || topo.starts_with("gflow::Ring>") || topo.starts_with("gflow::Hierarchical<")))
    throw invalid_argument("composition",
                           "re-sharding knows the topology state of Ring, Hierarchical and Hybrid; this checkpoint's composition is <" +
                               std::string(name) + ">.",
                           "resume it on the same number of ranks (load_state).");
  const std::string_view fu = after(fmt::format("gflow::Fusion<{}", ~std::size_t{0}));
  s.tuned = !fu.empty() && !(fu[0] >= '0' && fu[0] <= '9');
  return s;
}

/// One rank's checkpoint, split into what every rank shares and what is its own.
struct checkpoint_image {
  checkpoint_identity id;
  std::uint64_t iteration = 0;
  std::string exch, topo, sparse_shared, tune;  // encoded bytes, tags excluded
  bool has_residual = false;
  std::vector<float> residual;
  // What follows the residual in SPRS (OkTopK; empty for the others): the bytes as read (this
  // rank's own, written again when P' = P), the part every rank holds alike (compared), and the
  // tail of a job of another size (the estimates reset).
  std::string sparse_tail, sparse_tail_shared, sparse_tail_reset;
};

/// Reads fields from `r` and writes them again to `w` (so the shared bytes are re-encoded as read).
struct field_copier {
  checkpoint_reader& r;
  checkpoint_writer& w;
  std::uint32_t u32(std::string_view what) { const auto v = r.u32(what); w.u32(v); return v; }
  std::uint64_t u64(std::string_view what) { const auto v = r.u64(what); w.u64(v); return v; }
  void f64(std::string_view what) { w.f64(r.f64(what)); }
  void f32(std::string_view what) { w.f32(r.f32(what)); }
  /// A u64 count (at most max_n) followed by that many elements of E.
  template <class E>
  void array(std::size_t max_n, std::string_view what) {
    const std::vector<E> v = r.array_upto<E>(max_n, what);
    w.array(v.data(), v.size());
  }
};

/// OkTopK's state after its residual: parameters, then per selection unit the local threshold
/// (this rank's), the global threshold and the region boundaries (0 or P + 1 offsets; every
/// rank's alike). Fills the tail's three encodings (checkpoint_image).
inline void read_oktopk_tail(checkpoint_reader& r, checkpoint_image& img) {
  std::ostringstream all(std::ios::binary), shared(std::ios::binary), reset(std::ios::binary);
  checkpoint_writer wa(all), ws(shared), wr(reset);
  const auto u64 = [&](std::string_view what) {
    const std::uint64_t v = r.u64(what);
    for (checkpoint_writer* w : {&wa, &ws, &wr}) w->u64(v);
    return v;
  };
  const auto thr = [&](std::uint64_t u, std::string_view what) {
    const float v = r.f32(what);
    check_saved_oktopk_threshold(r, u, v);
    wa.f32(v);
    return v;
  };
  const oktopk_params params = read_oktopk_params(r);  // refused here as the engine would refuse it on load
  for (checkpoint_writer* w : {&wa, &ws, &wr}) write_oktopk_params(*w, params);
  const std::uint64_t units = u64("the OkTopK unit count");
  const std::uint64_t max_units = img.id.pool_elems + 1;  // a unit (bucket or pool) holds an element at least
  if (units > max_units) r.fail("units", fmt::format("the checkpoint claims {} OkTopK selection units for a pool of {} elements.", units, img.id.pool_elems));
  const std::size_t P = img.id.size;
  for (std::uint64_t u = 0; u < units; ++u) {
    (void)thr(u, "a local threshold");
    ws.f32(thr(u, "a global threshold"));
    const std::vector<std::uint64_t> b = r.array_upto<std::uint64_t>(P + 1, "the boundaries");
    if (!b.empty() && b.size() != P + 1)
      r.fail("boundaries", fmt::format("unit {} has {} region boundaries; 0 or {} (the saving job's ranks + 1) expected.", u, b.size(), P + 1));
    for (std::size_t i = 0; i < b.size(); ++i)
      if ((i == 0 && b[i] != 0) || (i > 0 && b[i] < b[i - 1]) || b[i] > img.id.pool_elems)
        r.fail("boundaries", fmt::format("unit {}'s region boundaries are not 0 <= ... <= {} in order (boundary {} is {}).", u, img.id.pool_elems, i, b[i]));
    wa.array(b.data(), b.size());
    ws.array(b.data(), b.size());
    wr.f32(-1.0f);    // local threshold: not estimated
    wr.f32(-1.0f);    // global threshold: not estimated
    wr.u64(0);        // boundaries: an empty array, not estimated
  }
  img.sparse_tail = all.str();
  img.sparse_tail_shared = shared.str();
  img.sparse_tail_reset = reset.str();
}

inline void read_sparse(checkpoint_reader& r, const checkpoint_schema& s, checkpoint_image& img) {
  std::ostringstream os(std::ios::binary);
  checkpoint_writer w(os);
  field_copier c{r, w};
  const std::size_t pool = static_cast<std::size_t>(img.id.pool_elems);
  switch (s.kind) {
    case checkpoint_schema::sparse::dense: break;
    case checkpoint_schema::sparse::topk:  // engines/topk/engine.hpp, save_state
    case checkpoint_schema::sparse::oktopk: {  // engines/oktopk/engine.hpp, save_state: TopK's head and residual, then its own
      c.u32("index_bytes");
      c.f64("density");
      const std::uint64_t steps = c.u64("the density schedule's step count");
      if (steps > (std::uint64_t{1} << 20)) r.fail("density_schedule", fmt::format("the density schedule claims {} steps.", steps));
      for (std::uint64_t i = 0; i < steps; ++i) {
        c.u64("a density schedule step");
        c.f64("a density schedule step");
      }
      c.f64("the final density");
      img.residual = r.array_upto<float>(pool, "the residual");
      img.has_residual = true;
      if (s.kind == checkpoint_schema::sparse::oktopk) read_oktopk_tail(r, img);
      break;
    }
    case checkpoint_schema::sparse::csc: {  // engines/csc.hpp, save_state
      c.f32("momentum");
      c.u64("warmup");
      c.u64("ramp");
      c.u32("percent");
      c.u64("the selection size");
      c.array<std::uint32_t>(pool, "the selection");
      c.u64("the last selection size");
      c.array<std::uint32_t>(pool, "the last selection");
      c.array<float>(pool, "the chunk norms");
      img.residual = r.array_upto<float>(2 * pool + (std::size_t{1} << 20), "the history");  // padded to whole chunks
      img.has_residual = true;
      break;
    }
  }
  img.sparse_shared = os.str();
}

/// Reads and validates one whole checkpoint (checksums included) into an image. With `mine`, the
/// header is first checked against the loading exchanger's identity (rank and size excepted), so
/// a checkpoint of another layout or composition raises load_state's mismatch_error.
inline checkpoint_image read_checkpoint_image(std::istream& in, const checkpoint_identity* mine = nullptr, const Layout* layout = nullptr) {
  checkpoint_reader r(in);
  checkpoint_image img;
  img.id = read_checkpoint_identity(r, std::size_t{1} << 24);
  if (mine) check_checkpoint_identity(img.id, *mine, *layout, /*check_rank_size=*/false);
  const checkpoint_schema s = schema_of(img.id.composition);
  const auto section = [&](const char(&tag)[5], std::string& out, auto&& body) {
    r.expect_tag(section_tag(tag), tag);
    std::ostringstream os(std::ios::binary);
    checkpoint_writer w(os);
    field_copier c{r, w};
    body(c);
    out = os.str();
  };
  section("EXCH", img.exch, [&](field_copier& c) {  // exchanger.hpp save_state, iteration.hpp write_order
    img.iteration = c.u64("iteration");
    c.u64("threshold_bytes");
    c.u64("first_bucket_bytes");
    const std::uint64_t learn = c.u64("learn_order");
    if (learn > 2) r.fail("learn_order", fmt::format("the learn_order state is {}; 0, 1 or 2 were written.", learn));
    if (learn == 2)
      for (std::size_t i = 0; i < img.id.tensor_fps.size(); ++i) c.u64("the learned order");
  });
  section("TOPO", img.topo, [&](field_copier& c) {
    if (s.topology_state) c.u64("threshold_bytes");
  });
  r.expect_tag(section_tag("SPRS"), "SPRS");
  read_sparse(r, s, img);
  if (s.tuned)
    section("TUNE", img.tune, [&](field_copier& c) {  // tuner.hpp save_state
      for (int i = 0; i < 3; ++i) c.u64("tuner plan");
      c.u32("tuner phase");
      for (int i = 0; i < 4; ++i) c.u64("tuner probe");
      for (int i = 0; i < 7; ++i) c.f64("tuner measurements");
      for (int i = 0; i < 2; ++i) c.u64("tuner counts");
    });
  r.verify_checksum("payload");
  return img;
}

/// The TUNE section of a tuner that settles again: probe phase from its first plan, measurements
/// cleared, the plan fields kept (valid for load_state's checks), retunes carried over.
inline std::string reset_tuner(const std::string& tune) {
  std::istringstream is(tune, std::ios::binary);
  checkpoint_reader r(is);
  std::ostringstream os(std::ios::binary);
  checkpoint_writer w(os);
  for (int i = 0; i < 3; ++i) w.u64(r.u64("tuner plan"));  // current plan
  (void)r.u32("tuner phase");
  w.u32(0);  // probe
  (void)r.u64("tuner probe");
  w.u64(0);
  for (int i = 0; i < 3; ++i) w.u64(r.u64("tuner best probe"));
  (void)r.f64("tuner best time");
  w.f64(1e300);
  for (int i = 0; i < 6; ++i) {  // alpha, beta, hierarchical alpha, beta, drift reference
    (void)r.f64("tuner measurements");
    w.f64(0.0);
  }
  w.u64(r.u64("tuner retunes"));
  (void)r.u64("tuner iterations");
  w.u64(0);
  return os.str();
}

[[noreturn]] inline void set_error(std::string what, std::string_view fix) {
  throw invalid_argument("checkpoints", what, fix);
}

/// Validates a whole set (one image per old rank, any order) and returns it ordered by rank.
inline std::vector<const checkpoint_image*> order_set(const std::vector<checkpoint_image>& imgs) {
  if (imgs.empty()) set_error("no checkpoint was given.", "pass the checkpoints of every rank of the job that saved them.");
  const checkpoint_identity& a = imgs[0].id;
  const std::uint32_t P = a.size;
  std::vector<const checkpoint_image*> by_rank(P, nullptr);
  for (std::size_t i = 0; i < imgs.size(); ++i) {
    const checkpoint_identity& b = imgs[i].id;
    if (b.composition != a.composition || b.layout_fp != a.layout_fp || b.tensor_fps != a.tensor_fps || b.pool_elems != a.pool_elems)
      throw mismatch_error("checkpoints",
                           fmt::format("checkpoint {} of the set was saved by another exchanger than checkpoint 0 (composition <{}> vs <{}>, or another layout).",
                                       i, b.composition, a.composition),
                           "pass the checkpoints of one job only.");
    if (b.size != P)
      set_error(fmt::format("checkpoint {} was saved in a job of {} ranks; checkpoint 0 in one of {}.", i, b.size, P),
                "pass the checkpoints of one job only.");
    if (b.rank >= P)
      set_error(fmt::format("checkpoint {} names rank {} of {}.", i, b.rank, P),
                "pass intact checkpoints written by save_state.");
    if (by_rank[b.rank])
      set_error(fmt::format("rank {} appears twice in the set (checkpoint {} and an earlier one).", b.rank, i),
                "pass each rank's checkpoint once.");
    by_rank[b.rank] = &imgs[i];
  }
  for (std::uint32_t r = 0; r < P; ++r)
    if (!by_rank[r])
      set_error(fmt::format("the set holds {} checkpoints of a job of {} ranks; rank {}'s is missing.", imgs.size(), P, r),
                "pass the checkpoints of every rank: each holds residuals no other rank has.");
  const checkpoint_image& z = *by_rank[0];
  for (std::uint32_t r = 1; r < P; ++r) {
    const checkpoint_image& x = *by_rank[r];
    if (x.iteration != z.iteration)
      throw mismatch_error("iteration",
                           fmt::format("rank 0's checkpoint was saved after iteration {}, rank {}'s after iteration {}: the set mixes generations.",
                                       z.iteration, r, x.iteration),
                           "pass checkpoints saved at the same iteration by every rank (e.g. the last complete set).");
    const char* differs = x.exch != z.exch                                 ? "EXCH"
                          : x.topo != z.topo                                 ? "TOPO"
                          : x.sparse_shared != z.sparse_shared || x.sparse_tail_shared != z.sparse_tail_shared ? "SPRS"
                                                                             : nullptr;
    if (differs || x.residual.size() != z.residual.size())
      throw mismatch_error("checkpoints",
                           fmt::format("the state every rank holds alike (section {}) differs between rank 0 and rank {} at iteration {}.",
                                       differs ? differs : "SPRS", r, z.iteration),
                           "pass checkpoints saved by one job at one iteration, unmodified.");
  }
  return by_rank;
}

/// Writes rank new_rank's checkpoint of a job of new_size ranks from an ordered, validated set.
inline void write_resharded(const std::vector<const checkpoint_image*>& set, std::uint32_t new_rank, std::uint32_t new_size,
                            const reshard_options& opt, std::ostream& out) {
  const checkpoint_image& z = *set[0];
  const std::uint32_t P = static_cast<std::uint32_t>(set.size());
  const checkpoint_schema s = schema_of(z.id.composition);
  checkpoint_writer w(out);
  checkpoint_identity id = z.id;
  id.rank = new_rank;
  id.size = new_size;
  write_checkpoint_header(w, id);
  w.tag(section_tag("EXCH"));
  w.bytes(z.exch.data(), z.exch.size());
  w.tag(section_tag("TOPO"));
  w.bytes(z.topo.data(), z.topo.size());
  w.tag(section_tag("SPRS"));
  w.bytes(z.sparse_shared.data(), z.sparse_shared.size());
  if (z.has_residual) {
    const std::size_t n = z.residual.size();
    std::vector<float> res(n, 0.0f);
    if (P == new_size) {
      res = set[new_rank]->residual;  // the identity, bit for bit
    } else {
      const double scale = opt.average ? static_cast<double>(new_size) / static_cast<double>(P) : 1.0;
      std::vector<double> acc(n, 0.0);
      for (std::uint32_t r = new_rank; r < P; r += new_size)
        for (std::size_t i = 0; i < n; ++i) acc[i] += static_cast<double>(set[r]->residual[i]);
      for (std::size_t i = 0; i < n; ++i) res[i] = static_cast<float>(acc[i] * scale);
    }
    w.array(res.data(), n);
  }
  const std::string& tail = P == new_size ? set[new_rank]->sparse_tail : z.sparse_tail_reset;  // OkTopK's estimates: kept, or reset
  w.bytes(tail.data(), tail.size());
  if (s.tuned) {
    w.tag(section_tag("TUNE"));
    const std::string tune = P == new_size ? set[new_rank]->tune : reset_tuner(z.tune);
    w.bytes(tune.data(), tune.size());
  }
  w.checksum();
  w.finish();
}

inline void check_new_shape(int new_rank, int new_size) {
  if (new_size <= 0 || new_rank < 0 || new_rank >= new_size)
    throw invalid_argument("new_rank", fmt::format("rank {} of {} is not a rank of the new job.", new_rank, new_size),
                           "pass 0 <= new_rank < new_size, new_size >= 1.");
}

/// Reads every stream (each a whole checkpoint); a parse error names the stream.
inline std::vector<checkpoint_image> read_set(std::span<std::istream* const> old, const checkpoint_identity* mine = nullptr,
                                             const Layout* layout = nullptr) {
  std::vector<checkpoint_image> imgs;
  imgs.reserve(old.size());
  for (std::size_t i = 0; i < old.size(); ++i) {
    try {
      imgs.push_back(read_checkpoint_image(*old[i], mine, layout));
    } catch (const parse_error& e) {
      throw parse_error("checkpoints", fmt::format("checkpoint {} of the set cannot be read: {}", i, e.what()),
                        "pass intact checkpoints, every one written completely by save_state.");
    }
  }
  return imgs;
}

}  // namespace gflow::detail

// bench/run model: the alpha-beta cost model (plan/cost_model.hpp) fitted on this machine,
// checked against measured exchanges and extrapolated to larger P.
// layering: plan/: the suite fits the cost model of plan/cost_model.hpp and plans the buckets
// exactly as the exchanger does, to predict its exchanges. engines/oktopk/reduce.hpp and
// support/oktopk_params.hpp: OkTopK's per-entry work is timed with the engine's own region
// reduction (detail::reduce_by_index), its exact selection amortised over the default period.
#include "sparse.hpp"

#include <gflow/detail/engines/oktopk/reduce.hpp>
#include <gflow/detail/support/oktopk_params.hpp>

#include <gflow/detail/plan/buckets.hpp>
#include <gflow/detail/plan/cost_model.hpp>
#include <gflow/detail/plan/pool.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace gflow_bench {

namespace {

// 1. times each collective kind the exchanges use (allreduce, all_gather, send/recv, broadcast)
//    over sizes 4 KiB .. 16 MiB on this P, median of --reps, slowest rank;
// 2. fits alpha + beta * bytes per kind in its algorithm's shape (plan/cost_model.hpp);
// 3. checks the model against measured exchanges of the layout at this P (dense at --threshold,
//    Hierarchical<2>, TopK / GTopK at density 0.01 and 0.001 (communication = total minus the
//    selection, as in the sparse suite), CSC at 1%) and reports the error;
// 4. predicts those exchanges for P = 2 .. 1024 from the fit.
// prepare() runs before each repetition, untimed.
template <class F, class Prepare = void (*)()>
double time_median(int reps, F&& f, Prepare&& prepare = [] {}) {
  std::vector<double> ts;
  for (int r = 0; r < reps + 2; ++r) {
    prepare();
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    f();
    double dt = MPI_Wtime() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (r > 1) ts.push_back(dt);  // the first two are warm-up (first-touch, protocol set-up)
  }
  return summarize(ts).median;
}

// The engines' local work per unit (plan::local_costs), timed with their own kernels on every
// rank at once (median of reps, slowest rank): pool-sized passes over `elements`, and the
// per-entry work on k received entries of a d = 0.01 exchange.
gflow::detail::plan::local_costs measure_local_costs(int reps, std::size_t elements, std::size_t bucket_elements, std::size_t k, int rank) {
  namespace kn = gflow::detail::kernels;
  const double n = static_cast<double>(elements), kd = static_cast<double>(std::max<std::size_t>(k, 1));
  std::vector<float> g(elements), res(elements, 0.0f), hist(elements, 0.0f);
  for (std::size_t i = 0; i < elements; ++i)
    g[i] = static_cast<float>(((i * 2654435761u + static_cast<std::size_t>(rank) * 40503u) % 20011)) / 10000.0f - 1.0f;
  std::vector<float> pool = g;
  gflow::detail::plan::local_costs c;
  {  // Dense averages each bucket right after its allreduce, while it is still in cache
    const std::size_t b = std::min(elements, bucket_elements);
    constexpr int passes = 8;
    (void)kn::scale_in_place(pool.data(), b, 1.0f);
    c.average = time_median(reps, [&] {
                  for (int r = 0; r < passes; ++r) (void)kn::scale_in_place(pool.data(), b, 1.0f);
                }) / (passes * static_cast<double>(b));
  }
  c.zero = time_median(reps, [&] { std::fill(pool.begin(), pool.end(), 0.0f); }) / n;
  kn::topk_workspace ws;
  ws.reserve(elements, k);
  std::vector<std::uint32_t> out(k);
  const double acc = time_median(reps, [&] { (void)kn::accumulate_select_topk(g.data(), res.data(), elements, k, 0, out.data(), ws); });
  const double sel = time_median(reps, [&] { (void)kn::select_topk_sampled(g.data(), elements, k, 0, out.data(), ws); });
  c.accumulate = std::max(0.0, acc - sel) / n;
  constexpr std::size_t C = 32768;
  std::vector<std::uint32_t> chunks((elements + C - 1) / C);
  std::iota(chunks.begin(), chunks.end(), std::uint32_t{0});
  std::vector<float> norms(chunks.size());
  pool = g;
  c.defer = time_median(reps, [&] { kn::defer_chunks(pool.data(), hist.data(), elements, C, chunks.data(), chunks.size(), 0.9f, norms.data()); }) / n;
  // Two lists of k sorted, distinct indices drawn at random over the pool (a fixed seed; the
  // branches of the merges are as unpredictable as with real selections).
  std::mt19937_64 rng(12345);
  auto random_list = [&](std::vector<std::uint32_t>& idx) {
    std::vector<std::uint32_t> all(std::min<std::size_t>(elements, 4 * k + 1));
    for (auto& x : all) x = static_cast<std::uint32_t>(rng() % elements);
    std::sort(all.begin(), all.end());
    all.erase(std::unique(all.begin(), all.end()), all.end());
    std::shuffle(all.begin(), all.end(), rng);
    all.resize(std::min(all.size(), k));
    std::sort(all.begin(), all.end());
    idx = std::move(all);
  };
  std::vector<std::uint32_t> ia, ib;
  random_list(ia);
  random_list(ib);
  const std::size_t ka = ia.size(), kb = ib.size();
  std::vector<float> va(ka), vb(kb);
  for (std::size_t j = 0; j < ka; ++j) va[j] = g[j];
  for (std::size_t j = 0; j < kb; ++j) vb[j] = g[elements - 1 - j];
  // TopK's per-entry work on a received message: validated, decoded (twice: check all P first,
  // then apply), scatter-added, then averaged and counted where the union holds a value.
  std::vector<unsigned char> msg(gflow::detail::sparse_message::bytes(k, 4, 4));
  gflow::detail::sparse_message::pack(msg.data(), k, ia.data(), va.data(), ka);
  std::vector<std::uint32_t> ri2(k);
  std::vector<float> rv2(k), dec(k);
  c.entry = time_median(reps, [&] {
              (void)kn::unpack_checked(msg.data(), k, 0, elements, ri2.data(), rv2.data());
              const auto r = kn::unpack_checked(msg.data(), k, 0, elements, ri2.data(), rv2.data());
              kn::scatter_add(pool.data(), ri2.data(), rv2.data(), r.count);
              kn::scale_at(pool.data(), ri2.data(), r.count, 1.0f, dec.data());
              (void)kn::count_nonfinite(dec.data(), r.count);
            }) / kd;
  // the union as the engine forms it: each received list marked in a two-level bitmap of the
  // pool, then read out in index order (which clears it)
  std::vector<std::uint64_t> marks((elements + 63) / 64, 0), summary((elements + 4095) / 4096, 0), uo(ka + kb);
  auto mark_both = [&] {
    kn::mark_bits(marks.data(), summary.data(), ia.data(), ka, 0);
    kn::mark_bits(marks.data(), summary.data(), ib.data(), kb, 0);
  };
  const double t_mark = time_median(reps, mark_both);
  const std::size_t u = kn::take_marked(marks.data(), summary.data(), summary.size(), 0, uo.data());
  const double t_union = time_median(reps, [&] {
    mark_both();
    (void)kn::take_marked(marks.data(), summary.data(), summary.size(), 0, uo.data());
  });
  c.union_mark = t_mark / static_cast<double>(ka + kb);
  c.union_emit = std::max(0.0, t_union - t_mark) / static_cast<double>(std::max<std::size_t>(u, 1));
  std::vector<std::uint32_t> oi(k), ri(2 * k), midx(2 * k), mkey(2 * k);
  std::vector<float> ov(k), rv(2 * k), msum(2 * k);
  std::size_t records = 0;
  // In GTopK's first merge round half the ranks merge while the others wait (later rounds: fewer):
  // on a host whose ranks share cores that is the load to measure the merge under.
  const bool merges = rank % 2 == 0;
  c.merge_step = time_median(reps, [&] {
                   if (!merges) return;
                   const auto r = kn::unpack_checked(msg.data(), k, 0, elements, ri2.data(), rv2.data());
                   (void)kn::merge_topk(ri2.data(), rv2.data(), r.count, ib.data(), vb.data(), kb, k, oi.data(), ov.data(), ri.data(), rv.data(), &records,
                                        kn::merge_scratch<std::uint32_t>{midx.data(), msum.data(), mkey.data()});
                 }) / static_cast<double>(ka + kb);
  // OkTopK (engines/oktopk/exchange.hpp) on a threshold iteration, with every rank selecting about
  // k: (a) its threshold pass (accumulate_gather_above at the k-th largest |g|) in place of the
  // sampled selection that the measured row subtracts, plus the exact selection every
  // threshold_period iterations; (b) per selected entry: taken out of the residual, packed into the
  // split, checked and unpacked by its region's owner and summed by index (the blocks of P ranks,
  // each increasing); (c) per entry of the result: checked, unpacked, decoded into the pool, and
  // its magnitude in the global threshold's recalibration; (d) per selected entry that the result
  // does not hold: restored into the residual.
  int P = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  {
    std::fill(res.begin(), res.end(), 0.0f);
    std::uint32_t tk = kn::magnitude_key(std::numeric_limits<float>::infinity());
    const std::size_t got = kn::select_topk_sampled(g.data(), elements, k, 0, out.data(), ws).count;
    for (std::size_t j = 0; j < got; ++j) tk = std::min(tk, kn::magnitude_key(g[out[j]]));
    std::vector<std::uint64_t> cpos(4 * k + 1);
    std::vector<std::uint32_t> ckeys(4 * k + 1);
    // G = g + 0 (about k gathered); the residual set back to zero before each repetition, untimed
    const double gather = time_median(
        reps, [&] { (void)kn::accumulate_gather_above(g.data(), res.data(), elements, std::max(tk, 1u), 0, cpos.data(), ckeys.data(), 4 * k); },
        [&] { std::fill(res.begin(), res.end(), 0.0f); });
    const double period = static_cast<double>(gflow::detail::oktopk_params{}.threshold_period);
    c.ok_select = (gather + (acc - gather) / period - sel) / n;
    if (rank == 0) std::fprintf(stderr, "OkTopK threshold pass %.2f ms, sampled selection %.2f ms, with accumulation %.2f ms\n", gather * 1e3, sel * 1e3, acc * 1e3);
  }
  // the split's blocks: ia dealt round-robin to P ranks, one message each, in rank order, as the
  // region's owner receives them; an index i becomes i / P, in a region of n / P elements as the
  // owner's (the radix passes depend on its size; each share stays strictly increasing, its
  // indices being at least P apart)
  const std::size_t Pz = static_cast<std::size_t>(P), region = elements / Pz + 1;
  std::vector<std::size_t> bcount(Pz), bat(Pz + 1, 0);
  std::vector<std::uint32_t> bidx(ka);
  std::vector<float> bval(ka);
  for (std::size_t q = 0, e = 0; q < Pz; ++q) {
    for (std::size_t j = q; j < ka; j += Pz, ++e) {
      bidx[e] = static_cast<std::uint32_t>(ia[j] / Pz);
      bval[e] = va[j];
    }
    bcount[q] = (ka + Pz - 1 - q) / Pz;
    bat[q + 1] = bat[q] + gflow::detail::sparse_message::bytes(bcount[q], 4, 4);
  }
  std::vector<unsigned char> blocks(bat[Pz]);
  gflow::detail::region_reduce_scratch rr;
  rr.reserve(ka, false);
  std::vector<std::pair<std::uint64_t, float>> red;
  red.reserve(ka);
  // In the engine every selection is new and a pool-sized pass comes between two of them, so the
  // entries' scattered reads and writes miss the cache: a 64 MiB write before each repetition
  // evicts this host's 32 MiB last-level cache (the TopK and GTopK terms above run warm).
  std::vector<float> evict((64u << 20) / sizeof(float));
  auto cold = [&] { std::fill(evict.begin(), evict.end(), static_cast<float>(rank)); };
  auto split_reduce = [&] {
    kn::take_selected(res.data(), res.data(), ia.data(), ka, rv2.data(), 1.0f, 1.0f);
    for (std::size_t q = 0, e = 0; q < Pz; e += bcount[q++])
      gflow::detail::sparse_message::pack(blocks.data() + bat[q], bcount[q], bidx.data() + e, bval.data() + e, bcount[q]);
    std::size_t m = 0;
    for (std::size_t q = 0; q < Pz; ++q) m += kn::unpack_checked(blocks.data() + bat[q], bcount[q], 0, region, ri2.data() + m, rv2.data() + m).count;
    gflow::detail::reduce_by_index(ri2.data(), rv2.data(), m, 0, region, rr, red);
    return m;
  };
  c.ok_entry = time_median(reps, split_reduce, cold) / static_cast<double>(ka);
  if (split_reduce() != ka) throw std::runtime_error("bench/run model: a split block of the OkTopK timing was rejected (the timing would be of less work)");
  std::vector<float> mag(ka);
  c.ok_result = time_median(reps, [&] {
                  const auto r = kn::unpack_checked(msg.data(), k, 0, elements, ri2.data(), rv2.data());
                  kn::decode_scaled(rv2.data(), r.count, 1.0f, dec.data());
                  (void)kn::count_nonfinite(dec.data(), r.count);
                  kn::scatter_set(pool.data(), ri2.data(), dec.data(), r.count);
                  // the threshold set to the result's k-th largest |value| (a partial sort of its
                  // magnitudes), which a result over 4k/3 entries triggers: on the bench's fresh
                  // gradients often (the residuals grow between re-estimations), so counted each time
                  for (std::size_t j = 0; j < r.count; ++j) mag[j] = std::fabs(dec[j]);
                  std::nth_element(mag.begin(), mag.begin() + static_cast<std::ptrdiff_t>(r.count * 3 / 4), mag.begin() + static_cast<std::ptrdiff_t>(r.count),
                                   std::greater<float>());
                }, cold) / static_cast<double>(ka);
  // ia restored against a result of ib (independent draws: almost every entry goes back)
  c.ok_restore =
      time_median(reps, [&] { kn::restore_unselected(res.data(), ia.data(), va.data(), ka, ib.data(), kb, 1.0f); }, cold) / static_cast<double>(ka);
  return c;
}

}  // namespace

int run_model_suite(const options& o, const gflow::Layout& l, const std::string& layout_name) {
  namespace pl = gflow::detail::plan;
  int rank = 0, P = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  if (rank == 0)
    std::fprintf(stderr, "gflow bench: suite model, layout %s, %d MPI ranks, %d repetitions per size, threshold %zu B\n", layout_name.c_str(), P, o.reps, o.threshold);
  if (P < 2) {
    if (rank == 0) std::fprintf(stderr, "gflow_bench: the model suite fits collectives: run it on 2 or more ranks (--ranks 2)\n");
    return 0;
  }
  gflow::mpi::transport tr(MPI_COMM_WORLD);
  const std::vector<std::size_t> sizes{4u << 10, 16u << 10, 64u << 10, 256u << 10, 1u << 20, 4u << 20, 16u << 20};
  // allreduce / broadcast read and write a region the size of the layout's pool (at least 64 MiB),
  // a different part each time: data an exchange streams from memory, not a buffer left in cache.
  const std::size_t region = std::max<std::size_t>(l.total_numel(), (64u << 20) / 4);
  std::vector<float> buf(region, 0.0f);
  std::size_t cursor = 0;
  auto next = [&](std::size_t n) {  // n bytes of buf, after the last ones handed out
    if ((cursor + n) / 4 > region) cursor = 0;
    float* p = buf.data() + cursor / 4;
    cursor += n;
    return p;
  };
  std::vector<std::uint8_t> bytes_in(16u << 20, 1), gathered((4u << 20) * static_cast<std::size_t>(P));
  struct sample {
    pl::collective_kind kind;
    double bytes, seconds;
  };
  std::vector<sample> samples;
  for (std::size_t n : sizes) {
    samples.push_back({pl::collective_kind::allreduce, double(n), time_median(o.reps, [&] { tr.all_reduce(next(n), n / 4, gflow::reduce_op::sum); })});
    if (n <= (4u << 20))
      samples.push_back({pl::collective_kind::all_gather, double(n), time_median(o.reps, [&] { tr.all_gather(bytes_in.data(), gathered.data(), n); })});
    samples.push_back({pl::collective_kind::broadcast, double(n), time_median(o.reps, [&] { tr.broadcast(reinterpret_cast<std::uint8_t*>(next(n)), n, 0); })});
    // one message, rank 0 <-> rank 1 ping-pong: half the round trip
    samples.push_back({pl::collective_kind::send_recv, double(n), 0.5 * time_median(o.reps, [&] {
                         if (rank == 0) {
                           tr.send(bytes_in.data(), n, 1);
                           tr.recv(bytes_in.data(), n, 1);
                         } else if (rank == 1) {
                           tr.recv(bytes_in.data(), n, 0);
                           tr.send(bytes_in.data(), n, 0);
                         }
                       })});
    if (rank == 0) std::fprintf(stderr, "  collectives of %zu B timed\n", n);
  }
  pl::cost_model m;
  for (auto k : {pl::collective_kind::allreduce, pl::collective_kind::all_gather, pl::collective_kind::send_recv, pl::collective_kind::broadcast}) {
    std::vector<double> x, y;
    for (const auto& s : samples)
      if (s.kind == k) {
        x.push_back(s.bytes);
        y.push_back(s.seconds);
      }
    const pl::kind_fit f = pl::fit_kind_regimes(k, k == pl::collective_kind::send_recv ? 2 : P, x, y);
    (k == pl::collective_kind::allreduce ? m.allreduce : k == pl::collective_kind::all_gather ? m.all_gather
                                                     : k == pl::collective_kind::send_recv  ? m.send_recv
                                                                                            : m.broadcast) = f;
  }
  if (rank == 0) {
    std::fprintf(stderr, "%-11s %12s %16s %12s %12s %16s %14s\n", "kind", "alpha_us", "beta_ns_per_B", "split_B", "alpha2_us", "beta2_ns_per_B",
                 "fit_max_err");
    for (auto k : {pl::collective_kind::allreduce, pl::collective_kind::all_gather, pl::collective_kind::send_recv, pl::collective_kind::broadcast}) {
      double worst = 0;
      for (const auto& s : samples)
        if (s.kind == k) {
          const double pred = m.collective(k, k == pl::collective_kind::send_recv ? 2 : P, s.bytes);
          const double err = pred / s.seconds - 1.0;
          worst = std::max(worst, std::abs(err));
          std::printf("{\"suite\":\"model\",\"row\":\"sample\",\"ranks\":%d,\"kind\":\"%s\",\"bytes\":%.0f,\"measured_s\":%.9g,\"predicted_s\":%.9g,\"error\":%.4f}\n", P,
                      pl::collective_kind_name(k), s.bytes, s.seconds, pred, err);
        }
      const auto& f = m.of(k);  // alpha_s / beta_s_per_byte: below split_bytes (0: one regime); *_large: from split_bytes on
      const double split = f.split_in_two() ? f.split : 0.0;
      std::fprintf(stderr, "%-11s %12.2f %16.4f %12.0f %12.2f %16.4f %13.1f%%\n", pl::collective_kind_name(k), f.small.alpha * 1e6, f.small.beta * 1e9, split,
                   f.large.alpha * 1e6, f.large.beta * 1e9, worst * 100);
      std::printf("{\"suite\":\"model\",\"row\":\"fit\",\"ranks\":%d,\"kind\":\"%s\",\"alpha_s\":%.9g,\"beta_s_per_byte\":%.9g,\"split_bytes\":%.0f,"
                  "\"alpha_large_s\":%.9g,\"beta_large_s_per_byte\":%.9g,\"fit_max_error\":%.4f}\n",
                  P, pl::collective_kind_name(k), f.small.alpha, f.small.beta, split, f.large.alpha, f.large.beta, worst);
    }
  }
  const std::size_t total = l.total_numel();
  const pl::exchange_model em{m, measure_local_costs(o.reps, total, o.threshold / 4, pl::k_for(0.01, total), rank)};
  if (rank == 0) {
    const auto& c = em.local;
    std::fprintf(stderr, "local work (ns): average %.3f, zero %.3f, accumulate %.3f, defer %.3f per element; entry %.2f, union mark %.2f, union emit %.2f, merge %.2f\n",
                 c.average * 1e9, c.zero * 1e9, c.accumulate * 1e9, c.defer * 1e9, c.entry * 1e9, c.union_mark * 1e9, c.union_emit * 1e9,
                 c.merge_step * 1e9);
    std::fprintf(stderr, "OkTopK local work (ns): threshold pass beyond the sampled selection %.3f per element; per entry: split and reduced %.2f, result %.2f, restored %.2f\n",
                 c.ok_select * 1e9, c.ok_entry * 1e9, c.ok_result * 1e9, c.ok_restore * 1e9);
    std::printf("{\"suite\":\"model\",\"row\":\"local\",\"ranks\":%d,\"elements\":%zu,\"average_s\":%.6g,\"zero_s\":%.6g,\"accumulate_s\":%.6g,"
                "\"defer_s\":%.6g,\"entry_s\":%.6g,\"union_mark_s\":%.6g,\"union_emit_s\":%.6g,\"merge_s\":%.6g,\"ok_select_s\":%.6g,\"ok_entry_s\":%.6g,"
                "\"ok_result_s\":%.6g,\"ok_restore_s\":%.6g}\n",
                P, total, c.average, c.zero, c.accumulate, c.defer, c.entry, c.union_mark, c.union_emit, c.merge_step, c.ok_select, c.ok_entry, c.ok_result,
                c.ok_restore);
  }
  // ---- measured exchanges of the layout -----------------------------------------------------------
  options so = o;
  so.iters = std::max(o.iters, 7);
  std::vector<double> bucket_bytes;
  {
    const auto pool = pl::plan_pool(l);
    for (const auto& b : pl::plan_buckets(l, pool, {4, o.threshold, 0})) bucket_bytes.push_back(double(b.count * 4));
  }
  struct check {
    std::string name;
    double measured, predicted, comm;  // predicted = comm + local work
  };
  std::vector<check> checks;
  using gflow::Exchanger;
  using gflow::Sparsifier;
  auto fuse = [&](auto& ex) { ex.set_fusion(o.threshold); };
  {
    auto r = measure_sparse<Exchanger<gflow::Fusion<(4u << 20)>>>(tr, so, l, "dense", 1.0, false, fuse);
    checks.push_back({"dense", r.total.median, em.dense(P, bucket_bytes, total), m.dense(P, bucket_bytes)});
  }
  if (P >= 4 && P % 2 == 0) {
    auto r = measure_sparse<Exchanger<gflow::Fusion<(4u << 20)>, gflow::Topology<gflow::Hierarchical<2>>>>(tr, so, l, "hierarchical2", 1.0, false, fuse);
    checks.push_back({"hierarchical2", r.total.median, em.hierarchical(P, 2, bucket_bytes, total), m.hierarchical(P, 2, bucket_bytes)});
  }
  for (double d : {0.01, 0.001}) {
    const std::size_t k = pl::k_for(d, total);
    auto dens = [d](auto& ex) { ex.sparsifier().set_density(d); };
    auto a = measure_sparse<Exchanger<Sparsifier<gflow::TopK<0.01>>>>(tr, so, l, "TopK", d, true, dens);
    checks.push_back({"topk_" + std::to_string(d).substr(0, 5), a.total.median - a.select.median, em.topk(P, k, 8, total), m.topk(P, k, 8)});
    auto g = measure_sparse<Exchanger<Sparsifier<gflow::GTopK<0.01>>>>(tr, so, l, "GTopK", d, true, dens);
    checks.push_back({"gtopk_" + std::to_string(d).substr(0, 5), g.total.median - g.select.median, em.gtopk(P, k, 8, total), m.gtopk(P, k, 8)});
    // OkTopK's threshold selection is the gathering pass of the sampled top-k (kernels::accumulate_gather_above),
    // so its row is split like TopK's and GTopK's: the exchange minus the sampled selection timed in the same run.
    // Its thresholds adapt to the data, so it is measured as the sparse suite measures it (docs/BENCHMARKS.md,
    // section 4): new gradients every iteration and 30 warm-up iterations, by which both thresholds have
    // settled. On the same values every iteration every residual grows at once and each selection overflows.
    options ko = so;
    ko.fresh_gradients = true;
    ko.warmup = std::max(so.warmup, 30);
    auto ok = measure_sparse<Exchanger<Sparsifier<gflow::OkTopK<0.01>>>>(tr, ko, l, "OkTopK", d, true, dens);
    checks.push_back({"oktopk_" + std::to_string(d).substr(0, 5), ok.total.median - ok.select.median, em.oktopk(P, k, 8, total),
                      m.oktopk(P, k, 8)});
  }
  {
    auto c = measure_sparse<Exchanger<gflow::Fusion<(4u << 20)>, Sparsifier<gflow::CSC<32768, 15>>>>(tr, so, l, "CSC", 0.01, false, [&](auto& ex) {
      ex.set_fusion(o.threshold);
      ex.sparsifier().set_percent(1);
      ex.sparsifier().set_warmup(0, 0);
    });
    checks.push_back({"csc_1pct", c.total.median, em.csc(P, total, 32768, 0.01, 4), m.csc(P, total, 32768, 0.01, 4)});
  }
  if (rank != 0) return 0;
  std::fprintf(stderr, "%-14s %12s %12s %9s %12s %10s\n", "exchange", "measured_ms", "model_ms", "error", "comm_ms", "comm_err");
  for (const auto& c : checks) {
    const double err = c.predicted / c.measured - 1.0, cerr = c.comm / c.measured - 1.0;
    std::fprintf(stderr, "%-14s %12.2f %12.2f %8.1f%% %12.2f %9.1f%%\n", c.name.c_str(), c.measured * 1e3, c.predicted * 1e3, err * 100, c.comm * 1e3,
                 cerr * 100);
    std::printf("{\"suite\":\"model\",\"row\":\"check\",\"layout\":\"%s\",\"ranks\":%d,\"exchange\":\"%s\",\"measured_s\":%.9g,\"predicted_s\":%.9g,\"error\":%.4f,"
                "\"comm_s\":%.9g,\"comm_error\":%.4f}\n",
                layout_name.c_str(), P, c.name.c_str(), c.measured, c.predicted, err, c.comm, cerr);
  }
  // ---- predictions beyond this machine ------------------------------------------------------------
  std::fprintf(stderr, "%6s %12s %12s %12s %12s %12s %12s %12s %12s\n", "P", "dense_ms", "hier8_ms", "topk1%_ms", "gtopk1%_ms", "gtopk.1%_ms", "oktopk1%_ms",
               "oktopk.1%_ms", "csc1%_ms");
  const std::size_t k1 = pl::k_for(0.01, total), k01 = pl::k_for(0.001, total);
  for (int q = 2; q <= 1024; q *= 2) {
    const double dn = em.dense(q, bucket_bytes, total), hi = em.hierarchical(q, 8, bucket_bytes, total), tk = em.topk(q, k1, 8, total),
                 gk = em.gtopk(q, k1, 8, total), gk01 = em.gtopk(q, k01, 8, total), cs = em.csc(q, total, 32768, 0.01, 4),
                 ok = em.oktopk(q, k1, 8, total), ok01 = em.oktopk(q, k01, 8, total);
    std::fprintf(stderr, "%6d %12.2f %12.2f %12.2f %12.2f %12.2f %12.2f %12.2f %12.2f\n", q, dn * 1e3, hi * 1e3, tk * 1e3, gk * 1e3, gk01 * 1e3, ok * 1e3,
                 ok01 * 1e3, cs * 1e3);
    std::printf("{\"suite\":\"model\",\"row\":\"predict\",\"layout\":\"%s\",\"fitted_at_ranks\":%d,\"ranks\":%d,\"dense_s\":%.9g,\"hierarchical8_s\":%.9g,"
                "\"topk_0.01_s\":%.9g,\"gtopk_0.01_s\":%.9g,\"topk_0.001_s\":%.9g,\"gtopk_0.001_s\":%.9g,\"oktopk_0.01_s\":%.9g,\"oktopk_0.001_s\":%.9g,"
                "\"csc_1pct_s\":%.9g}\n",
                layout_name.c_str(), P, q, dn, hi, tk, gk, em.topk(q, k01, 8, total), gk01, ok, ok01, cs);
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace gflow_bench

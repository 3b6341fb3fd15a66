// A consumer of an installed (or add_subdirectory'd) gflow: an fp16 exchange over four
// in-process ranks, the recording mock transport, and two error texts (built with {fmt}, which
// gflow's package brings header-only). Exits 0 when the results are right.
#include <gflow/exchanger.hpp>
#include <gflow/transport/inproc.hpp>
#include <gflow/transport/mock.hpp>

#include <atomic>
#include <cstdio>
#include <string>
#include <vector>

int main() {
  const auto layout = gflow::Layout::from_sizes({300, 7, 1000});
  using Exchange = gflow::Exchanger<gflow::Precision<gflow::half>, gflow::Fusion<1024>>;

  std::atomic<int> wrong = 0;
  gflow::inproc::run(4, [&](gflow::inproc::transport& t) {
    Exchange::on<gflow::inproc::transport> ex(t, layout);
    for (std::size_t i = layout.size(); i-- > 0;) {
      for (float& g : ex.view(i)) g = static_cast<float>(2 * t.rank());  // 0, 2, 4, 6: mean 3
      ex.ready(i);
    }
    const auto st = ex.finish();
    if (!st.finite()) ++wrong;
    for (std::size_t i = 0; i < layout.size(); ++i)
      for (float g : ex.view(i))
        if (g != 3.0f) ++wrong;
    // Replicas (replicas.hpp, through <gflow/exchanger.hpp>): rank 2's values everywhere, then checked equal.
    std::vector<float> params(layout.total_numel(), static_cast<float>(t.rank()));
    gflow::broadcast_parameters(t, params, 2);
    gflow::verify_replicas(t, params, layout);
    for (float p : params)
      if (p != 2.0f) ++wrong;
  });

  gflow::mock::transport m(8);
  gflow::Exchanger<>::on<gflow::mock::transport> dense(m, layout);
  for (std::size_t i = 0; i < layout.size(); ++i) {
    for (float& g : dense.view(i)) g = 1.0f;
    dense.ready(i);
  }
  (void)dense.finish();
  // No fusion: one all_reduce per tensor, fp32 on the wire.
  if (m.calls().of(gflow::mock::op::all_reduce).size() != layout.size()) ++wrong;

  // Error texts (docs/ERRORS.md), an integer and a floating-point value in them.
  auto expect_error = [&](auto&& f, const std::string& text) {
    try {
      f();
      std::printf("no error raised; expected: %s\n", text.c_str());
      ++wrong;
    } catch (const gflow::invalid_argument& e) {
      if (std::string(e.what()).find(text) == std::string::npos) {
        std::printf("error text '%s' does not contain '%s'\n", e.what(), text.c_str());
        ++wrong;
      }
    }
  };
  expect_error([] { (void)gflow::Layout::from_sizes({300, 0}); }, "tensor 1 ('t1') has zero elements.");
  gflow::Exchanger<gflow::Sparsifier<gflow::TopK<0.01>>>::on<gflow::mock::transport> topk(m, layout);
  expect_error([&] { topk.sparsifier().set_density(1.5); }, "the density must lie in (0, 1] (got 1.500000).");

  std::printf("gflow consumer: %s\n", wrong == 0 ? "ok" : "WRONG");
  return wrong == 0 ? 0 : 1;
}

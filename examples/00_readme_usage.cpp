// 00_readme_usage: the program README.md shows, kept compiling and correct.
//
// Why: a usage snippet in a README rots silently. This file is the snippet; the test
// readme.usage_in_sync checks that README.md contains the lines between the markers verbatim,
// and example.readme_usage runs it. Edit here first, then paste into README.md.
//
// [readme-begin]
#include <gflow/exchanger.hpp>
#include <gflow/transport/inproc.hpp>

#include <atomic>
#include <cstdio>

int main() {
  // The model's gradient tensors, in forward order (element counts).
  const auto layout = gflow::Layout::from_sizes({4096, 64, 250000, 10});

  // fp16 on the wire; tensors fused into buckets of at least 256 KiB.
  using Exchange = gflow::Exchanger<gflow::Precision<gflow::half>, gflow::Fusion<256 << 10>>;

  std::atomic<bool> ok = true;
  std::atomic<int> checked = 0;  // steps checked, summed over the ranks
  gflow::inproc::run(4, [&](gflow::inproc::transport& comm) {  // 4 ranks, one thread each
    Exchange::on<gflow::inproc::transport> ex(comm, layout);
    for (int step = 0; step < 3; ++step) {
      // Backward produces gradients last tensor first: write each into its view, mark it ready.
      for (std::size_t i = layout.size(); i-- > 0;) {
        for (float& g : ex.view(i)) g = static_cast<float>(comm.rank() + 1);
        ex.ready(i);  // starts every bucket that is now complete
      }
      const gflow::exchange_status status = ex.finish();  // averaged gradients are in the views
      if (!status.finite()) continue;  // inf/NaN somewhere: skip this optimizer step
      ++checked;
      for (std::size_t i = 0; i < layout.size(); ++i)
        for (float g : ex.view(i))
          if (g != 2.5f) ok = false;  // (1 + 2 + 3 + 4) / 4
      if (comm.rank() == 0 && step == 0)
        std::printf("%zu collectives, %zu bytes on the wire per rank\n", status.collectives, status.wire_bytes);
    }
  });
  if (checked == 0) ok = false;  // every step skipped: nothing was checked
  std::printf("%s, %d steps checked\n", ok ? "ok" : "wrong result", checked.load());
  return ok ? 0 : 1;
}
// [readme-end]

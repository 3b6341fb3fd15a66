// Dynamic loss scaling and LARS (include/gflow/optim/loss_scale.hpp, lars.hpp).
#include <doctest/doctest.h>

#include <gflow/exchanger.hpp>
#include <gflow/optim/lars.hpp>
#include <gflow/optim/loss_scale.hpp>
#include <gflow/transport/inproc.hpp>

#include <atomic>
#include <cmath>
#include <string>
#include <vector>

using gflow::optim::dynamic_loss_scale;
using gflow::optim::lars;
using gflow::optim::loss_scale_options;

namespace {
template <class F>
std::string invalid_subject(F&& f) {
  try {
    f();
  } catch (const gflow::invalid_argument& e) {
    CHECK(std::string(e.what()).find("Fix: ") != std::string::npos);
    return e.subject();
  }
  FAIL("no gflow::invalid_argument thrown");
  return {};
}
}  // namespace

TEST_CASE("loss scale: halve and skip on overflow, double after a run of good steps") {
  loss_scale_options o;
  o.initial = 1024.0f;
  o.growth_interval = 3;
  dynamic_loss_scale ls(o);
  CHECK(ls.scale() == 1024.0f);
  CHECK(ls.inverse() == 1.0f / 1024.0f);
  CHECK_FALSE(ls.update(false));  // skip
  CHECK(ls.scale() == 512.0f);
  CHECK(ls.skipped() == 1);
  CHECK(ls.update(true));
  CHECK(ls.update(true));
  CHECK(ls.scale() == 512.0f);
  CHECK_FALSE(ls.update(false));  // an overflow resets the run of good steps
  CHECK(ls.scale() == 256.0f);
  CHECK(ls.good_steps() == 0);
  CHECK(ls.update(true));
  CHECK(ls.update(true));
  CHECK(ls.update(true));  // third good step in a row: grows
  CHECK(ls.scale() == 512.0f);
  CHECK(ls.good_steps() == 0);
  CHECK(ls.skipped() == 2);
}

TEST_CASE("loss scale: bounds, constant mode, bad options") {
  loss_scale_options o;
  o.initial = 4.0f;
  o.min_scale = 2.0f;
  o.max_scale = 8.0f;
  o.growth_interval = 1;
  dynamic_loss_scale ls(o);
  ls.update(false);
  ls.update(false);
  CHECK(ls.scale() == 2.0f);  // clamped at min
  for (int i = 0; i < 5; ++i) ls.update(true);
  CHECK(ls.scale() == 8.0f);  // clamped at max

  loss_scale_options c;
  c.initial = 128.0f;
  c.dynamic = false;
  dynamic_loss_scale constant(c);
  CHECK_FALSE(constant.update(false));  // still skips the step
  for (int i = 0; i < 3000; ++i) constant.update(true);
  CHECK(constant.scale() == 128.0f);

  auto with = [](auto edit) {
    loss_scale_options b;
    edit(b);
    dynamic_loss_scale x(b);
  };
  CHECK(invalid_subject([&] { with([](loss_scale_options& b) { b.initial = 0.0f; }); }) == "initial");
  CHECK(invalid_subject([&] { with([](loss_scale_options& b) { b.initial = 1e9f; }); }) == "initial");
  CHECK(invalid_subject([&] { with([](loss_scale_options& b) { b.factor = 1.0f; }); }) == "factor");
  CHECK(invalid_subject([&] { with([](loss_scale_options& b) { b.growth_interval = 0; }); }) == "growth_interval");
  CHECK(invalid_subject([&] { with([](loss_scale_options& b) { b.min_scale = 4.0f, b.max_scale = 2.0f, b.initial = 3.0f; }); }) == "min_scale");
}

TEST_CASE("loss scale with an fp16 exchange: overflow is reported, skipped, and the halved scale gets through") {
  using Exchange = gflow::Exchanger<gflow::Precision<gflow::half>>;
  const auto layout = gflow::Layout::from_sizes({64, 8});
  std::atomic<int> wrong = 0;
  gflow::inproc::run(2, [&](gflow::inproc::transport& t) {
    Exchange::on<gflow::inproc::transport> ex(t, layout);
    loss_scale_options o;
    o.initial = 65536.0f;
    dynamic_loss_scale ls(o);
    int applied = 0, skipped = 0;
    for (int step = 0; step < 3; ++step) {
      // gradient 1.5 on every rank: the average 1.5 * 65536 = 98304 overflows fp16 (max 65504); 1.5 * 32768 fits
      for (std::size_t i = layout.size(); i-- > 0;) {
        for (float& g : ex.view(i)) g = 1.5f * ls.scale();
        ex.ready(i);
      }
      const auto st = ex.finish();
      const float inv = ls.inverse();
      if (!ls.update(st.finite())) {
        ++skipped;
        continue;
      }
      ++applied;
      for (std::size_t i = 0; i < layout.size(); ++i)
        for (float g : ex.view(i))
          if (g * inv != 1.5f) ++wrong;
    }
    if (skipped != 1 || applied != 2 || ls.scale() != 32768.0f) ++wrong;
  });
  CHECK(wrong == 0);
}

TEST_CASE("LARS: trust ratio, weight decay, zero weights, scale invariance") {
  lars l({0.01f, 0.0f});
  std::vector<float> w{3.0f, 4.0f}, g{0.6f, 0.8f};  // ||w|| = 5, ||g|| = 1
  CHECK(l.apply(w, g) == doctest::Approx(0.05));
  CHECK(g[0] == doctest::Approx(0.03));
  CHECK(g[1] == doctest::Approx(0.04));

  lars wd({0.01f, 0.1f});
  std::vector<float> g2{0.6f, 0.8f};
  const float trust = wd.apply(w, g2);
  CHECK(trust == doctest::Approx(0.01 * 5.0 / 1.5));
  CHECK(g2[0] == doctest::Approx(trust * (0.6 + 0.3)));
  CHECK(g2[1] == doctest::Approx(trust * (0.8 + 0.4)));
  std::vector<float> g3{0.6f, 0.8f};
  CHECK(wd.apply(w, g3, 0.0f) == doctest::Approx(0.05));  // per-layer decay (biases: none)

  std::vector<float> zero{0.0f, 0.0f}, gz{1.0f, -2.0f};
  CHECK(l.apply(zero, gz) == 1.0f);  // a zero-initialised layer still moves
  CHECK(gz[1] == -2.0f);

  // The update does not depend on the gradient's scale (what lets LARS take large batches),
  // and it is computed in fp32/fp64: values far below fp16's range are not lost.
  std::vector<float> tiny_w{1e-3f, 2e-3f}, ga{1e-9f, -3e-9f}, gb{1e-3f, -3e-3f};
  l.apply(tiny_w, ga);
  l.apply(tiny_w, gb);
  CHECK(ga[0] == doctest::Approx(gb[0]).epsilon(1e-5));
  CHECK(ga[1] == doctest::Approx(gb[1]).epsilon(1e-5));
  CHECK(ga[0] != 0.0f);

  CHECK(invalid_subject([] { lars x({0.0f, 0.0f}); }) == "lars_coefficient");
  CHECK(invalid_subject([] { lars x({0.01f, -1.0f}); }) == "weight_decay");
  std::vector<float> g1{1.0f};
  CHECK(invalid_subject([&] { l.apply(w, g1); }) == "gradients");
}

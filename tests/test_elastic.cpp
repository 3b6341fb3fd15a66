// Sync elastic averaging (include/gflow/elastic.hpp; You et al. equations 1-2 and 5-6).
#include <doctest/doctest.h>

#include <gflow/elastic.hpp>
#include <gflow/transport/inproc.hpp>
#include <gflow/transport/mock.hpp>

#include <atomic>
#include <cmath>
#include <mutex>
#include <string>
#include <vector>

namespace {
// Rank r's starting weights and its quadratic target a_r (gradient of 0.5 ||w - a_r||^2 is w - a_r).
float w0(int r, std::size_t i) { return static_cast<float>(r + 1) * 0.5f + static_cast<float>(i) * 0.25f; }
float target(int r, std::size_t i) { return static_cast<float>((r * 7 + static_cast<int>(i) * 3) % 11) - 5.0f; }
}  // namespace

TEST_CASE("elastic averaging: one step follows equations 1 and 2 on every rank") {
  constexpr int P = 3;
  constexpr std::size_t n = 5;
  const float lr = 0.1f, rho = 2.0f;
  std::atomic<int> wrong = 0;
  std::mutex m;
  std::vector<std::vector<float>> centers(P);
  gflow::inproc::run(P, [&](gflow::inproc::transport& t) {
    const int r = t.rank();
    std::vector<float> w(n), g(n);
    for (std::size_t i = 0; i < n; ++i) {
      w[i] = w0(r, i);
      g[i] = 0.1f * static_cast<float>(r) - 0.05f * static_cast<float>(i);
    }
    gflow::elastic_averager<gflow::inproc::transport> ea(t, w, rho);
    ea.step(w, g, lr);
    for (std::size_t i = 0; i < n; ++i) {
      double sum = 0;
      for (int q = 0; q < P; ++q) sum += w0(q, i);
      const double c0 = sum / P;
      const double wi = w0(r, i) - lr * (g[i] + rho * (w0(r, i) - c0));  // (1)
      const double c1 = c0 + lr * rho * (sum - P * c0);                    // (2)
      if (std::fabs(w[i] - wi) > 1e-5 || std::fabs(ea.center()[i] - c1) > 1e-5) ++wrong;
    }
    if (ea.wire_bytes() != n * sizeof(float)) ++wrong;
    std::lock_guard<std::mutex> lk(m);
    centers[static_cast<std::size_t>(r)].assign(ea.center().begin(), ea.center().end());
  });
  CHECK(wrong == 0);
  CHECK(centers[1] == centers[0]);  // the replicated center is bitwise identical
  CHECK(centers[2] == centers[0]);
}

TEST_CASE("elastic averaging: on quadratics the center converges to the average target") {
  for (float momentum : {0.0f, 0.5f}) {
    CAPTURE(momentum);
    constexpr int P = 4;
    constexpr std::size_t n = 6;
    std::atomic<int> wrong = 0;
    gflow::inproc::run(P, [&](gflow::inproc::transport& t) {
      const int r = t.rank();
      std::vector<float> w(n), g(n);
      for (std::size_t i = 0; i < n; ++i) w[i] = w0(r, i);
      const float lr = 0.05f;
      gflow::elastic_averager<gflow::inproc::transport> ea(t, w, 0.9f / (lr * P), momentum);
      for (int it = 0; it < 2000; ++it) {
        for (std::size_t i = 0; i < n; ++i) g[i] = w[i] - target(r, i);
        ea.step(w, g, lr);
      }
      for (std::size_t i = 0; i < n; ++i) {
        float mean = 0;
        for (int q = 0; q < P; ++q) mean += target(q, i);
        mean /= P;
        if (std::fabs(ea.center()[i] - mean) > 1e-3f) ++wrong;
      }
    });
    CHECK(wrong == 0);
  }
}

TEST_CASE("elastic averaging: all layers in one message per step") {
  auto log = std::make_shared<gflow::mock::log>();
  gflow::mock::transport t(4, 1, log);
  std::vector<float> w(1000, 1.0f), g(1000, 0.0f);
  gflow::elastic_averager<gflow::mock::transport> ea(t, w, 1.0f);
  log->clear();
  for (int it = 0; it < 3; ++it) ea.step(w, g, 0.1f);
  const auto reduces = log->of(gflow::mock::op::all_reduce);
  REQUIRE(reduces.size() == 3);
  for (const auto& rec : reduces) {
    CHECK(rec.count == 1000);
    CHECK(rec.bytes == 4000);
  }
  CHECK(log->records.size() == 3);
}

TEST_CASE("elastic averaging: bad parameters are typed errors naming the parameter") {
  gflow::mock::transport t(4, 0);
  std::vector<float> w(8, 1.0f), g(8, 0.0f), short_g(7, 0.0f);
  auto subject = [](auto f) -> std::string {
    try {
      f();
    } catch (const gflow::invalid_argument& e) {
      return e.subject();
    }
    return "no error";
  };
  using EA = gflow::elastic_averager<gflow::mock::transport>;
  CHECK(subject([&] { EA ea(t, w, 0.0f); }) == "rho");
  CHECK(subject([&] { EA ea(t, w, 1.0f, 1.0f); }) == "momentum");
  CHECK(subject([&] { EA ea(t, std::vector<float>{}, 1.0f); }) == "weights");
  EA ea(t, w, 1.0f);
  CHECK(subject([&] { ea.step(w, short_g, 0.1f); }) == "weights");
  CHECK(subject([&] { ea.step(w, g, 0.3f); }) == "learning_rate");  // 0.3 * 1 * 4 > 1: the center would diverge
  CHECK(subject([&] { ea.step(w, g, -0.1f); }) == "learning_rate");
  CHECK(subject([&] { ea.step(w, g, 0.25f); }) == "no error");     // exactly 1 is allowed
}

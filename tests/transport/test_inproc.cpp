#include <doctest/doctest.h>

#include <gflow/transport/inproc.hpp>

#include <atomic>
#include <numeric>
#include <vector>

using gflow::reduce_op;
namespace inproc = gflow::inproc;

TEST_CASE("in-process collectives on 1..9 ranks") {
  for (int P = 1; P <= 9; ++P) {
    CAPTURE(P);
    inproc::run(P, [P](inproc::transport& t) {
      const int r = t.rank();
      std::vector<double> v(5);
      for (int j = 0; j < 5; ++j) v[j] = r * 10 + j;
      t.all_reduce(v.data(), v.size(), reduce_op::sum);
      for (int j = 0; j < 5; ++j) CHECK(v[j] == 10.0 * P * (P - 1) / 2 + double(j) * P);

      int mx = r;
      t.all_reduce(&mx, 1, reduce_op::max);
      CHECK(mx == P - 1);
      int mn = r + 3;
      t.all_reduce(&mn, 1, reduce_op::min);
      CHECK(mn == 3);

      std::vector<std::int64_t> mine{r, -r}, all(2 * static_cast<std::size_t>(P));
      t.all_gather(mine.data(), all.data(), 2);
      for (int q = 0; q < P; ++q) {
        CHECK(all[2 * q] == q);
        CHECK(all[2 * q + 1] == -q);
      }

      const int root = P - 1;
      float b[3] = {float(r), float(r), float(r)};
      t.broadcast(b, 3, root);
      CHECK(b[2] == float(root));

      float red[2] = {1.0f, float(r)};
      t.reduce(red, 2, reduce_op::sum, root);
      if (r == root) {
        CHECK(red[0] == float(P));
        CHECK(red[1] == float(P * (P - 1) / 2));
      } else {
        CHECK(red[0] == 1.0f);  // non-roots keep their input
        CHECK(red[1] == float(r));
      }

      // ring of sends
      const int next = (r + 1) % P, prev = (r + P - 1) % P;
      std::uint32_t out = static_cast<std::uint32_t>(r), in = 999;
      t.send(&out, 1, next);
      t.recv(&in, 1, prev);
      CHECK(in == static_cast<std::uint32_t>(prev));

      // non-blocking forms: two outstanding, waited in reverse order
      std::vector<float> x(4, 1.0f), y(4, 2.0f);
      auto rx = t.iall_reduce(x.data(), 4, reduce_op::sum);
      auto ry = t.iall_reduce(y.data(), 4, reduce_op::sum);
      t.wait(ry);
      t.wait(rx);
      CHECK(x[3] == float(P));
      CHECK(y[0] == float(2 * P));
      t.barrier();
    });
  }
}

TEST_CASE("in-process 16-bit sums accumulate in fp32 in rank order and round once") {
  inproc::run(4, [](inproc::transport& t) {
    gflow::half h[1] = {gflow::detail::kernels::to_half(1.0f + 0.25f * t.rank())};
    t.all_reduce(h, 1, reduce_op::sum);
    CHECK(gflow::detail::kernels::to_float(h[0]) == 5.5f);
    gflow::bfloat16 b[1] = {gflow::detail::kernels::to_bfloat16(256.0f)};
    t.all_reduce(b, 1, reduce_op::sum);
    CHECK(gflow::detail::kernels::to_float(b[0]) == 1024.0f);
  });
}

TEST_CASE("split forms sub-groups ordered by key") {
  inproc::run(6, [](inproc::transport& t) {
    auto sub = t.split(t.rank() % 2, -t.rank());  // reversed order inside each group
    CHECK(sub.size() == 3);
    CHECK(sub.rank() == 2 - t.rank() / 2);
    int v = t.rank();
    sub.all_reduce(&v, 1, reduce_op::sum);
    CHECK(v == (t.rank() % 2 == 0 ? 0 + 2 + 4 : 1 + 3 + 5));
    CHECK(sub.label() == "world/" + std::to_string(t.rank() % 2));
  });
}

TEST_CASE("mismatched collectives raise mismatch_error on every rank, never hang") {
  std::atomic<int> errors{0};
  inproc::run(3, [&](inproc::transport& t) {
    std::vector<float> v(t.rank() == 1 ? 8 : 4, 1.0f);
    try {
      t.all_reduce(v.data(), v.size(), reduce_op::sum);
    } catch (const gflow::mismatch_error& e) {
      ++errors;
      CHECK(std::string(e.what()).find("rank 1: all_reduce(8 x f32, sum)") != std::string::npos);
    }
  });
  CHECK(errors == 3);
}

TEST_CASE("a rank that never arrives is named in a timeout_error") {
  std::atomic<int> timeouts{0};
  inproc::run(
      3,
      [&](inproc::transport& t) {
        if (t.rank() == 2) return;  // never joins
        float v = 1;
        try {
          t.all_reduce(&v, 1, reduce_op::sum);
        } catch (const gflow::timeout_error& e) {
          ++timeouts;
          CHECK(std::string(e.what()).find("rank(s) 2 did not arrive") != std::string::npos);
        }
      },
      std::chrono::milliseconds(200));
  CHECK(timeouts == 2);
}

TEST_CASE("recv with the wrong size or no sender is an error, not a hang") {
  inproc::run(
      2,
      [](inproc::transport& t) {
        if (t.rank() == 0) {
          float v[2] = {1, 2};
          t.send(v, 2, 1);
        } else {
          float v[3];
          CHECK_THROWS_AS(t.recv(v, 3, 0), gflow::mismatch_error);
          CHECK_THROWS_AS(t.recv(v, 3, 0), gflow::timeout_error);
        }
      },
      std::chrono::milliseconds(200));
}

TEST_CASE("invalid roots and peers are rejected") {
  inproc::run(2, [](inproc::transport& t) {
    float v = 0;
    CHECK_THROWS_AS(t.broadcast(&v, 1, 2), gflow::invalid_argument);
    CHECK_THROWS_AS(t.send(&v, 1, -1), gflow::invalid_argument);
  });
  CHECK_THROWS_AS(inproc::run(0, [](inproc::transport&) {}), gflow::invalid_argument);
}

#include <doctest/doctest.h>

#include <gflow/detail/plan/buckets.hpp>
#include <gflow/detail/plan/pool.hpp>

using gflow::Layout;
using namespace gflow::detail::plan;

TEST_CASE("pool places tensors in generation order (reverse of forward)") {
  auto l = Layout::from_sizes({3, 5, 7, 11});
  auto p = plan_pool(l);
  CHECK(p.total == 26);
  CHECK(p.tensor_at == std::vector<std::size_t>{3, 2, 1, 0});
  CHECK(p.offset[3] == 0);
  CHECK(p.offset[2] == 11);
  CHECK(p.offset[1] == 18);
  CHECK(p.offset[0] == 23);
}

TEST_CASE("plan_pool with an order: tensors placed in that order; an order that is not a permutation is refused") {
  auto l = Layout::from_sizes({3, 5, 7, 11});
  const std::vector<std::size_t> order{1, 3, 0, 2};
  auto p = plan_pool(l, order);
  CHECK(p.total == 26);
  CHECK(p.tensor_at == order);
  CHECK(p.offset[1] == 0);
  CHECK(p.offset[3] == 5);
  CHECK(p.offset[0] == 16);
  CHECK(p.offset[2] == 19);
  CHECK(plan_pool(l, reverse_order(4)).offset == plan_pool(l).offset);
  auto refused = [&](std::vector<std::size_t> o) {
    try {
      (void)plan_pool(l, o);
    } catch (const gflow::invalid_argument& e) {
      CHECK(e.subject() == "order");
      CHECK(std::string(e.what()).find("Fix: pass every layout index exactly once, in the order backward produces the gradients.") != std::string::npos);
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK(refused({1, 3, 1, 2}).find("position 2 of the generation order names tensor 1, named before.") != std::string::npos);
  CHECK(refused({1, 3, 4, 2}).find("position 2 of the generation order names tensor 4, past the layout's 4 tensors.") != std::string::npos);
  CHECK(refused({1, 3}).find("the generation order names 2 tensors; the layout has 4.") != std::string::npos);
}

TEST_CASE("no fusion: one bucket per tensor, in pool order") {
  auto l = Layout::from_sizes({3, 5, 7, 11});
  auto p = plan_pool(l);
  auto b = plan_buckets(l, p, {4, 0, 0});
  REQUIRE(b.size() == 4);
  for (std::size_t k = 0; k < 4; ++k) {
    CHECK(b[k].first_pos == k);
    CHECK(b[k].end_pos == k + 1);
    CHECK(b[k].offset == p.offset[p.tensor_at[k]]);
    CHECK(b[k].count == l[p.tensor_at[k]].numel);
  }
}

TEST_CASE("fusion closes a bucket once it holds at least the threshold") {
  // pool order sizes: 11, 7, 5, 3 elements = 44, 28, 20, 12 bytes in fp32
  auto l = Layout::from_sizes({3, 5, 7, 11});
  auto p = plan_pool(l);
  SUBCASE("threshold 40 bytes") {
    auto b = plan_buckets(l, p, {4, 40, 0});
    REQUIRE(b.size() == 3);  // [11] (44 >= 40), [7,5] (48), [3] remainder
    CHECK(b[0].count == 11);
    CHECK(b[1].count == 12);
    CHECK(b[1].first_pos == 1);
    CHECK(b[1].end_pos == 3);
    CHECK(b[2].count == 3);
  }
  SUBCASE("wire bytes per element count, not fp32 bytes") {
    auto b = plan_buckets(l, p, {2, 40, 0});  // fp16: 22, 14, 10, 6 bytes
    REQUIRE(b.size() == 2);                    // [11,7] = 36 < 40 .. + 5 = 46 -> close; [3]
    CHECK(b[0].count == 23);
    CHECK(b[1].count == 3);
  }
  SUBCASE("a threshold above the pool makes one bucket") {
    auto b = plan_buckets(l, p, {4, 1 << 20, 0});
    REQUIRE(b.size() == 1);
    CHECK(b[0].offset == 0);
    CHECK(b[0].count == 26);
  }
  SUBCASE("a smaller first bucket") {
    auto b = plan_buckets(l, p, {4, 1000, 8});
    REQUIRE(b.size() == 2);
    CHECK(b[0].count == 11);
    CHECK(b[1].count == 15);
  }
}

TEST_CASE("buckets tile the pool exactly, contiguously, for every threshold") {
  auto l = Layout::from_sizes({9408, 64, 64, 4096, 1, 1, 147456, 256, 1000, 2048000, 1000});
  auto p = plan_pool(l);
  for (std::size_t th : {1u, 4u, 100u, 4096u, 65536u, 1u << 20, 1u << 24, 1u << 30}) {
    for (std::size_t first : {0u, 1u << 10, 1u << 20}) {
      CAPTURE(th);
      CAPTURE(first);
      auto b = plan_buckets(l, p, {4, th, first});
      std::size_t off = 0, pos = 0;
      for (std::size_t k = 0; k < b.size(); ++k) {
        CHECK(b[k].offset == off);
        CHECK(b[k].first_pos == pos);
        std::size_t bytes = 0;
        for (std::size_t q = b[k].first_pos; q < b[k].end_pos; ++q) bytes += 4 * l[p.tensor_at[q]].numel;
        CHECK(bytes == 4 * b[k].count);
        const std::size_t cap = (k == 0 && first) ? first : th;
        if (k + 1 < b.size()) {
          CHECK(bytes >= cap);  // closed only when full
          // and it was not full one tensor earlier
          CHECK(bytes - 4 * l[p.tensor_at[b[k].end_pos - 1]].numel < cap);
        }
        off += b[k].count;
        pos = b[k].end_pos;
      }
      CHECK(off == p.total);
      CHECK(pos == l.size());
    }
  }
}
